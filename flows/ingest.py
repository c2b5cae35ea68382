"""The `ingest` flow (defined in ckptvault_prefect/flows/ingest.py)."""

from ckptvault_prefect.flows.ingest import ingest

__all__ = ["ingest"]
