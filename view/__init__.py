"""`redline view`: a local, read-only web viewer of run directories (local or S3)."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["app", "catalog"]
