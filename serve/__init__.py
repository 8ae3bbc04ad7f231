"""Ray Serve apps wrapping the same actor classes the pipelines use."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["config", "runner"]
