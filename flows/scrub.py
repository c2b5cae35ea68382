"""The `scrub` flow (defined in ckptvault_prefect/flows/scrub.py)."""

from ckptvault_prefect.flows.scrub import scrub

__all__ = ["scrub"]
