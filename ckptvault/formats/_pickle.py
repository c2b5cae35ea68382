"""Values read out of a `torch.save` pickle by its opcodes alone (private to `ckptvault.formats`).

`read` walks `pickletools.genops` and keeps a symbolic copy of what the pickle would build: dicts,
lists, tuples and scalars as themselves, a class or function it names as `Global`, a call
(REDUCE/NEWOBJ) as `Call`, a torch storage reference as `PersId`; BUILD's state (a dataclass's fields,
e.g. DCP's `.metadata`) is kept on its `Call` as `state`. Nothing is imported, constructed or called,
so a checkpoint from anywhere is safe to read this way; what cannot be followed (sets, extension
codes) is left out or kept as `None`. A tensor is a `Call` of
`torch._utils._rebuild_tensor_v2` whose first argument is the `PersId` of its storage (torch/serialization.py
`_save`, `persistent_id`: `("storage", <storage class>, key, location, numel)`, the bytes in the
zip's `<archive>/data/<key>`), which `scalar` reads for a one-element tensor: the checkpoint's few
bytes of a score, never its weights.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
import zipfile
from dataclasses import dataclass
from typing import IO, Any


@dataclass(frozen=True)
class Global:
    name: str  # module.qualname


@dataclass(eq=False)  # compared and hashed by identity: distinct objects of one class are distinct dict keys
class Call:
    func: Any
    args: Any
    state: Any = None  # what BUILD set on the object (pickle's __setstate__ argument), if anything


@dataclass(frozen=True)
class PersId:
    pid: Any


_MARK = object()
_SCALARS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
            "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
            "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"}  # fmt: skip
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}


def _to_mark(stack: list[Any]) -> list[Any]:
    k = len(stack) - 1 - stack[::-1].index(_MARK)  # ValueError: no mark, a garbled pickle
    items = stack[k + 1 :]
    del stack[k:]
    return items


# Keys kept in a symbolic dict: hashing any of these is cheap. A tuple key is left out: a hostile pickle
# can nest one 300,000 deep (the hash overflows the C stack: SIGSEGV, which no except catches) or share
# it through the memo (exponential time), in a file far under any size limit.
_KEYS = (str, int, float, bytes, bool, type(None), Global, Call)


def _set(target: Any, pairs: list[tuple[Any, Any]]) -> None:
    if isinstance(target, dict):
        for k, v in pairs:
            if isinstance(k, _KEYS):
                target[k] = v


def read(stream: IO[bytes] | bytes, persids: list[PersId] | None = None) -> Any:
    """The symbolic value of the pickle in `stream`; ValueError if it is truncated or garbled.
    `persids`, when given, gains every persistent id as it is read, also those inside values the
    symbolic copy cannot keep (the items of an OrderedDict, which is a Call here)."""
    try:
        return _read(stream, persids)
    except (IndexError, KeyError, TypeError, AttributeError) as e:  # an opcode its stack or memo cannot serve
        raise ValueError(f"a garbled pickle ({type(e).__name__}: {e})") from None


def _read(stream: IO[bytes] | bytes, persids: list[PersId] | None) -> Any:
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    for op, arg, pos in pickletools.genops(stream):
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            if len(stack) != 1:
                raise ValueError(f"STOP at byte {pos} with {len(stack)} items on the stack")
            return stack[0]
        if name == "MARK":
            stack.append(_MARK)
        elif name in _SCALARS:
            stack.append(arg)
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name])
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name == "DICT":
            items = _to_mark(stack)
            d: dict[Any, Any] = {}
            _set(d, list(zip(items[::2], items[1::2], strict=False)))
            stack.append(d)
        elif name in ("LIST", "TUPLE"):
            items = _to_mark(stack)
            stack.append(items if name == "LIST" else tuple(items))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items, stack[-n:] = stack[-n:], []
            stack.append(tuple(items))
        elif name == "SETITEM":
            v, k = stack.pop(), stack.pop()
            _set(stack[-1], [(k, v)])
        elif name == "SETITEMS":
            items = _to_mark(stack)
            _set(stack[-1], list(zip(items[::2], items[1::2], strict=False)))
        elif name == "APPEND":
            v = stack.pop()
            if isinstance(stack[-1], list):
                stack[-1].append(v)
        elif name == "APPENDS":
            items = _to_mark(stack)
            if isinstance(stack[-1], list):
                stack[-1].extend(items)
        elif name == "GLOBAL":
            stack.append(Global(str(arg).replace(" ", ".", 1)))
        elif name == "STACK_GLOBAL":
            qual, mod = stack.pop(), stack.pop()
            # str() of anything else could be exponential (memo-shared lists): only names make a Global
            stack.append(Global(f"{mod}.{qual}") if isinstance(mod, str) and isinstance(qual, str) else None)
        elif name in ("REDUCE", "NEWOBJ"):
            args, func = stack.pop(), stack.pop()
            stack.append(Call(func, args))
        elif name == "BUILD":
            state = stack.pop()
            if stack and isinstance(stack[-1], Call):  # the memo holds this same Call: later GETs see the state
                stack[-1].state = state
        elif name in ("BINPERSID", "PERSID"):
            stack.append(PersId(stack.pop() if name == "BINPERSID" else arg))
            if persids is not None:
                persids.append(stack[-1])
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg or 0)] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if int(arg or 0) not in memo:
                raise ValueError(f"{name} at byte {pos} reads memo slot {arg}, never written")
            stack.append(memo[int(arg or 0)])
        elif name == "POP":
            stack.pop()
        elif name == "POP_MARK":
            _to_mark(stack)
        elif name == "DUP":
            stack.append(stack[-1])
        else:  # anything else: its stack effect, with an unknown value
            if pickletools.markobject in op.stack_before:
                _to_mark(stack)
                below = op.stack_before.index(pickletools.markobject)
            else:
                below = len(op.stack_before)
            if below:
                del stack[-below:]
            stack.extend([None] * len(op.stack_after))
    raise ValueError("no STOP opcode: the pickle is truncated")


class Obj:
    """`read_fast`'s object of a class a pickle names (a subclass per name, `name` its module.qualname):
    constructed (NEWOBJ) and given its BUILD state (`__dict__`; a state that is not a dict in
    `__dict__["__state__"]`) by the C unpickler itself, mostly with no Python call per object: what makes
    `read_fast` fast. A call (REDUCE) keeps its arguments in `args`."""

    name = ""

    def __init__(self, *args: Any) -> None:
        self.args = args


# Named classes read as the builtin they are: torch.Size is a tuple subclass, OrderedDict a dict
_AS_BUILTIN: dict[str, type] = {"torch.Size": tuple, "collections.OrderedDict": dict}
# Classes whose BUILD state is neither a dict nor (dict, slots), which only a __setstate__ takes (a Python
# call per object): TensorProperties pickles (dtype, layout, requires_grad, memory_format, pin_memory)
_TUPLE_STATE = frozenset({"torch.distributed.checkpoint.metadata.TensorProperties"})


def _setstate(self: Obj, state: Any) -> None:
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict | None):
        self.__dict__.update(state[0] or {})
        if isinstance(state[1], dict):
            self.__dict__.update(state[1])
    elif isinstance(state, dict):
        self.__dict__.update(state)
    else:
        self.__dict__["__state__"] = state


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], setstate_all: bool) -> None:
        super().__init__(file)
        self._named: dict[str, type] = {}
        self._all = setstate_all

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full not in self._named:
            ns: dict[str, Any] = {"name": full, "__slots__": ()}
            if self._all or full in _TUPLE_STATE:
                ns["__setstate__"] = _setstate
            self._named[full] = _AS_BUILTIN.get(full) or type("Obj", (Obj,), ns)
        return self._named[full]

    def persistent_load(self, pid: Any) -> Any:
        return PersId(pid)


def read_fast(data: bytes) -> Any:
    """A pickle of dicts, lists, tuples, scalars and pickled classes (DCP's `.metadata`), ~2x faster than
    `read` (bench/README.md): Python's C unpickler, with every class or function the pickle names
    replaced by a subclass of `Obj` (`find_class`), so nothing named is imported, constructed or run.
    Unlike `read`, containers are built for real (a tuple key is hashed: a key nested deep enough
    overflows the C stack), so the caller runs it in a child process (formats/dcp_tensors.py).
    ValueError on what it cannot build (a garbled pickle, a set of objects)."""
    try:
        try:
            return _Unpickler(io.BytesIO(data), setstate_all=False).load()
        except pickle.UnpicklingError:  # a class with another state than a dict: every one through _setstate
            return _Unpickler(io.BytesIO(data), setstate_all=True).load()
    except RecursionError as e:
        raise ValueError(f"the pickle nests too deep ({e})") from None
    except (pickle.UnpicklingError, EOFError, TypeError, AttributeError, IndexError, KeyError, ValueError) as e:
        raise ValueError(f"not a pickle of plain values and classes ({type(e).__name__}: {e})") from None


_DTYPES = {"torch.FloatStorage": "<f", "torch.DoubleStorage": "<d", "torch.HalfStorage": "<e",
           "torch.BFloat16Storage": "bf16", "torch.LongStorage": "<q", "torch.IntStorage": "<i"}  # fmt: skip
REBUILD = "torch._utils._rebuild_tensor_v2"


def scalar(z: zipfile.ZipFile, prefix: str, value: Any) -> float | None:
    """A number the checkpoint stores as `value`: a plain int or float, or a one-element tensor whose
    storage bytes are read from the zip (`prefix` is the archive's directory, e.g. 'archive/')."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not (isinstance(value, Call) and value.func == Global(REBUILD) and isinstance(value.args, tuple)):
        return None
    args = value.args
    if len(args) < 3 or not isinstance(args[0], PersId) or not isinstance(args[1], int):
        return None
    pid, offset, size = args[0].pid, args[1], args[2]
    if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[1], Global)):
        return None
    if not isinstance(size, tuple) or any(s != 1 for s in size):  # a 0-dim or all-ones shape: one element
        return None
    fmt = _DTYPES.get(pid[1].name)
    if fmt is None:
        return None
    width = 2 if fmt == "bf16" else struct.calcsize(fmt)
    try:
        with z.open(f"{prefix}data/{pid[2]}") as f:
            raw = f.read((offset + 1) * width)[offset * width :]
    except KeyError:
        return None
    if len(raw) != width:
        return None
    if fmt == "bf16":  # the high half of a float32
        return float(struct.unpack("<f", b"\0\0" + raw)[0])
    return float(struct.unpack(fmt, raw)[0])


