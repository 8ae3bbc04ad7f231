"""redline: distributed safety evaluation of toxicity detectors and conversational models on Ray."""

__version__ = "0.1.0"

import os as _os

# Model loading progress bars are noise inside actors and pipelines; ours replace them.
_os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
