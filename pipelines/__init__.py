"""How work flows: Ray Data graphs composed of actors, their schemas and reports."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["advtrain", "attack", "card", "card_figures", "corpora", "diasafety", "diasafety_train", "egregious",
           "figures", "gates", "quickstart", "registry", "report", "schema", "score", "taebench", "transfer",
           "uncertainty"]
