"""Quality filters for adversarial examples: deduplication, grammar, naturalness."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["grammar"]
