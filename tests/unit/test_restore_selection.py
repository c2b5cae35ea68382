"""A partial restore (`restore --only/--exclude`, ckptvault/restore/selection.py and the layouts' split in
ckptvault/formats/parts.py): each layout's files classed from their names; a layout that keeps model and
optimizer in one file refused naming it; and, on the in-memory store through the restore's own two halves,
only the selected objects are planned and fetched, the marker file says what was left out, and the
catalog keeps the save's own size; and the catalog records each save's model and optimizer bytes from
its manifest alone (what `ls --json` shows), where the layout tells them."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from ckptvault.catalog import Catalog
from ckptvault.catalog import events as events_lib
from ckptvault.checkpoint.manifest import Manifest, checkpoint_prefix
from ckptvault.config import Config, SourceConfig, StoreConfig
from ckptvault.formats.parts import Part, classify
from ckptvault.ingest import steps
from ckptvault.restore import copies
from ckptvault.restore.complete import complete
from ckptvault.restore.copies import Copy
from ckptvault.restore.prepare import Request, prepare
from ckptvault.restore.resolve import RestoreError
from ckptvault.restore.selection import MARKER, Selection, SelectionError, parse_selection, select
from ckptvault.store import TransferConfig
from ckptvault.store.manifest_load import load_manifest
from ckptvault.store.memory import MemoryStore
from ckptvault.transfer.submitter import Threads
from ckptvault_cli.synthetic import write_checkpoint

MiB = 2**20
PREFIX = "t"


def _parts(fmt: str, paths: list[str]) -> dict[str, str]:
    return {c.path: c.part.value for c in classify(fmt, paths)}


def test_hf_weights_config_and_tokenizer_are_the_model_the_trainer_state_is_not() -> None:
    got = _parts("hf", ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                        "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json", "optimizer.pt", "scheduler.pt", "rng_state.pth", "rng_state_3.pth",
                        "trainer_state.json", "training_args.bin", "scaler.pt"])  # fmt: skip
    assert {p for p, part in got.items() if part == "optimizer"} == {
        "optimizer.pt", "scheduler.pt", "rng_state.pth", "rng_state_3.pth", "trainer_state.json",
        "training_args.bin", "scaler.pt",
    }  # fmt: skip
    assert "mixed" not in got.values()


def test_hf_with_deepspeed_or_fsdp_inside_a_checkpoint_dir() -> None:
    got = _parts("hf", ["model.safetensors", "global_step6/mp_rank_00_model_states.pt",
                        "global_step6/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                        "pytorch_model_fsdp_0/__0_0.distcp", "optimizer_0/__0_0.distcp"])  # fmt: skip
    assert got == {
        "model.safetensors": "model", "global_step6/mp_rank_00_model_states.pt": "model",
        "global_step6/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": "optimizer",
        "pytorch_model_fsdp_0/__0_0.distcp": "model", "optimizer_0/__0_0.distcp": "optimizer",
    }  # fmt: skip


def test_deepspeed_zero2_splits_and_zero3_keeps_the_weights_in_the_optimizer_files() -> None:
    zero2 = _parts("deepspeed", ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                 "zero_to_fp32.py"])  # fmt: skip
    assert zero2 == {"mp_rank_00_model_states.pt": "model", "zero_pp_rank_0_mp_rank_00_optim_states.pt": "optimizer",
                     "zero_to_fp32.py": "model"}  # fmt: skip
    zero3 = classify("deepspeed", ["zero_pp_rank_0_mp_rank_00_model_states.pt",
                                   "zero_pp_rank_0_mp_rank_00_optim_states.pt"])  # fmt: skip
    assert [c.part for c in zero3] == [Part.MODEL, Part.MIXED]
    assert "ZeRO-3" in zero3[1].why


def test_megatron_legacy_splits_only_with_the_distributed_optimizer() -> None:
    assert _parts("megatron", ["mp_rank_00/model_optim_rng.pt"]) == {"mp_rank_00/model_optim_rng.pt": "mixed"}
    assert _parts("megatron", ["mp_rank_00/model_optim_rng.pt", "mp_rank_00/distrib_optim.pt"]) == {
        "mp_rank_00/model_optim_rng.pt": "model", "mp_rank_00/distrib_optim.pt": "optimizer",
    }  # fmt: skip
    assert _parts("megatron", [".metadata", "__0_0.distcp", "common.pt"])["__0_0.distcp"] == "mixed"


def test_orbax_items_by_name_and_a_single_item_is_mixed() -> None:
    got = _parts("orbax", ["_CHECKPOINT_METADATA", "params/_METADATA", "opt_state/_METADATA", "metrics/metrics"])
    assert got == {"_CHECKPOINT_METADATA": "model", "params/_METADATA": "model", "opt_state/_METADATA": "optimizer",
                   "metrics/metrics": "optimizer"}  # fmt: skip
    assert _parts("orbax", ["default/_METADATA"]) == {"default/_METADATA": "mixed"}


def test_lightning_dcp_nemo_and_an_unknown_format_cannot_split_by_file() -> None:
    """By file: a .distcp is mixed (restore/tensors.py splits it by tensor; see the DCP tests below)."""
    assert _parts("lightning", ["epoch=0-step=6.ckpt"]) == {"epoch=0-step=6.ckpt": "mixed"}
    assert _parts("dcp", [".metadata", "__0_0.distcp"]) == {".metadata": "model", "__0_0.distcp": "mixed"}
    assert _parts("nemo", ["context/model.yaml", "weights/__0_0.distcp"])["weights/__0_0.distcp"] == "mixed"
    assert _parts("someday", ["x.bin"]) == {"x.bin": "mixed"}


# --- the selection on a save ------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    """Run r: an HF save at step 100 and a Lightning save at step 200, each committed and verified."""
    store = MemoryStore("ckpts", transfer=TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB))
    for run, fmt, step in (("r", "hf", 100), ("l", "lightning", 200)):
        write_checkpoint(tmp_path / run, fmt, step, 2 * MiB, shards=2, seed=1)
        [found] = steps.find_checkpoints(SourceConfig(run=run, path=tmp_path / run, format=fmt,
                                                      settle_seconds=0)).found  # fmt: skip
        entries = [steps.upload_one(store, j, found) for j in steps.plan_upload(store, PREFIX, found)]
        manifest = steps.commit_manifest(store, PREFIX, found, entries)
        Catalog(store, PREFIX).append([events_lib.verified(manifest)])
    return store


CFG = Config(store=StoreConfig(bucket="ckpts", prefix=PREFIX))
MODEL_FILES = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
               "model.safetensors.index.json"]  # fmt: skip


def _prepare(store: MemoryStore, dest: Path, run: str = "r", only: tuple[str, ...] = (), exclude: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    return prepare(CFG, [Copy(copies.PRIMARY, store, PREFIX)], Request(run, str(dest), only=only, exclude=exclude))


def test_only_model_plans_fetches_and_marks_the_part_alone(store: MemoryStore, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    # the optimizer's objects are gone from the bucket: a model restore never reads them
    for name in ("optimizer.pt", "scheduler.pt"):
        store.delete(checkpoint_prefix(PREFIX, "r", 100) + name)
    prepared = _prepare(store, dest, only=("model",))
    chosen = prepared.chosen
    assert chosen.selected is not None
    assert sorted(p.path for p in chosen.ordered[0].plans) == MODEL_FILES
    assert chosen.estimate.objects == len(MODEL_FILES)
    whole = chosen.estimate.whole
    assert whole is not None and whole.objects == 7 and whole.bytes > chosen.estimate.bytes  # two were deleted
    assert f"the whole save: {whole.bytes / 2**30:.2f} GiB in 7 objects" in chosen.estimate.report()
    with Threads(workers=2) as submit:
        result = complete(submit, CFG, prepared.catalog, chosen, tier="Standard", wait_s=0, force=False,
                          secret=None, started=0.0)  # fmt: skip
    assert result.status == "restored" and result.files == len(MODEL_FILES)
    restored = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert restored == sorted([MARKER] + [f"checkpoint-100/{p}" for p in MODEL_FILES])
    marker = json.loads((dest / MARKER).read_text())
    assert marker["partial"] is True and marker["only"] == ["model"]
    assert sorted(marker["left_out"]) == ["optimizer.pt", "rng_state.pth", "scheduler.pt", "trainer_state.json",
                                          "training_args.bin"]  # fmt: skip
    assert result.as_dict()["partial"] is True and result.as_dict()["selection"]["files"] == len(MODEL_FILES)
    # the catalog keeps the save's size; the restored event's detail says the part
    assert prepared.catalog is not None
    state = next(s for s in prepared.catalog.current("r") if s.step == 100)
    assert state.files == 9 and state.bytes == marker["of_bytes"] > marker["bytes"]
    restored_event = [e for e in prepared.catalog.events("r") if e.event == "restored"][-1]
    assert json.loads(restored_event.detail)["partial"]["bytes"] == marker["bytes"]


def test_globs_union_and_exclude(store: MemoryStore, tmp_path: Path) -> None:
    chosen = _prepare(store, tmp_path / "d", only=("*.json", "optimizer"), exclude=("rng_state*",)).chosen
    assert chosen.selected is not None
    assert sorted(f.path for f in chosen.selected.files) == [
        "config.json", "model.safetensors.index.json", "optimizer.pt", "scheduler.pt", "trainer_state.json",
        "training_args.bin",
    ]  # fmt: skip
    chosen = _prepare(store, tmp_path / "d", exclude=("*.safetensors",)).chosen
    assert chosen.selected is not None and len(chosen.selected.files) == 7
    # a selection of every file is a whole restore: no marker, not said to be partial
    chosen = _prepare(store, tmp_path / "d", only=("model", "optimizer")).chosen
    assert chosen.selected is None and chosen.estimate.whole is None and len(chosen.ordered[0].plans) == 9


def test_what_cannot_be_served_is_refused_naming_the_file_and_why(store: MemoryStore, tmp_path: Path) -> None:
    with pytest.raises(SelectionError, match=r"'lightning' checkpoint whose epoch=0-step=200.ckpt holds both: "
                       r"Lightning's .ckpt holds state_dict and optimizer_states"):  # fmt: skip
        _prepare(store, tmp_path / "d", run="l", only=("model",))
    with pytest.raises(SelectionError, match=r"--only \*.bin\.gz: no file of r step 100 matches.*config.json"):
        _prepare(store, tmp_path / "d", only=("*.bin.gz",))
    with pytest.raises(SelectionError, match=r"leaves no file of r step 100"):
        _prepare(store, tmp_path / "d", only=("config.json",), exclude=("*.json",))
    with pytest.raises(SelectionError, match="--exclude needs a part"):
        parse_selection(None, [" "])
    assert not (tmp_path / "d").exists()


def test_a_pattern_without_a_slash_also_matches_a_name_in_a_subdirectory(store: MemoryStore) -> None:
    manifest = _manifest(store)
    got = select(manifest, Selection(only=("model-*",)))
    assert [f.path for f in got.files] == MODEL_FILES[1:3]


def _manifest(store: MemoryStore):  # type: ignore[no-untyped-def]
    from ckptvault.restore.plan import load_manifest

    return load_manifest(store, PREFIX, "r", 100)


def test_the_catalog_records_the_model_and_optimizer_bytes_where_the_layout_tells_them(store: MemoryStore) -> None:
    hf = _manifest(store)
    model = select(hf, Selection(only=("model",))).bytes
    optimizer = select(hf, Selection(only=("optimizer",))).bytes
    assert model > 0 and optimizer > 0 and model + optimizer == hf.total_bytes
    # the verified event's detail, from the manifest's paths and sizes: nothing downloaded
    assert events_lib.parts(hf) == {"model": model, "optimizer": optimizer}
    assert json.loads(events_lib.verified(hf).detail)["parts"] == {"model": model, "optimizer": optimizer}
    from ckptvault.restore.plan import load_manifest

    lightning = load_manifest(store, PREFIX, "l", 200)
    assert events_lib.parts(lightning) is None  # the .ckpt holds both: the layout cannot tell
    assert "parts" not in json.loads(events_lib.verified(lightning).detail)
    # the fold, and `ls --json`'s record of it
    cat = Catalog(store, PREFIX)
    (h,) = cat.current("r")
    (li,) = cat.current("l")
    assert (h.model_bytes, h.optimizer_bytes, li.model_bytes, li.optimizer_bytes) == (model, optimizer, None, None)
    from ckptvault.catalog.listing import as_record

    assert {k: as_record(h)[k] for k in ("bytes", "model_bytes", "optimizer_bytes")} == {
        "bytes": hf.total_bytes, "model_bytes": model, "optimizer_bytes": optimizer,
    }  # fmt: skip
    assert (as_record(li)["model_bytes"], as_record(li)["optimizer_bytes"]) == (None, None)
    # a catalog rebuilt from the manifests says the same
    rebuilt = {(e.run, e.step): json.loads(e.detail) for e in cat.rebuild_from_manifests() if e.event == "verified"}
    assert rebuilt[("r", 100)]["parts"] == {"model": model, "optimizer": optimizer}
    assert "parts" not in rebuilt[("l", 200)]


# --- tensor level: torch DCP's .distcp files (ckptvault/formats/dcp_tensors.py, ckptvault/restore/tensors.py) ----


def test_dcp_names_are_classed_by_the_frameworks_training_keys() -> None:
    from ckptvault.formats.dcp_tensors import coalesce, key_matches, part_of

    model = [
        "model.0.weight",
        "tok_embeddings.weight",
        "layers.0.attention.wq.weight",  # torchtitan: flattened
        "decoder.layers.self_attention.linear_proj._extra_state/shard_0_1",
        "module.decoder.final_norm.weight",
    ]
    training = ["optimizer.state.layers.0.exp_avg", "optimizer.param_groups.0.lr", "lr_scheduler.last_epoch",
                "dataloader.dp_rank_0", "train_state.step", "rng_state/shard_0.0_1.1",
                "optimizer.distributed.dp_group_idx_0.param_state"]  # fmt: skip
    assert {part_of(k) for k in model} == {"model"} and {part_of(k) for k in training} == {"optimizer"}
    assert key_matches("model.0", "model.0.weight") and key_matches("model.0", "model.0")
    assert not key_matches("model.0", "model.01.weight") and not key_matches("model.0.", "model.0")
    assert coalesce([(10, 5), (0, 10), (30, 1), (14, 6), (40, 0)]) == [(0, 20), (30, 1)]


def _dcp_run(tmp_path: Path, store: MemoryStore, width: int = 256) -> tuple[Path, dict[str, object]]:
    """Run d: a torch DCP save (model and its AdamW moments in one .distcp) at step 6, ingested."""
    import torch

    from tests.helpers import dcp_save

    torch.manual_seed(0)
    model = {"0.weight": torch.randn(width, width), "0.bias": torch.randn(width)}
    optim = {"state": {k: {"exp_avg": torch.randn_like(v), "exp_avg_sq": torch.rand_like(v)} for k, v in model.items()},
             "param_groups": [{"lr": 1e-3}]}  # fmt: skip
    ckpt = tmp_path / "d" / "step-6"
    dcp_save(ckpt, {"model": model, "optimizer": optim, "train_state": {"step": 6}})
    [found] = steps.find_checkpoints(SourceConfig(run="d", path=tmp_path / "d", format="dcp",
                                                  settle_seconds=0)).found  # fmt: skip
    entries = [steps.upload_one(store, j, found) for j in steps.plan_upload(store, PREFIX, found)]
    steps.write_blocks(store, PREFIX, found, entries)  # as the ingest pass does: none under 8 MiB
    Catalog(store, PREFIX).append([events_lib.verified(steps.commit_manifest(store, PREFIX, found, entries))])
    return ckpt, {"model": model, "optimizer": optim}


def test_only_model_of_a_dcp_save_writes_the_model_ranges_alone(store: MemoryStore, tmp_path: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    ckpt, saved = _dcp_run(tmp_path, store)
    dest = tmp_path / "dest"
    prepared = _prepare(store, dest, run="d", only=("model",))
    sel = prepared.chosen.selected
    assert sel is not None and sel.by_tensor == ("__0_0.distcp",) and sel.tensors is not None
    assert (sel.tensors.tensors, sel.tensors.of_tensors, sel.tensors.parts) == (2, 6, ("model",))
    [tf] = sel.tensors.files
    assert len(tf.ranges) == 1 and 0 < tf.bytes < tf.size / 2  # the two model tensors, adjacent: one range
    with Threads(workers=2) as submit:
        result = complete(submit, CFG, prepared.catalog, prepared.chosen, tier="Standard", wait_s=0, force=False,
                          secret=None, started=0.0)  # fmt: skip
    assert result.status == "restored"
    got = dest / "step-6" / "__0_0.distcp"
    original = (ckpt / "__0_0.distcp").read_bytes()
    data = got.read_bytes()
    assert (
        len(data) == len(original) and (dest / "step-6" / ".metadata").read_bytes() == (ckpt / ".metadata").read_bytes()
    )
    ((off, n),) = tf.ranges
    assert data[off : off + n] == original[off : off + n] and data[:off].count(0) == off  # the rest: holes
    loaded = {"model": {k: torch.zeros_like(v) for k, v in saved["model"].items()}}  # type: ignore[attr-defined]
    dcp.load(loaded, checkpoint_id=str(dest / "step-6"), no_dist=True)
    assert all(torch.equal(loaded["model"][k], v) for k, v in saved["model"].items())  # type: ignore[attr-defined]
    marker = json.loads((dest / MARKER).read_text())
    assert marker["tensors"]["files"][0]["read_bytes"] == len(original) and marker["by_tensor"] == ["__0_0.distcp"]
    assert marker["bytes"] == tf.bytes + len((ckpt / ".metadata").read_bytes())


def test_a_dcp_range_restore_checks_the_whole_objects_crc32c(store: MemoryStore, tmp_path: Path) -> None:
    _dcp_run(tmp_path, store)
    key = checkpoint_prefix(PREFIX, "d", 6) + "__0_0.distcp"
    junk = bytearray(store.get_bytes(key))
    junk[-10] ^= 0xFF  # in the optimizer's bytes, which are not written: the read still fails the CRC32C
    store.put_bytes(key, bytes(junk))
    dest = tmp_path / "dest"
    prepared = _prepare(store, dest, run="d", only=("model",))
    with Threads(workers=2) as submit, pytest.raises(Exception, match=r"__0_0.distcp.*CRC32C mismatch"):
        complete(submit, CFG, prepared.catalog, prepared.chosen, tier="Standard", wait_s=0, force=False,
                 secret=None, started=0.0)  # fmt: skip
    assert not dest.exists()


def test_with_block_crc32cs_only_the_blocks_around_the_model_are_read_and_each_is_checked(
    store: MemoryStore, tmp_path: Path
) -> None:
    """A .distcp over the blocks' threshold (~12 MiB: a 4 MiB weight and its two moments) has block CRC32Cs
    from its ingest: `--only model` reads the blocks around the model's range alone, so a damaged byte in
    the optimizer's last block is never read, and one in the model's blocks fails naming the block."""
    import torch
    import torch.distributed.checkpoint as dcp

    _, saved = _dcp_run(tmp_path, store, width=1024)
    key = checkpoint_prefix(PREFIX, "d", 6) + "__0_0.distcp"
    original = store.get_bytes(key)
    junk = bytearray(original)
    junk[-10] ^= 0xFF  # the optimizer's, in the last block
    store.put_bytes(key, bytes(junk))
    dest = tmp_path / "dest"
    prepared = _prepare(store, dest, run="d", only=("model",))
    [tf] = prepared.chosen.selected.tensors.files  # type: ignore[union-attr]
    assert tf.blocks is not None and len(tf.blocks.crcs) == 4, tf  # a little over 12 MiB
    assert tf.read_bytes == 2 * 4 * MiB < tf.size  # the model's ~4 MiB straddles blocks 0 and 1
    with Threads(workers=2) as submit:
        result = complete(submit, CFG, prepared.catalog, prepared.chosen, tier="Standard", wait_s=0, force=False,
                          secret=None, started=0.0)  # fmt: skip
    assert result.status == "restored"
    loaded = {"model": {k: torch.zeros_like(v) for k, v in saved["model"].items()}}  # type: ignore[attr-defined]
    dcp.load(loaded, checkpoint_id=str(dest / "step-6"), no_dist=True)
    assert all(torch.equal(loaded["model"][k], v) for k, v in saved["model"].items())  # type: ignore[attr-defined]
    marker = json.loads((dest / MARKER).read_text())
    assert marker["tensors"]["files"][0]["verified"] == "the blocks around its ranges read, each block's CRC32C checked"
    ((off, n),) = tf.ranges
    junk = bytearray(original)
    junk[off + n // 2] ^= 0xFF  # inside the model's range now
    store.put_bytes(key, bytes(junk))
    again = tmp_path / "again"
    prepared = _prepare(store, again, run="d", only=("model",))
    with Threads(workers=2) as submit, pytest.raises(Exception, match=r"__0_0.distcp: block [01] \(bytes"):
        complete(submit, CFG, prepared.catalog, prepared.chosen, tier="Standard", wait_s=0, force=False,
                 secret=None, started=0.0)  # fmt: skip
    assert not again.exists()


def test_only_keys_needs_a_dcp_save_and_an_item_it_names(store: MemoryStore, tmp_path: Path) -> None:
    _dcp_run(tmp_path, store)
    with pytest.raises(SelectionError, match=r"--only-keys selects items inside torch DCP .distcp files; r step "
                       r"100 is a 'hf' checkpoint"):  # fmt: skip
        prepare(CFG, [Copy(copies.PRIMARY, store, PREFIX)], Request("r", str(tmp_path / "x"), only_keys=("model",)))
    with pytest.raises(SelectionError, match=r"no item of keys model.9 in"):
        prepare(CFG, [Copy(copies.PRIMARY, store, PREFIX)], Request("d", str(tmp_path / "x"), only_keys=("model.9",)))
    with pytest.raises(SelectionError, match="--only-keys needs a key prefix"):
        parse_selection(None, None, ["."])
    got = prepare(CFG, [Copy(copies.PRIMARY, store, PREFIX)],
                  Request("d", str(tmp_path / "x"), only_keys=("optimizer.state.0.bias",))).chosen.selected  # fmt: skip
    assert got is not None and got.tensors is not None and got.tensors.tensors == 2  # exp_avg, exp_avg_sq
    assert not (tmp_path / "x").exists()


def test_the_fast_metadata_reader_reads_what_the_opcode_reader_does(tmp_path: Path) -> None:
    """Above MAX_OPCODES a .metadata is read by the C unpickler with stand-ins (bench/README.md has its speed)."""
    import torch

    from ckptvault.formats import _pickle
    from ckptvault.formats import dcp_tensors as dt
    from tests.helpers import dcp_save

    state = {f"layers.{i}.w": torch.zeros(2) for i in range(300)}
    dcp_save(tmp_path / "c", {"model": state, "optimizer": {"state": {k: {"m": v} for k, v in state.items()}}})
    meta = tmp_path / "c" / ".metadata"
    slow = dt.chunks(meta)
    assert len(slow) == 600 and {c.fqn for c in slow if dt.part_of(c.fqn) == "model"} == {
        f"model.layers.{i}.w" for i in range(300)
    }
    old = dt.MAX_OPCODES
    try:
        dt.MAX_OPCODES = 0  # every file over it: the fast reader
        assert dt.chunks(meta) == slow
    finally:
        dt.MAX_OPCODES = old
    raw = meta.read_bytes()
    fast = _pickle.read_fast(raw)
    assert isinstance(fast, _pickle.Obj) and fast.name == "torch.distributed.checkpoint.metadata.Metadata"
    with pytest.raises(ValueError, match="not a pickle"):
        _pickle.read_fast(raw[: len(raw) // 2])
    # nothing a pickle names is imported or called: a stand-in records the call
    evil = pickle.dumps(Path("x"))  # REDUCE pathlib.PosixPath
    got = _pickle.read_fast(evil)
    assert isinstance(got, _pickle.Obj) and got.name == "pathlib.PosixPath" and got.args == ("x",)


def test_the_issues_forms_of_only_and_only_keys_parse_as_typed() -> None:
    """`--only model|optimizer|PATTERN...` and `--only-keys PREFIX...`: several words after one flag, or the
    flag repeated, their union in order; RUN before them (they take every word after them)."""
    from ckptvault_cli.parser import build_parser

    p = build_parser()
    a = p.parse_args(["restore", "r", "--only", "model", "*.json", "--only", "x", "--only-keys", "model.0",
                      "model.1", "--only-keys", "model.2", "--exclude", "*.bin", "--dest", "d"])  # fmt: skip
    assert (a.run, a.only, a.only_keys, a.exclude) == ("r", ["model", "*.json", "x"], ["model.0", "model.1", "model.2"],
                                                       ["*.bin"])  # fmt: skip
    with pytest.raises(SystemExit) as e:
        p.parse_args(["restore", "--only", "model", "r", "--dest", "d"])  # RUN taken as a pattern: RUN missing
    assert e.value.code == 2


def test_a_distcp_holding_none_of_the_chosen_items_is_neither_thawed_nor_read(tmp_path: Path) -> None:
    """A DCP save written a file per item (FileSystemWriter(single_file_per_rank=False)), every object in
    GLACIER: `--only model` thaws the .metadata first (which ranges it needs is read there), then the
    loader's files and the .distcp files holding model tensors alone (the estimate counts only those);
    the optimizer's files are created empty, never thawed nor read, and `dcp.load` of the model reads the
    saved tensors."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    now = [1000.0]
    store = MemoryStore("ckpts", transfer=TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB),
                        restore_seconds=60, clock=lambda: now[0])  # fmt: skip
    torch.manual_seed(0)
    model = {"0.weight": torch.randn(64, 64), "0.bias": torch.randn(64)}
    optim = {"state": {k: {"exp_avg": torch.randn_like(v)} for k, v in model.items()}, "param_groups": [{"lr": 1e-3}]}
    ckpt = tmp_path / "d" / "step-6"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # one process, no process group
        writer = FileSystemWriter(str(ckpt), single_file_per_rank=False)
        dcp.save({"model": model, "optimizer": optim}, storage_writer=writer)
    assert len(list(ckpt.glob("*.distcp"))) >= 4, "torch wrote its items into one file"
    [found] = steps.find_checkpoints(SourceConfig(run="d", path=tmp_path / "d", format="dcp",
                                                  settle_seconds=0)).found  # fmt: skip
    entries = [steps.upload_one(store, j, found) for j in steps.plan_upload(store, PREFIX, found)]
    manifest = steps.commit_manifest(store, PREFIX, found, entries)
    Catalog(store, PREFIX).append([events_lib.verified(manifest)])
    base = checkpoint_prefix(PREFIX, "d", 6)
    for f in manifest.files:
        store.copy_storage_class(base + f.path, "GLACIER", f.size)

    def thawing() -> set[str]:
        heads = {f.path: store.head(base + f.path) for f in manifest.files}
        return {p for p, h in heads.items() if h is not None and h.restore is not None}

    dest = tmp_path / "dest"
    prepared = _prepare(store, dest, run="d", only=("model",))
    assert [p.path for p in prepared.chosen.awaiting] == [".metadata"]
    with Threads(workers=1) as submit, pytest.raises(RestoreError, match="node"):  # refused before any thaw
        complete(submit, CFG, prepared.catalog, prepared.chosen, tier="Standard", wait_s=0, force=False,
                 secret=None, started=0.0, node_local=str(dest))  # fmt: skip
    assert thawing() == set()
    assert prepared.chosen.selected is not None
    assert "is read from their .metadata once thawed" in prepared.chosen.selected.describe()
    with Threads(workers=2) as submit:
        first = complete(submit, CFG, prepared.catalog, prepared.chosen, tier="Standard", wait_s=0, force=False,
                         secret=None, started=0.0)  # fmt: skip
        assert first.status == "thawing" and ".metadata objects still frozen" in first.message, first
        assert thawing() == {".metadata"}
        now[0] += 61  # the .metadata is readable: the same call reads it and thaws what it names
        second = complete(submit, CFG, prepared.catalog, prepared.chosen, tier="Standard", wait_s=0, force=False,
                          secret=None, started=0.0)  # fmt: skip
        assert second.status == "thawing", second
        sel = _prepare(store, dest, run="d", only=("model",)).chosen.selected
        assert sel is not None and sel.tensors is not None
        unread = {f.path for f in sel.tensors.files if not f.ranges}
        assert unread and len(unread) < len(sel.tensors.files), sel.tensors.files
        assert thawing() == {f.path for f in manifest.files} - unread
        assert second.frozen == len(manifest.files) - len(unread) - 1, second  # all but the thawed .metadata
        assert second.estimate_detail["frozen_objects"] == second.frozen, second.estimate_detail
        now[0] += 61
        again = _prepare(store, dest, run="d", only=("model",))
        assert again.chosen.estimate.frozen == 0 and not again.chosen.awaiting, again.chosen.estimate
        done = complete(submit, CFG, again.catalog, again.chosen, tier="Standard", wait_s=0, force=False,
                        secret=None, started=0.0)  # fmt: skip
    assert done.status == "restored", done
    for path in unread:  # created at its size, all holes: nothing of it was read
        data = (dest / "step-6" / path).read_bytes()
        assert len(data) == (ckpt / path).stat().st_size and data.count(0) == len(data)
    loaded = {"model": {k: torch.zeros_like(v) for k, v in model.items()}}
    dcp.load(loaded, checkpoint_id=str(dest / "step-6"), no_dist=True)
    assert all(torch.equal(loaded["model"][k], v) for k, v in model.items())


