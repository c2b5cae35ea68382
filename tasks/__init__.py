"""ckptvault's Prefect tasks, where a Prefect project keeps them.

The code ships as `ckptvault_prefect.tasks` (no package named `tasks` in site-packages); each module
here re-exports its namesake there, for flows of your own written in a checkout.
"""
