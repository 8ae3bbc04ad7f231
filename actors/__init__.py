"""What does the work: stateful workers that load a model once and process batches."""
