"""What a drill proves about a restored checkpoint beyond its CRC32Cs, and how, file by file.

Nothing read from the bucket is ever executed. A pickle is either loaded by an unpickler that
constructs only an allowlist of plain data types (`torch.load(weights_only=True)`; DCP's `.metadata`
with `_MetadataUnpickler`), or its opcodes are read with `pickletools.genops` to the STOP opcode and
never run. `weights_only=False` is never used on restored bytes.

Per file (or per checkpoint directory, for DCP and Orbax, whose files only load together):

- `*.safetensors`: every tensor read in full (safetensors, numpy).
- torch.save zips (`.pt`, `.pth`, `.bin`, `.ckpt`): every member's CRC, then
  `torch.load(weights_only=True)` where torch is installed. A file that weights_only refuses because
  its pickle names a framework's class (HF `training_args.bin` holds a `TrainingArguments`, DeepSpeed's
  optimizer states a `LossScaler`, Lightning's `.ckpt` its callbacks' state) is not a failure: its
  pickle is read as opcodes (a truncated or garbled pickle fails, every storage it names must be in
  the zip) and the classes it names are listed. Where torch is not installed, the same opcode read
  runs and the check says that `torch.load` did not.
- DCP directories (`.metadata` + `*.distcp`, also Megatron-Core's torch_dist): the metadata is
  unpickled with only DCP's metadata classes (and the save plans Megatron-Core adds) allowed, then
  `torch.distributed.checkpoint.load` (no process group) reads every tensor into an empty tensor
  of its recorded shape and dtype, in batches of at most `DCP_BATCH_BYTES`.
  Non-tensor entries (DCP stores them as torch.save bytes, which DCP itself would load with
  `weights_only=False`) are checked like a torch zip above instead.
- Orbax items (directories with `_METADATA`): restored with `orbax.checkpoint.StandardCheckpointer`
  (arrays read through tensorstore; no pickles) and counted.
- `*.json` and Orbax's `_CHECKPOINT_METADATA`: parsed.
- Anything else: only its CRC32C, and the check says so.

A framework that is not installed on the worker is never a silent pass: the check says which load
it could not run (`ran = False`), and the drill result carries that line.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path, PurePosixPath

from ckptvault.restore.load_result import (
    DCP_METADATA,
    DCP_SUFFIX,
    JSON_NAMES,
    ORBAX_ITEM_METADATA,
    TORCH_SUFFIXES,
)
from ckptvault.restore.load_result import FileCheck as FileCheck
from ckptvault.restore.load_result import LoadReport as LoadReport
from ckptvault.restore.pickle_check import check_torch_zip
from ckptvault.restore.pickle_check import scan_pickle as scan_pickle
from ckptvault.restore.safetensors_check import check_safetensors
from ckptvault.restore.tensor_load import check_dcp_dir, check_orbax_item


def _check_file(path: Path, rel: str) -> FileCheck:
    name = path.name
    if name.endswith(".safetensors"):
        return check_safetensors(path, rel)
    if name.endswith(TORCH_SUFFIXES):
        if zipfile.is_zipfile(path):
            return check_torch_zip(path, rel)
        if name.endswith((".pt", ".ckpt")):
            return FileCheck(rel, "torch file", "not a zip-format torch file")
        return FileCheck(rel, "CRC32C only (not a torch.save zip; no load check for it)")
    if name.endswith(".json") or name in JSON_NAMES:
        try:
            json.loads(path.read_bytes())
        except (OSError, ValueError) as e:
            return FileCheck(rel, "JSON parsed", f"not valid JSON: {e}")
        return FileCheck(rel, "JSON parsed")
    return FileCheck(rel, "CRC32C only (no load check for this kind of file)")


def _units(root: Path, files: list[Path]) -> tuple[list[tuple[Path, str]], set[Path]]:
    """Directories checked as a whole, as (dir, kind), and the files they cover: a DCP directory's
    `.metadata` and `.distcp` files; everything under an Orbax item."""
    dirs = sorted({p.parent for p in files})
    units: list[tuple[Path, str]] = []
    for d in dirs:
        names = {p.name for p in files if p.parent == d}
        if DCP_METADATA in names and any(n.endswith(DCP_SUFFIX) for n in names):
            units.append((d, "dcp"))
        elif ORBAX_ITEM_METADATA in names:
            units.append((d, "orbax"))
    dcp = {d for d, kind in units if kind == "dcp"}
    orbax = [d for d, kind in units if kind == "orbax"]
    covered = {
        p
        for p in files
        if (p.parent in dcp and (p.name == DCP_METADATA or p.name.endswith(DCP_SUFFIX)))
        or any(d in p.parents for d in orbax)
    }
    return units, covered


def _rel(root: Path, p: Path, is_file_ckpt: bool) -> str:
    if is_file_ckpt:
        return p.name
    rel = PurePosixPath(p.relative_to(root).as_posix())
    return str(rel)


def check(ckpt_path: Path) -> LoadReport:
    """Every load check of the restored checkpoint `ckpt_path` (a directory or one file)."""
    if ckpt_path.is_file():
        return LoadReport((_check_file(ckpt_path, ckpt_path.name),))
    files = sorted(p for p in ckpt_path.rglob("*") if p.is_file())
    units, covered = _units(ckpt_path, files)
    checks: list[FileCheck] = []
    for d, kind in units:
        rel = (d.relative_to(ckpt_path).as_posix() + "/") if d != ckpt_path else "./"
        checks.append(check_dcp_dir(d, rel) if kind == "dcp" else check_orbax_item(d, rel))
    for p in files:
        if p not in covered:
            checks.append(_check_file(p, _rel(ckpt_path, p, False)))
    dangling = sorted({p.parent for p in files if p.name.endswith(DCP_SUFFIX)} - {d for d, k in units if k == "dcp"})
    for d in dangling:
        rel = (d.relative_to(ckpt_path).as_posix() + "/") if d != ckpt_path else "./"
        checks.append(FileCheck(rel, "DCP shards", f"{DCP_SUFFIX} shards without {DCP_METADATA}: they cannot load"))
    return LoadReport(tuple(sorted(checks, key=lambda c: c.path)))


def report_json(report: LoadReport, loaded_with: dict[str, str]) -> str:
    """What `python -m ckptvault.restore.loadcheck PATH` prints: the checks and the versions they ran with."""
    checks = [{"path": c.path, "how": c.how, "problem": c.problem, "ran": c.ran} for c in report.checks]
    return json.dumps({"loaded_with": loaded_with, "checks": checks}, sort_keys=True)


def report_from_json(text: str) -> tuple[LoadReport, dict[str, str]]:
    """`report_json`'s output read back; ValueError (or KeyError, TypeError) if it is not that."""
    doc = json.loads(text)
    checks = tuple(FileCheck(str(c["path"]), str(c["how"]), str(c["problem"]), bool(c["ran"])) for c in doc["checks"])
    return LoadReport(checks), {str(k): str(v) for k, v in dict(doc["loaded_with"]).items()}


def main(argv: list[str] | None = None) -> int:
    """The load checks of one restored checkpoint in this interpreter, as JSON on stdout: how a drill runs
    them in another environment (`drill --python PATH`, ckptvault/restore/environment.py). `--env`: only
    the versions, to probe that the interpreter runs this module at all."""
    import sys

    from ckptvault.restore.load_result import loaded_with

    args = sys.argv[1:] if argv is None else argv
    if args == ["--env"]:
        print(json.dumps({"loaded_with": loaded_with()}, sort_keys=True))
        return 0
    if len(args) != 1:
        print("usage: python -m ckptvault.restore.loadcheck PATH | --env", file=sys.stderr)
        return 2
    print(report_json(check(Path(args[0])), loaded_with()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
