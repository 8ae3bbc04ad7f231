"""Context-sensitive dialogue safety (DiaSafety): taxonomy, one-vs-all classifiers, two-step detection."""
