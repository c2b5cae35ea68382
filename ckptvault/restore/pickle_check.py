"""torch.save zips checked without running them: member CRCs, `torch.load(weights_only=True)` where torch
is installed, and otherwise (or when weights_only refuses a framework's class) the pickle read as
opcodes to its STOP, every storage it names required in the zip."""

from __future__ import annotations

import pickle
import pickletools
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ckptvault.restore.load_result import NAMES_SHOWN, FileCheck, has


@dataclass(frozen=True)
class PickleScan:
    globals: tuple[str, ...]  # every class or function the pickle names, as module.qualname, in order
    storages: tuple[str, ...]  # torch.save storage keys named by its persistent ids
    trailing: int  # bytes after the STOP opcode


_MARK = object()
_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
               "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"}  # fmt: skip
_INT_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}


def scan_pickle(data: bytes) -> PickleScan:
    """Read a pickle's opcodes to its STOP with `pickletools.genops`, tracking the stack only as far as
    needed to name what it references: nothing is constructed, imported or called. Raises ValueError
    for a pickle that is truncated or garbled (an unknown opcode, a stack or memo that does not add
    up, no STOP)."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    names: list[str] = []
    storages: list[str] = []
    end = None
    for op, arg, pos in pickletools.genops(data):
        name = op.name
        before, after = op.stack_before, op.stack_after
        items: list[Any] = []
        if name == "MARK":
            stack.append(_MARK)
            continue
        if name == "POP" and stack and stack[-1] is _MARK:  # POP may drop a mark (pickle.py's load_pop)
            stack.pop()
            continue
        if pickletools.markobject in before:  # pops back to the newest mark (and what lies below it)
            if _MARK not in stack:
                raise ValueError(f"opcode {name} at byte {pos} finds no mark on the stack")
            k = len(stack) - 1 - stack[::-1].index(_MARK)
            items = stack[k + 1 :]
            del stack[k:]
            below = before.index(pickletools.markobject)
        else:
            below = len(before)
        if below:
            if len(stack) < below or any(v is _MARK for v in stack[-below:]):
                raise ValueError(f"opcode {name} at byte {pos} pops {below} item(s) from a stack of {len(stack)}")
            popped = stack[-below:]
            del stack[-below:]
        else:
            popped = []
        value: Any = None
        if name in _STRING_OPS or name in _INT_OPS:
            value = arg
        elif name == "GLOBAL":
            value = str(arg).replace(" ", ".", 1)
            names.append(value)
        elif name == "STACK_GLOBAL":
            mod, qual = popped
            value = f"{mod}.{qual}" if isinstance(mod, str) and isinstance(qual, str) else "<computed name>"
            names.append(value)
        elif name in ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"):
            value = tuple(items if name == "TUPLE" else popped)
        elif name == "EMPTY_TUPLE":
            value = ()
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in memo:
                raise ValueError(f"opcode {name} at byte {pos} reads memo slot {arg}, never written")
            value = memo[arg]
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):  # MEMOIZE pops and pushes its item, PUT peeks
            top = popped[-1] if popped else (stack[-1] if stack else _MARK)
            if top is _MARK:
                raise ValueError(f"opcode {name} at byte {pos} memoizes from an empty stack")
            memo[len(memo) if name == "MEMOIZE" else int(arg or 0)] = value = top
        elif name in ("BINPERSID", "PERSID"):
            pid = popped[0] if popped else arg
            if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[2], str):
                storages.append(pid[2])
        elif name == "STOP":
            if len(popped) != 1 or stack:
                raise ValueError(f"STOP at byte {pos} with {len(stack) + len(popped)} items on the stack, not 1")
            end = (pos or 0) + 1
            break
        stack.extend([value] + [None] * (len(after) - 1) if after else [])
    if end is None:
        raise ValueError("no STOP opcode: the pickle is truncated")
    return PickleScan(tuple(names), tuple(storages), len(data) - end)


def _outside_torch(names: Iterable[str]) -> list[str]:
    plain = ("torch.", "collections.", "builtins.", "_codecs.", "copyreg.")
    return sorted({n for n in names if not n.startswith(plain)})


def _name_list(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown + (f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")


def _scan_torch_zip(z: zipfile.ZipFile) -> tuple[str, str]:
    """(what the opcode read found, problem) for a torch.save zip whose CRCs passed."""
    pkls = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkls) != 1:
        return "", f"{len(pkls)} data.pkl members; a torch.save zip has exactly one"
    base = pkls[0][: -len("data.pkl")]
    try:
        scan = scan_pickle(z.read(pkls[0]))
    except ValueError as e:
        return "", f"{pkls[0]} is not a complete pickle: {e}"
    members = set(z.namelist())
    missing = sorted({k for k in scan.storages if f"{base}data/{k}" not in members})
    if missing:
        return "", f"its pickle names storage(s) absent from the zip: {_name_list([f'data/{k}' for k in missing])}"
    if scan.trailing:
        return "", f"{scan.trailing} bytes after the pickle's STOP opcode"
    outside = _outside_torch(scan.globals)
    what = f"names {_name_list(outside)}" if outside else "names only torch and builtin types"
    return f"{what}; {len(set(scan.storages))} storages present", ""


def _is_weights_only_refusal(e: Exception) -> bool:
    return isinstance(e, pickle.UnpicklingError) and "weights only" in str(e).lower()


def _refused_name(e: Exception) -> str:
    """The global torch's weights_only unpickler stopped at ("Unsupported global: GLOBAL x.y ...")."""
    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
    return f"it refuses {m[1]}" if m else "it refuses the pickle"


def check_torch_zip(source: Path | IO[bytes], rel: str) -> FileCheck:
    """A torch.save zip: member CRCs, then torch.load(weights_only=True), or the opcode read where
    weights_only refuses the file or torch is not installed."""
    try:
        with zipfile.ZipFile(source) as z:
            bad = z.testzip()
            if bad is not None:
                return FileCheck(rel, "zip CRCs", f"zip member {bad} fails its CRC")
            opcodes, problem = _scan_torch_zip(z)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return FileCheck(rel, "zip CRCs", f"not a readable torch.save zip: {e}")
    if problem:
        return FileCheck(rel, "zip CRCs and pickle opcodes read, not executed", problem)
    if not has("torch"):
        return FileCheck(
            rel,
            f"zip CRCs; pickle opcodes read, not executed: {opcodes}; "
            "torch.load(weights_only=True) not run: torch is not installed on this worker",
            ran=False,
        )
    import torch

    if not isinstance(source, Path):
        source.seek(0)
    try:
        if isinstance(source, Path):
            torch.load(source, weights_only=True, map_location="cpu", mmap=True)
        else:
            torch.load(source, weights_only=True, map_location="cpu")
    except Exception as e:
        if _is_weights_only_refusal(e):
            return FileCheck(
                rel,
                f"zip CRCs; torch.load(weights_only=True): {_refused_name(e)}, so its pickle opcodes were read, "
                f"not executed: {opcodes}",
            )
        return FileCheck(rel, "zip CRCs; torch.load(weights_only=True)", f"torch.load(weights_only=True) fails: {e}")
    return FileCheck(rel, "zip CRCs; torch.load(weights_only=True)")
