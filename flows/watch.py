"""The `watch` flow (defined in ckptvault_prefect/flows/watch.py)."""

from ckptvault_prefect.flows.watch import watch

__all__ = ["watch"]