# Bytes per element of a torch storage class (`torch.<Name>Storage`); complex ones by their component,
# which is what a byte shuffle should group.
_ELEMENT = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
            "Byte": 1, "Bool": 1, "ComplexDouble": 8, "ComplexFloat": 4, "UInt16": 2, "UInt32": 4, "UInt64": 8,
            "QInt8": 1, "QUInt8": 1, "QInt32": 4}  # fmt: skip


def element_size(storage_class: str) -> int | None:
    """Bytes per element of `torch.FloatStorage` and the like (float8 kinds: 1); None if unknown."""
    name = storage_class.removeprefix("torch.").removesuffix("Storage")
    return 1 if name.startswith("Float8") else _ELEMENT.get(name)


# torch.dtype names as a pickle names them (`GLOBAL torch bfloat16`: torch.dtype.__reduce__) -> bytes per
# element, complex ones by their component as above.
_DTYPE_SIZES = {"float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
                "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1,
                "bool": 1, "complex128": 8, "cdouble": 8, "complex64": 4, "cfloat": 4, "uint16": 2,
                "uint32": 4, "uint64": 8, "qint8": 1, "quint8": 1, "qint32": 4}  # fmt: skip


def dtype_size(dtype: Any) -> int | None:
    """Bytes per element of a pickled torch dtype (`Global("torch.bfloat16")`); None if unknown."""
    if not (isinstance(dtype, Global) and dtype.name.startswith("torch.")):
        return None
    name = dtype.name.removeprefix("torch.")
    return 1 if name.startswith(("float8", "float4")) else _DTYPE_SIZES.get(name)  # float4_e2m1fn_x2: 2 per byte


