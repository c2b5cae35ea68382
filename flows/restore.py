"""The `restore` flow (defined in ckptvault_prefect/flows/restore.py)."""

from ckptvault_prefect.flows.restore import restore

__all__ = ["restore"]
