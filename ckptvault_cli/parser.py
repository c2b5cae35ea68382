"""The `ckptvault` argument parser: every subcommand, its flags and their help, and which `cmd_*` runs it."""

from __future__ import annotations

import argparse

from ckptvault_cli.commands.blocks import cmd_blocks_backfill
from ckptvault_cli.commands.catalog import cmd_accept, cmd_catalog_rebuild, cmd_catalog_stats, cmd_ls
from ckptvault_cli.commands.catalog_compact import cmd_catalog_compact
from ckptvault_cli.commands.follow import cmd_follow
from ckptvault_cli.commands.hold import cmd_hold, cmd_release
from ckptvault_cli.commands.ingest import cmd_ingest
from ckptvault_cli.commands.metrics import cmd_metrics
from ckptvault_cli.commands.recover import cmd_recover
from ckptvault_cli.commands.replicate import cmd_replicate
from ckptvault_cli.commands.restore import cmd_drill, cmd_restore
from ckptvault_cli.commands.scrub import cmd_scrub
from ckptvault_cli.commands.serve import cmd_serve
from ckptvault_cli.commands.tiering import cmd_plan, cmd_tier, cmd_watch
from ckptvault_cli.commands.warm import cmd_warm
from ckptvault_prefect.deployments.flow_list import FLOWS, serve_description

# --as-of (docs/object-lock.md, "After an attack"): read the bucket's versions as they were
AS_OF_HELP = (
    "read {what} as it was at TIME (ISO 8601 with a zone, 2026-12-07T08:00:00Z, or a duration ago: 2h, 3d), "
    "from the bucket's versions: after a delete or an overwrite; needs a versioned bucket"
)


def _dask_flags(s: argparse.ArgumentParser, work: str) -> None:
    s.add_argument(
        "--dask-workers", type=int, metavar="N", help=f"fan file {work} out over a new local Dask cluster of N workers"
    )
    s.add_argument(
        "--dask-address",
        metavar="tcp://HOST:PORT",
        help=f"fan file {work} out over the existing Dask cluster of this scheduler (overrides [scale])",
    )


