"""redline: distributed safety evaluation of toxicity detectors and conversational models on Ray."""

__version__ = "0.1.0"
