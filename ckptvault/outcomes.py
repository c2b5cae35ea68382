"""A flow failure the flow has alerted on itself: the base of the errors that say how a pass ended
(ckptvault.ingest.steps.IngestIncomplete, ckptvault.restore.drill.DrillFailed), which the flow and the
command line report."""

from __future__ import annotations

from ckptvault.errors import CkptvaultError


class AlreadyAlerted(CkptvaultError):
    """A failure whose every part was alerted on by the flow itself: the failure hook stays quiet
    rather than saying the same thing twice."""
