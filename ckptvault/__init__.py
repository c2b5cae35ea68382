"""ckptvault: the lifecycle of training checkpoints, as a library. No Prefect in here."""

__version__ = "0.1.0"
