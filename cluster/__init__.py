"""Where and how things run: CLI, configuration, Ray runtime, job submission, storage."""
