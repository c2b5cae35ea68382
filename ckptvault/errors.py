"""The root of every error ckptvault raises on purpose: its message names the thing and the fix.

Each concept keeps its own error class in its own module (ConfigError in config, StoreError in store,
CatalogError in catalog, ...), all under `CkptvaultError`, so an entry point can tell "ckptvault said
no, here is why" (print the message, exit non-zero, no traceback) from a bug (a traceback is right).
Some also derive from ValueError or RuntimeError, the standard exception callers catch (or caught
before the class joined this tree). The entry layers' own errors (the CLI's UsageError, the Prefect
layer's runner errors) are CkptvaultErrors too: tests/unit/test_error_tree.py fails on one that is not.
"""

from __future__ import annotations


class CkptvaultError(Exception):
    """An expected failure, with a message written for the operator."""


class InvalidArgumentError(CkptvaultError, ValueError):
    """A value handed to the library that it refuses: the message names the value and what it accepts.

    A ValueError too, so callers and validators (pydantic turns a ValueError into a field error) that
    catch the standard exception keep working."""


class AlreadyAlerted(CkptvaultError):
    """A failure whose every part was alerted on by the flow itself: the failure hook stays quiet
    rather than saying the same thing twice. The base of the errors that say how a pass ended
    (ckptvault.ingest.steps.IngestIncomplete, ckptvault.restore.drill.DrillFailed), which the flow and
    the command line report."""