def test_a_dcp_saves_model_and_optimizer_bytes_are_read_from_its_local_metadata(
    store: MemoryStore, tmp_path: Path
) -> None:
    """The manifest's paths cannot split a .distcp (it holds both): the ingest splits it by its items'
    lengths from the .metadata on disk (`ls --json`'s model_bytes/optimizer_bytes), the same items
    `restore --only model` takes; a .distcp whose .metadata cannot be read leaves the split unknown."""
    from ckptvault.formats.dcp_tensors import chunks, part_bytes
    from ckptvault.ingest.ingest_pass import local_parts

    ckpt, _ = _dcp_run(tmp_path, store)
    [found] = steps.find_checkpoints(SourceConfig(run="d", path=tmp_path / "d", format="dcp",
                                                  settle_seconds=0)).found  # fmt: skip
    split = local_parts(found, store_manifest(store, "d", 6))
    assert split is not None and sum(split.values()) == found.total_bytes, split
    model = sum(c.length for c in chunks(ckpt / ".metadata") if c.fqn.startswith("model."))
    assert split["model"] == model + (ckpt / ".metadata").stat().st_size, split  # the loader's file is the model's
    assert 0 < split["model"] < split["optimizer"], split  # AdamW's two moments of each tensor
    event = events_lib.verified(store_manifest(store, "d", 6), split=split)
    assert json.loads(event.detail)["parts"] == split
    files = [(f.rel, f.size) for f in found.files]
    for junk in (b"not a pickle", b"\x80\x04s."):  # the second pops an empty stack
        (ckpt / ".metadata").write_bytes(junk)
        assert part_bytes(ckpt, "dcp", files) is None
        assert local_parts(found, store_manifest(store, "d", 6)) is None
    assert part_bytes(ckpt, "hf", [("config.json", 10)]) is None  # no .distcp: the manifest's paths tell


def store_manifest(store: MemoryStore, run: str, step: int) -> Manifest:
    return load_manifest(store, PREFIX, run, step, 1)
