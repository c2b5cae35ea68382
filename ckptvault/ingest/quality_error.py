"""The error of asking Great Expectations, in this process (quality.py) or in the gate child
(quality_child.py): both raise it, so it lives below both."""

from __future__ import annotations

from ckptvault.errors import CkptvaultError


class QualityError(CkptvaultError, RuntimeError):
    """Great Expectations failed to evaluate an expectation (a bug or a broken install, never a
    verdict on the checkpoint). Callers must not treat it as a pass."""
