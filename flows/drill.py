"""The `drill` flow (defined in ckptvault_prefect/flows/drill.py)."""

from ckptvault_prefect.flows.drill import drill

__all__ = ["drill"]