def build_parser() -> argparse.ArgumentParser:
    from ckptvault import __version__

    config_help = "the TOML config (default: $CKPTVAULT_CONFIG)"
    p = argparse.ArgumentParser(prog="ckptvault", description="Training checkpoints: ingest, tier, drill, restore.")
    p.add_argument("--config", help=config_help)
    p.add_argument("--version", action="version", version=f"ckptvault {__version__}")
    # The global options again on every subcommand, so `ckptvault ingest --config c.toml` works as well
    # as `ckptvault --config c.toml ingest`. SUPPRESS: a subcommand sets it only when it is given there.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help=config_help)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("ingest", parents=[common], help="one ingest pass over every [[sources]] entry")
    _dask_flags(s, "uploads")
    s.add_argument("--run", metavar="R", help="only this run's source (a [[sources]] run = ...)")
    s.add_argument(
        "--step",
        type=int,
        action="append",
        metavar="S",
        help=(
            "with --run: only this step (again for more: --step S1 --step S2, one pass); its format's commit"
            " marker, where it has one, stands in for settle_seconds"
        ),
    )
    s.add_argument(
        "--written-by",
        metavar="'KEY=VERSION ...'",
        help=(
            "with --run and --step: what the process that saved them ran (e.g. 'torch=2.9.1 torch.cuda=12.8'),"
            " recorded in their manifests' written_by beside what the files record; the hooks pass it"
        ),
    )
    s.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    _profile_flag(s)
    s.set_defaults(fn=cmd_ingest)

    s = sub.add_parser(
        "follow", parents=[common], help="ingest each step as soon as its commit marker appears, until Ctrl-C"
    )
    s.add_argument("--run", metavar="R", help="only this run's source (default: every [[sources]] entry)")
    s.add_argument(
        "--poll-seconds",
        type=float,
        default=5.0,
        metavar="N",
        help="scan the polled sources every N seconds (default 5); inotify sources are rescanned every max(60, N) s",
    )
    s.add_argument(
        "--watch",
        choices=("auto", "inotify", "poll"),
        default="auto",
        help="auto (default): inotify where the run root is on a local file system, polling elsewhere",
    )
    s.set_defaults(fn=cmd_follow)

    s = sub.add_parser("ls", parents=[common], help="list checkpoints from the catalog")
    s.add_argument("--run", help="only this run")
    s.add_argument(
        "--state",
        metavar="STATE",
        help="only this lifecycle state: pending, invalid, accepted, verified, suspect, superseded, expired",
    )
    s.add_argument(
        "--since",
        metavar="WHEN",
        help="only saves written at or after WHEN: 2026-11-01, 2026-11-01T12:00:00Z, or back from now: 7d, 12h, 30m",
    )
    s.add_argument("--limit", type=int, metavar="N", help="only the N newest saves (listed in the usual order)")
    s.add_argument("--as-of", metavar="TIME", help=AS_OF_HELP.format(what="the catalog"))
    s.add_argument(
        "--json", action="store_true", help="one JSON object per checkpoint save (its schema: docs/commands.md)"
    )
    s.set_defaults(fn=cmd_ls)

    s = sub.add_parser(
        "restore", parents=[common], help="bring back a checkpoint to a directory the framework resumes from"
    )
    s.add_argument("run", help="the run name, as in [[sources]] run = ... (see `ckptvault ls`)")
    s.add_argument(
        "--step", default="latest", help="a step number or 'latest' (newest good: verified, not superseded or suspect)"
    )
    s.add_argument(
        "--save", type=int, metavar="K", help="which save of --step N (default: its newest; see `ls --run R`)"
    )
    s.add_argument("--dest", required=True, help="an empty or new directory (the run root to resume from)")
    s.add_argument(
        "--tier",
        default="Standard",
        choices=["Expedited", "Standard", "Bulk"],
        help="thaw speed for archived objects (cost rises with speed)",
    )
    _dask_flags(s, "downloads")
    s.add_argument(
        "--node-local",
        action="store_true",
        help='put each file back on the node that wrote it (the run\'s locality = "node" source), at --dest '
        "as that node sees it; needs a Dask cluster with a worker per node",
    )
    s.add_argument("--no-wait", action="store_true", help="request the thaw and return; rerun later to finish")
    s.add_argument(
        "--from",
        dest="source",
        metavar="STORE",
        help="read this copy first: `primary` or a [[replicas]] name (default: the reachable, complete copy "
        "cheapest to bring back; docs/replicas.md)",
    )
    s.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    s.add_argument("--wait-hours", type=float, default=48.0, help="give up waiting for a thaw after this long")
    s.add_argument(
        "--force",
        action="store_true",
        help="restore into a non-empty destination (kept aside, not deleted), or restore a suspect checkpoint",
    )
    _profile_flag(s)
    s.add_argument("--as-of", metavar="TIME", help=AS_OF_HELP.format(what="the save and every object of it"))
    s.add_argument(
        "--only",
        action="extend",
        nargs="+",
        metavar="PART",
        help="restore only this part: `model` (the weights and what loads them: config, tokenizer, index), "
        "`optimizer` (optimizer, scheduler, RNG and trainer state), or a glob on the paths inside the "
        "checkpoint; several after one flag or the flag repeated (their union; RUN goes before them); torch "
        "DCP's .distcp files (dcp, megatron torch_dist, nemo) are split by their tensors; another layout "
        "that keeps both in one file is refused, naming it (docs/frameworks/)",
    )
    s.add_argument(
        "--only-keys",
        action="extend",
        nargs="+",
        metavar="PREFIX",
        help="restore only the items of a torch DCP checkpoint whose fully-qualified names are PREFIX or start "
        "with PREFIX. (e.g. model.layers.0), with every file beside the .distcp ones; several after one flag or "
        "the flag repeated",
    )
    s.add_argument(
        "--exclude",
        action="append",
        metavar="PATTERN",
        help="leave out the files this glob matches (after --only); repeatable",
    )
    s.set_defaults(fn=cmd_restore)

    s = sub.add_parser("drill", parents=[common], help="restore a rotating sample into scratch and prove it loads")
    s.add_argument("--sample", type=int, help="how many checkpoints (default [drill].sample)")
    s.add_argument("--tier", choices=["Expedited", "Standard", "Bulk"], help="thaw tier (default [drill].restore_tier)")
    s.add_argument("--json", action="store_true", help="the drill report as JSON (its schema: docs/drills.md)")
    s.add_argument(
        "--as-of",
        metavar="TIME",
        help=AS_OF_HELP.format(what="the catalog and every drilled object") + "; recorded nowhere, writes nothing",
    )
    s.add_argument(
        "--verify-only",
        metavar="RUN",
        help="drill one save of RUN (with --step), to try the resume check ([drill] verify_command) out: restored "
        "into scratch, load-checked, the command run, the report printed with its output; recorded as a drill of "
        "that save",
    )
    s.add_argument("--step", type=int, metavar="N", help="with --verify-only: the step (its newest verified save)")
    s.add_argument(
        "--python",
        metavar="PATH",
        help="also run the load checks and the resume check ({python} in verify_command) with this interpreter (the "
        "environment of an upgrade): a save that passes here and fails there is format rot, not marked suspect",
    )
    s.set_defaults(fn=cmd_drill)

    s = sub.add_parser("plan", parents=[common], help="show the tiering plan and its cost (read-only, no Prefect)")
    s.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    s.set_defaults(fn=cmd_plan)

    s = sub.add_parser("tier", parents=[common], help="run the tier flow: the plan, and with --apply, carry it out")
    s.add_argument("--apply", action="store_true", help="carry out the plan (default: dry run)")
    s.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    s.set_defaults(fn=cmd_tier)

    s = sub.add_parser("watch", parents=[common], help="stale runs and storage budget; alerts")
    s.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    s.set_defaults(fn=cmd_watch)

    s = sub.add_parser(
        "replicate", parents=[common], help="copy the committed saves each [[replicas]] store should hold (no Prefect)"
    )
    s.add_argument("--replica", metavar="NAME", help="only the [[replicas]] entry with this name (default: every one)")
    s.add_argument(
        "--from-primary",
        action="store_true",
        help="read every object from the primary store, never the hot copy (e.g. to spare a busy hot file system)",
    )
    s.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    s.set_defaults(fn=cmd_replicate)

    s = sub.add_parser(
        "scrub", parents=[common], help="check every object of a rotating sample of saves on every copy (no Prefect)"
    )
    s.add_argument(
        "--sample", type=int, metavar="N",
        help="saves to check besides those a scrub left a problem in (default: enough that every save is "
        "checked within 7 scrubs)",
    )  # fmt: skip
    s.add_argument("--repair", action="store_true", help="rewrite each missing or bad object from a good copy")
    s.add_argument("--replica", metavar="NAME", help="check only this copy (a [[replicas]] name, or primary)")
    s.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    s.set_defaults(fn=cmd_scrub)

    s = sub.add_parser(
        "metrics", parents=[common], help="the Prometheus metrics of the catalog, computed once (docs/metrics.md)"
    )
    s.add_argument(
        "--textfile", metavar="PATH",
        help="write them to PATH (a *.prom file, replaced atomically) for the node exporter's textfile collector",
    )  # fmt: skip
    s.add_argument(
        "--push", metavar="URL",
        help="pushadd them to the Pushgateway at URL, grouped by job=ckptvault and config=BUCKET/PREFIX",
    )  # fmt: skip
    s.add_argument("--json", action="store_true", help="print them as one JSON document (its schema: docs/commands.md)")
    s.set_defaults(fn=cmd_metrics)

    s = sub.add_parser("accept", parents=[common], help="release a quarantined (invalid) checkpoint after review")
    s.add_argument("run", help="the run name (see `ckptvault ls --state invalid`)")
    s.add_argument("step", type=int, help="the quarantined step")
    s.add_argument("--reason", required=True, help="why it is fine: recorded in the catalog with your user name")
    s.set_defaults(fn=cmd_accept)

    for name, fn, what in (
        ("hold", cmd_hold, "set a legal hold on"),
        ("release", cmd_release, "clear the legal hold of"),
    ):
        s = sub.add_parser(name, parents=[common], help=f"{what} every object of a committed save (Object Lock)")
        s.add_argument("run", help="the run name (see `ckptvault ls`)")
        s.add_argument("--step", type=int, required=True, metavar="N", help="the checkpoint's step")
        s.add_argument("--save", type=int, metavar="K", help="which save of the step (default: its newest)")
        s.add_argument("--reason", required=True, help="why: recorded in the catalog with your user name")
        s.set_defaults(fn=fn)

    s = sub.add_parser(
        "recover",
        parents=[common],
        help="list every change to ckptvault's keys since TIME (deletes, overwrites, new keys) and its undo; "
        "--apply carries the undo out",
    )
    s.add_argument(
        "--since",
        required=True,
        metavar="TIME",
        help="the changes made after TIME: an ISO 8601 time with a zone (2026-12-07T08:00:00Z) or a duration ago "
        "(2h, 3d); needs a versioned bucket",
    )
    s.add_argument("--run", metavar="R", help="only this run's saves and catalog")
    s.add_argument(
        "--replica",
        "--from",
        dest="replica",
        metavar="NAME",
        help="the [[replicas]] copy to bring back instead of the primary (a replica hit by the same key)",
    )
    s.add_argument(
        "--apply",
        action="store_true",
        help="carry the plan out: remove the delete markers, put overwritten objects of committed saves back "
        "(checked against the manifest, locked again); deletes no data version; rerun it after any failure",
    )
    s.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    s.set_defaults(fn=cmd_recover)

    s = sub.add_parser(
        "serve",
        parents=[common],
        help=f"serve all {len(FLOWS)} deployments from this process (one machine, no work pool), and /metrics with "
        "[metrics]",
        description=serve_description(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the description's own lines: one flow each
    )
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser(
        "warm",
        help="start a warm process: later commands from this environment start in it, ~1 s sooner (docs/warm.md)",
    )
    w = s.add_mutually_exclusive_group()
    w.add_argument("--status", action="store_true", help="is one running for this environment (exit 1: no)")
    w.add_argument("--stop", action="store_true", help="stop it once the commands it is running end")
    s.add_argument(
        "--idle-minutes", type=float, default=60.0, metavar="M", help="it stops after M minutes without a command"
    )
    s.set_defaults(fn=cmd_warm)

    s = sub.add_parser("catalog", parents=[common], help="catalog maintenance")
    csub = s.add_subparsers(dest="catalog_command", required=True)
    r = csub.add_parser("rebuild", parents=[common], help="reconstruct catalog events from the manifests in the bucket")
    r.add_argument("--write", action="store_true", help="append the rebuilt events to the catalog")
    r.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    r.add_argument(
        "--as-of",
        metavar="TIME",
        help=AS_OF_HELP.format(what="the manifests")
        + "; --write appends what they give to today's catalog (docs/commands.md)",
    )
    r.set_defaults(fn=cmd_catalog_rebuild)
    r = csub.add_parser("stats", parents=[common], help="runs, checkpoints, events, catalog files, bytes per class")
    r.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    r.set_defaults(fn=cmd_catalog_stats)
    r = csub.add_parser(
        "compact", parents=[common], help="compact every partition of the catalog now (after an upgrade, a new fleet)"
    )
    r.add_argument("--runs", nargs="+", metavar="R", help="only these runs' partitions (default: every run)")
    r.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    r.set_defaults(fn=cmd_catalog_compact)

    s = sub.add_parser(
        "blocks", parents=[common], help="the block CRC32Cs ranged reads are checked by (docs/FORMAT.md)"
    )
    bsub = s.add_subparsers(dest="blocks_command", required=True)
    r = bsub.add_parser(
        "backfill",
        parents=[common],
        help="write _BLOCKS.json for committed saves without one that verifies, read from their objects",
    )
    r.add_argument("--run", metavar="R", help="only this run's saves")
    r.add_argument("--step", type=int, metavar="N", help="only this step's saves (with --run)")
    r.add_argument("--json", action="store_true", help="print one JSON document (its schema: docs/commands.md)")
    r.set_defaults(fn=cmd_blocks_backfill)
    return p


def _profile_flag(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--profile",
        action="store_true",
        help="after the output, print on stderr where this command's wall time went, phase by phase "
        "(with --json: a `profile` key too; docs/performance.md)",
    )
