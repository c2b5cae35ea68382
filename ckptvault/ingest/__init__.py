"""Ingest: find finished checkpoints, check them, and commit them to the store (data, then manifest)."""
