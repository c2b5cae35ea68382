"""The bench's results as a summary (medians, ratios to the peers, the targets met) and as the table
printed at the end and kept in bench/results/latest.txt."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

from bench.units import GiB


def _median(xs: Iterator[float] | list[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for t in res["transfers"]:
        key = f"{t['server']}/{t['op']}/{t['tool']}"
        rows.setdefault(key, []).append(t)
    table = {}
    for key, ts in rows.items():
        good = [t for t in ts if t["ok"]]
        table[key] = {
            "mb_s": _median(t["mb_s"] for t in good),
            "cpu_s_per_gb": _median(t["cpu_s_per_gb"] for t in good),
            "max_rss_mib": max((t["max_rss_mib"] for t in good), default=float("nan")),
            "max_pss_mib": max((t.get("tree_pss_mib", float("nan")) for t in good), default=float("nan")),
            "seconds": _median(t["seconds"] for t in good),
            "reps_ok": len(good),
            "reps": len(ts),
        }
    # ratios and targets, per server
    targets: dict[str, Any] = {}
    servers = sorted({t["server"] for t in res["transfers"]})
    for s in servers:

        def g(op: str, tool: str, field: str, s: str = s) -> float:
            return table.get(f"{s}/{op}/{tool}", {}).get(field, float("nan"))

        for tool in ("ckptvault", "ckptvault-lib", "ckptvault-lib-tuned"):
            for op in ("upload", "download"):
                base = f"{s}/{op}/{tool}"
                if base not in table:
                    continue
                table[base]["x_s5cmd"] = g(op, tool, "mb_s") / g(op, "s5cmd", "mb_s")
                table[base]["x_awscli"] = g(op, tool, "mb_s") / g(op, "awscli", "mb_s")
                table[base]["cpu_vs_awscli"] = g(op, tool, "cpu_s_per_gb") / g(op, "awscli", "cpu_s_per_gb")
        targets[s] = {
            "ingest >= 1.0x s5cmd": g("upload", "ckptvault", "mb_s") >= g("upload", "s5cmd", "mb_s"),
            "ingest >= 1.3x awscli": g("upload", "ckptvault", "mb_s") >= 1.3 * g("upload", "awscli", "mb_s"),
            "restore >= 1.0x s5cmd": g("download", "ckptvault", "mb_s") >= g("download", "s5cmd", "mb_s"),
            "ingest peak RSS < 400 MiB": g("upload", "ckptvault", "max_rss_mib") < 400,
            "ingest CPU s/GB <= awscli": g("upload", "ckptvault", "cpu_s_per_gb")
            <= g("upload", "awscli", "cpu_s_per_gb"),
            "restore CPU s/GB <= awscli": g("download", "ckptvault", "cpu_s_per_gb")
            <= g("download", "awscli", "cpu_s_per_gb"),
            # the same, for the data path without the one-shot CLI's fixed costs (see docs/performance.md)
            "data path: upload >= 1.0x s5cmd": g("upload", "ckptvault-lib", "mb_s") >= g("upload", "s5cmd", "mb_s"),
            "data path: upload >= 1.3x awscli": g("upload", "ckptvault-lib", "mb_s")
            >= 1.3 * g("upload", "awscli", "mb_s"),
            "data path: download >= 1.0x s5cmd": g("download", "ckptvault-lib", "mb_s")
            >= g("download", "s5cmd", "mb_s"),
            "data path: upload peak RSS < 400 MiB": g("upload", "ckptvault-lib", "max_rss_mib") < 400,
            "data path: upload CPU s/GB <= awscli": g("upload", "ckptvault-lib", "cpu_s_per_gb")
            <= g("upload", "awscli", "cpu_s_per_gb"),
        }
    if "big_ingest" in res:
        targets["big"] = {
            f"ingest peak RSS < 400 MiB at {res['big_ingest']['gib']:g} GiB": res["big_ingest"]["max_rss_mib"] < 400
        }
    if "big_restore" in res:
        b = res["big_restore"]
        targets["big"][f"restore >= 1.0x s5cmd at {b['gib']:g} GiB (one run)"] = (
            b["ckptvault"]["ok"] and b["ckptvault"]["mb_s"] >= b["s5cmd"]["mb_s"]
        )
    if "discovery" in res:
        d = res["discovery"]
        targets["discovery"] = {
            "discovery <= 2x find": d["discover_seconds"] <= 2 * d["find_seconds"],
            "discovery <= 2x find -printf (stat per file)": d["discover_seconds"] <= 2 * d["find_stat_seconds"],
        }
    return {"table": table, "targets": targets}


def render(res: dict[str, Any]) -> str:
    meta = res["meta"]
    summ = res["summary"]
    lines = [
        f"ckptvault bench, {meta['started'][:16]}Z, {meta['machine']}; checkpoint "
        f"{res['checkpoint']['bytes'] / GiB:.2f} GiB in {res['checkpoint']['files']} files; "
        f"median of {meta['args']['reps']}",
        "",
        "| server | op | tool | MB/s | CPU s/GB | peak RSS MiB | peak PSS MiB | x s5cmd | x awscli | CPU vs awscli |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, r in summ["table"].items():
        s, op, tool = key.split("/")
        name = {
            "ckptvault": "ckptvault ingest" if op == "upload" else "ckptvault restore",
            "ckptvault-lib": "ckptvault data path (library)",
            "ckptvault-lib-tuned": f"ckptvault data path, {_tuned_label(meta['args'].get('tuned', ''))}",
        }.get(tool, tool)

        def f(v: Any, fmt: str) -> str:
            return "" if v is None or v != v else format(v, fmt)

        bad = "" if r["reps_ok"] == r["reps"] else f" ({r['reps'] - r['reps_ok']} failed)"
        lines.append(
            f"| {s} | {op} | {name}{bad} | {f(r['mb_s'], '.0f')} | {f(r['cpu_s_per_gb'], '.2f')} | "
            f"{f(r['max_rss_mib'], '.0f')} | {f(r.get('max_pss_mib'), '.0f')} | "
            f"{f(r.get('x_s5cmd'), '.2f')} | {f(r.get('x_awscli'), '.2f')} | "
            f"{f(r.get('cpu_vs_awscli'), '.2f')} |"
        )
    lines.append("")
    if "ingest_fixed_cost" in res:
        for s, m in res["ingest_fixed_cost"].items():
            lines.append(
                f"- `ckptvault ingest` with nothing to send ({s}): {m['seconds']:.1f} s, "
                f"{m['cpu_seconds']:.1f} CPU s, {m['max_rss_mib']:.0f} MiB (start-up + Prefect + discovery)"
            )
    if "big_ingest" in res:
        b = res["big_ingest"]
        lines.append(
            f"- `ckptvault ingest` of {b['gib']:g} GiB on {b['server']}: peak RSS {b['max_rss_mib']:.0f} MiB "
            f"(PSS {b.get('tree_pss_mib', float('nan')):.0f}), "
            f"{b['mb_s']:.0f} MB/s, {b['cpu_s_per_gb']:.2f} CPU s/GB{'' if b['ok'] else ' (FAILED)'}"
        )
    if "big_restore" in res:
        b = res["big_restore"]
        c, s5 = b["ckptvault"], b["s5cmd"]
        lines.append(
            f"- `ckptvault restore` of the same {b['gib']:g} GiB on {b['server']} (one run each): "
            f"{c['mb_s']:.0f} MB/s, {c['cpu_s_per_gb']:.2f} CPU s/GB, {c['max_rss_mib']:.0f} MiB; s5cmd "
            f"{s5['mb_s']:.0f} MB/s, {s5['cpu_s_per_gb']:.2f} CPU s/GB: {c['mb_s'] / s5['mb_s']:.2f}x s5cmd"
            f"{'' if c['ok'] and s5['ok'] else ' (FAILED)'}"
        )
    if "discovery" in res:
        d = res["discovery"]
        lines.append(
            f"- discovery over {d['dirs']} checkpoint dirs / {d['files']} files: {d['discover_seconds']:.2f} s "
            f"(process {d['discover_process_seconds']:.2f} s, {d['discover_max_rss_mib']:.0f} MiB) vs "
            f"`find -type f` {d['find_seconds']:.2f} s ({d['discover_seconds'] / d['find_seconds']:.2f}x), "
            f"`find -printf size,mtime` {d['find_stat_seconds']:.2f} s "
            f"({d['discover_seconds'] / d['find_stat_seconds']:.2f}x)"
        )
    if "planning" in res:
        p = res["planning"]
        lines.append(f"- planning (policy.plan) over {p['checkpoints']} checkpoints: {p['seconds']:.2f} s")
    if "validation" in res:
        v = res["validation"]
        lines.append(
            f"- validation (validate_candidate): in a child process (the default) "
            f"{v.get('isolated_seconds', float('nan')):.1f} s; in-process {v['seconds'] * 1000:.0f} ms warm, "
            f"{v['cold_seconds']:.1f} s cold (Great Expectations import + context)"
        )
    if "plan_mixed" in res:
        p = res["plan_mixed"]
        lines.append(
            f"- planning {p['checkpoints']} checkpoints in 50 runs, every action kind "
            f"({', '.join(p['action_kinds'])}): {p['cpu_seconds']:.2f} CPU s (best), {p['seconds']:.2f} s wall"
        )
    if "validate_wide" in res:
        v = res["validate_wide"]
        lines.append(
            f"- validation of {v['files']} files against {v['history']} checkpoints (in-process, warm): "
            f"{v['seconds'] * 1000:.0f} ms ({v['verdict']})"
        )
    if "header_read" in res:
        h = res["header_read"]
        lines.append(
            f"- structure check of a sparse {h['file_bytes'] / GiB:.0f} GiB safetensors file: "
            f"{h['seconds'] * 1e6:.0f} us, {h['bytes_read']} bytes read"
        )
    if "endpoint_down" in res:
        lines.append(f"- a dead endpoint (connection refused) to its message: {res['endpoint_down']['seconds']:.2f} s")
    lines.append("")
    lines.append("Targets:")
    for group, ts in summ["targets"].items():
        for name, ok in ts.items():
            lines.append(f"- [{'x' if ok else ' '}] {group}: {name}")
    for n in res.get("notes", []):
        lines.append(f"- note: {n}")
    return "\n".join(lines)


def _tuned_label(spec: str) -> str:
    return f"{spec} (MiB,conc)" if "=" not in spec else f"`{spec}`"
