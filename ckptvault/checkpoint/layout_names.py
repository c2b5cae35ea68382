"""The checkpoint layouts' names, the config's `format` values besides "auto", in the order the
config's error lists them: apart from `ckptvault.formats`, whose layouts (and their pickle and
tensor readers) a command that only reads the config need not import (`restore` reads the config
before its first byte: docs/performance.md, "Where a command's time goes"). `ckptvault.formats`
refuses to import when its `LAYOUTS` name other layouts than these."""

from __future__ import annotations

LAYOUT_NAMES: tuple[str, ...] = ("hf", "dcp", "megatron", "deepspeed", "orbax", "lightning", "nemo")
