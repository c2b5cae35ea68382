"""The first half of a restore, before any byte moves: the run's saves read (from its catalog, or from a
replica's manifests when the primary is down), the save resolved, each copy of it surveyed, the copy
to read chosen, and the estimate. Its second half is ckptvault/restore/complete.py.

One function for both ways a restore runs, so that they cannot drift apart: `ckptvault restore`
calls it to refuse bad input (exit 2) before anything starts and to print the estimate, and the
restore flow calls it as its body's first half (ckptvault_prefect/flows/restore.py). What differs
between them (Prefect tasks or plain calls for the reads, what is printed or alerted on the way, the
command line's destination check and runner choice between the resolution and the survey) is a
field of `Ways`; the reads and their order are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ckptvault.catalog import Catalog
from ckptvault.clock import timing
from ckptvault.clock.timing import phase
from ckptvault.config import Config
from ckptvault.pricing import load_prices
from ckptvault.restore import copies as copies_lib
from ckptvault.restore import from_manifests
from ckptvault.restore.complete import Chosen
from ckptvault.restore.copies import Copy, CopyStatus
from ckptvault.restore.estimate import estimate
from ckptvault.restore.from_manifests import RunHistory
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import Resolution, parse_step, resolve
from ckptvault.restore.selection import Selected, narrow_statuses, parse_selection

Survey = Callable[[Sequence[Copy], str, int, int], list[CopyStatus]]


@dataclass(frozen=True)
class Request:
    """What was asked: the command line's arguments, the flow's parameters."""

    run: str
    dest: str
    step: str = "latest"
    save: int | None = None
    tier: str = "Standard"
    force: bool = False
    source: str | None = None  # `--from`: the copy read first; None: the cheapest usable one
    only: tuple[str, ...] = ()  # `--only`: model, optimizer or glob patterns (restore/selection.py)
    exclude: tuple[str, ...] = ()  # `--exclude`: glob patterns
    only_keys: tuple[str, ...] = ()  # `--only-keys`: FQN prefixes of a DCP checkpoint's items


def _nothing(_: object) -> None:
    return None


def _nothing2(_: object, __: object) -> None:
    return None


@dataclass(frozen=True)
class Ways:
    """How each step is run and who is told what on the way: the library's plain calls by default.

    The flow passes its Prefect tasks for the reads (retried, in its run's graph) and prints to its
    log and alerts; the command line warns on stderr, prints the estimate and checks what only it
    checks before the survey."""

    read_history: Callable[[Catalog, str], RunHistory] = from_manifests.read_run_once
    replica_history: Callable[[Sequence[Copy], str], RunHistory] = copies_lib.history_from_replicas
    survey: Survey = copies_lib.survey_once
    # `--step N`: survey that save on a thread beside the catalog's read (copies.EarlySurvey)
    survey_early: bool = False
    # the run's catalog could not be read in full: its objects that could not (key -> why), and what that means
    unreadable: Callable[[Mapping[str, str], str], None] = _nothing2
    primary_down: Callable[[str], None] = _nothing  # why the primary is unreachable, before the replicas are read
    resolved: Callable[[Resolution], None] = _nothing  # the save is known; nothing surveyed yet
    planned: Callable[[Chosen], None] = _nothing  # the copy and the estimate are known; nothing moved yet


@dataclass(frozen=True)
class Prepared:
    """The first half's outcome: what the second half (`complete`) takes."""

    chosen: Chosen
    catalog: Catalog | None  # the primary's; None when it is unreachable (nothing recorded nor alerted)
    unreadable: Mapping[str, str]  # catalog objects of the run that could not be read: key -> why


def prepare(cfg: Config, copies: Sequence[Copy], request: Request, ways: Ways = Ways()) -> Prepared:
    """Resolve the save and choose the copy, or raise RestoreError (bad input: nothing touched).
    `copies`: the primary first, then the replicas (copies.open_copies); a copy without a store is
    one that could not be reached."""
    selection = parse_selection(
        request.only, request.exclude, request.only_keys
    )  # a bad pattern is refused before any read
    primary = copies[0].store
    catalog = Catalog(primary, cfg.store.prefix) if primary is not None else None
    early = copies_lib.EarlySurvey(copies, request.run, request.step, request.save) if ways.survey_early else None
    with phase(timing.CATALOG_READ):
        if catalog is not None:
            # the run's manifests stand in for whatever of its catalog cannot be read
            history = ways.read_history(catalog, request.run)
            if history.unreadable:
                ways.unreadable(history.unreadable, from_manifests.fallback_warning(request.run, history.unreadable))
        else:
            ways.primary_down(copies[0].problem)
            history = ways.replica_history(copies, request.run)
        res = resolve(history.states(), request.run, parse_step(request.step), request.save, request.force)
    ways.resolved(res)
    with phase(timing.PLAN):
        # which copy is read (docs/replicas.md, "Restore from a copy"): each copy's manifest and one LIST
        statuses = early.statuses(res.step, res.save) if early is not None else None
        if statuses is None:
            statuses = ways.survey(copies, request.run, res.step, res.save)
        selected: Selected | None = None
        awaiting: tuple[ObjectPlan, ...] = ()
        surveyed = {s.name: s for s in statuses}
        if not selection.whole:  # the part alone is planned, thawed, estimated and fetched
            selected, statuses = narrow_statuses(statuses, selection)
            if not selected.partial:  # it selects every file whole: a whole restore, said as one
                selected = None
        ordered = copies_lib.choose(statuses, request.source)
        first = ordered[0]
        assert first.manifest is not None  # a usable copy has its manifest (copies.survey)
        if selected is not None and selected.tensors is not None:
            # which ranges of each .distcp: from the .metadata beside them, read from the copy chosen
            from ckptvault.restore import tensors

            assert first.store is not None
            # from the archive, the .metadata is thawed first (complete.py); until then which .distcp
            # files are read is not known, and the estimate counts them whole
            awaiting = tensors.frozen_metadata(selected, surveyed[first.name].plans)
            if not awaiting:
                blocks = tensors.copies_blocks(ordered)
                selected = tensors.resolve(selected, first.store, surveyed[first.name].plans, blocks)
        prices = load_prices(cfg.policy.prices)
        egress = cfg.store.egress if first.order == 0 else cfg.replicas[first.order - 1].egress
        reads = selected.reads if selected is not None else None
        est = estimate(first.manifest, list(first.plans), prices, request.tier, egress, history.throughput(), reads)
        if selected is not None:  # what the part saves against the whole, from the same copy
            full = surveyed[first.name]
            assert full.manifest is not None
            whole = estimate(full.manifest, list(full.plans), prices, request.tier, egress, history.throughput())
            est = replace(est, whole=whole)
        target = Path(request.dest).expanduser().resolve()
        chosen = Chosen(request.run, res, target, tuple(ordered), tuple(statuses), est, selected, awaiting)
        ways.planned(chosen)
    return Prepared(chosen, catalog, history.unreadable)
