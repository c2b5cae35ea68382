"""What one run of the restore flow reports: the checkpoint resolved, the estimate, and how it ended
(restored, or still thawing). `as_dict` is the `ckptvault restore --json` document (docs/commands.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class RestoreResult:
    run: str
    step: int
    save: int
    notes: tuple[str, ...]  # what the resolution said (e.g. which newer saves it passed over)
    dest: str
    estimate: str  # Estimate.describe()
    estimate_detail: dict[str, object]  # Estimate.as_record()
    status: Literal["restored", "thawing"]
    # thawing: how many objects are still frozen, and what to do about it
    frozen: int = 0
    message: str = ""
    # restored:
    pointer: str | None = None  # the framework's pointer file written, if its layout has one
    replaced: str | None = None  # where the destination's previous contents were kept (--force)
    bytes: int = 0
    files: int = 0
    # docs/replicas.md, "Restore from a copy": the copy read first ("primary" or a replica's name), every
    # copy as the survey saw it (copies.CopyStatus.as_dict), the files read from another copy (Fallback.as_dict)
    source: str = "primary"
    copies: tuple[dict[str, Any], ...] = ()
    fallbacks: tuple[dict[str, str], ...] = ()
    # a partial restore's files (restore/selection.py Selected.as_dict); None: the whole save
    selection: dict[str, Any] | None = None

    def ledger_counts(self, seconds: float) -> dict[str, float]:
        """What the metrics' ledger counts of this restore (ckptvault/observe/ledger.py), `seconds` being how long
        it spent bringing the bytes back: nothing for one still thawing (its bytes come with the restore that
        ends it)."""
        if self.status != "restored":
            return {}
        return {"restore_bytes": float(self.bytes), "restore_seconds": float(seconds)}

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "run": self.run, "step": self.step, "save": self.save, "notes": list(self.notes), "dest": self.dest,
            "estimate": self.estimate, "estimate_detail": self.estimate_detail, "status": self.status,
        }  # fmt: skip
        if self.status == "thawing":
            doc.update(frozen=self.frozen, message=self.message)
        else:
            doc.update(pointer=self.pointer, replaced=self.replaced, bytes=self.bytes, files=self.files,
                       fallbacks=list(self.fallbacks), message=self.message)  # fmt: skip
        doc.update(source=self.source, copies=list(self.copies), partial=self.selection is not None)
        if self.selection is not None:
            doc["selection"] = self.selection
        return doc
