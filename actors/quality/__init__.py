"""Quality filters for adversarial examples: deduplication, grammar, naturalness."""
