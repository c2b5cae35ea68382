"""The `tier` flow (defined in ckptvault_prefect/flows/tier.py)."""

from ckptvault_prefect.flows.tier import tier

__all__ = ["tier"]
