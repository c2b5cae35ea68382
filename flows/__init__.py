"""ckptvault's Prefect flows, where a Prefect project keeps them.

The code ships as `ckptvault_prefect.flows`: a `pip install` must not put a package named `flows` into
site-packages, where it would collide with other projects'. Each module here names the very same flow
object, so file entrypoints (`flows/ingest.py:ingest`) and `from flows.ingest import ingest` work from a
checkout as Prefect users expect; nothing is defined twice.
"""
