"""Ray Serve apps wrapping the same actor classes the pipelines use."""
