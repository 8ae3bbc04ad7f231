"""How work flows: shards of a run processed on actors (`steps`, `runner`, `shard_host`), their schemas,
figures and reports."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["advtrain", "attack", "corpora", "diasafety_train", "figures", "gates", "per_text", "quickstart", "registry",
           "report", "schema", "score", "table_index", "taebench", "transfer", "uncertainty"]
