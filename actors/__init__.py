"""What does the work: stateful workers that load a model once and process batches."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["attack", "detectors", "dialogue_safety", "generators", "judges",
           "providers", "tiny_models", "trainer", "triggers"]
