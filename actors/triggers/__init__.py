"""He & Glass (2019)'s egregious-output search: the trigger models, gibbs-enum, hit definitions and
target lists."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["gibbs", "hits", "models", "pairs", "scorers", "settings", "targets", "thresholds", "training",
           "worker"]
