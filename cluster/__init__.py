"""Where and how things run: configuration, Ray runtime, job submission, storage, caches, leases and the HTTP client."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["access", "artifacts", "client", "config", "devices", "fingerprints", "jobs", "leases", "plugins",
           "net", "paths", "progress", "protocol", "runs", "runtime", "storage", "tables"]
