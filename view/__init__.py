"""`redline view`: a local, read-only web viewer of run directories (local or S3)."""
