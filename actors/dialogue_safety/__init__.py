"""Context-sensitive dialogue safety (DiaSafety): taxonomy, one-vs-all classifiers, two-step detection."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["classifiers", "taxonomy", "two_step"]