def storages(z: zipfile.ZipFile, pkl: str) -> list[tuple[str, str]]:
    """(storage class, key) of every storage the torch.save pickle `pkl` in `z` refers to, by its
    opcodes (nothing unpickled); ValueError if the pickle is garbled."""
    pids: list[PersId] = []
    with z.open(pkl) as f:
        read(f, pids)
    out = []
    for p in pids:
        pid = p.pid
        if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[1], Global):
            out.append((pid[1].name, str(pid[2])))
    return out


class _Dict:
    """A dict under construction in `top_level`'s walk: only its identity matters (is it the top level?)."""


_TOP_SCALARS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4",
                "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}  # fmt: skip


def top_level(stream: IO[bytes] | bytes, keys: frozenset[str]) -> dict[str, int | str]:
    """The int or str values stored under `keys` in the top-level dict of a pickle (a `torch.save`
    checkpoint's dict), by its opcodes alone; a key whose value is anything else, or that is absent,
    is left out. Stops once every key is found. The stack is tracked only as far as needed to tell
    the top-level dict's SETITEM(S) from a nested one's: nothing is built, much cheaper than `read`.
    ValueError (or an error of pickletools) if the pickle is garbled."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    root: _Dict | None = None
    out: dict[str, int | str] = {}
    for op, arg, _ in pickletools.genops(stream):
        name = op.name
        if name == "STOP":
            return out
        if name == "MARK":
            stack.append(_MARK)
            continue
        if name in ("SETITEM", "SETITEMS"):
            if name == "SETITEM":
                pairs = [(stack[-2], stack[-1])] if len(stack) >= 3 else []
                del stack[-2:]
            else:
                items = _to_mark(stack)
                pairs = list(zip(items[::2], items[1::2], strict=False))
            if stack and stack[-1] is root:
                for k, v in pairs:
                    if isinstance(k, str) and k in keys and isinstance(v, int | str) and not isinstance(v, bool):
                        out[k] = v
                if len(out) == len(keys):
                    return out
            continue
        before, after = op.stack_before, op.stack_after
        if pickletools.markobject in before:
            _to_mark(stack)
            below = before.index(pickletools.markobject)
        else:
            below = len(before)
        popped = stack[len(stack) - below :] if below else []
        if below:
            del stack[-below:]
        value: Any = None
        if name == "EMPTY_DICT":
            value = _Dict()
            if root is None and not stack:
                root = value
        elif name in _TOP_SCALARS:
            value = arg
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            value = memo.get(int(arg or 0))
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):  # peeks, leaves the stack as it is
            memo[int(arg or 0)] = stack[-1] if stack else None
            continue
        elif name == "MEMOIZE":
            memo[len(memo)] = value = popped[-1] if popped else None
        stack.extend([value] + [None] * (len(after) - 1) if after else [])
    return out


def zip_pickle(z: zipfile.ZipFile, limit: int) -> str | None:
    """The name of the one `data.pkl` of a `torch.save` zip, or None: none, several, or over `limit`
    bytes (millions of tensors: not walked for a record)."""
    pkls = [n for n in z.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
    if len(pkls) != 1 or z.getinfo(pkls[0]).file_size > limit:
        return None
    return pkls[0]
