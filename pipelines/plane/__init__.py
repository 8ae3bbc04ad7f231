"""The data plane: how a run's rows are read (`corpora`, `input_source`), cut into shards
(`sharded`), sent through actor pools in Ray Data plans (`runner` on the driver, `shard_host` in each
actor, `steps` the one way in) and written as Parquet parts with their schemas (`schema`) and the
viewer's index (`table_index`, read by `per_text`). It imports figures from `reporting`, never a
pipeline."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["corpora", "per_text", "runner", "schema", "shard_host", "sharded", "steps", "table_index"]
