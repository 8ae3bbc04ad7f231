"""The pipelines, one module each (`score`, `attack`, `transfer`, `taebench`, `advtrain`,
`diasafety_train`, `diasafety_eval`, `egregious`, `card`), their registry and the run skeleton they
share; below them, in folders of their own, the data plane rows flow through (`plane`) and what the
rows become (`reporting`: figures, intervals, the report page)."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["advtrain", "attack", "diasafety_train", "quickstart", "registry", "reporting", "score",
           "taebench", "transfer"]
