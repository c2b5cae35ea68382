"""The `replicate` flow (defined in ckptvault_prefect/flows/replicate.py)."""

from ckptvault_prefect.flows.replicate import replicate

__all__ = ["replicate"]
