"""Security: secrets never leak into output, logs, artifacts or the bucket; TLS is verified by default
(with a CA bundle for on-prem endpoints); server-side encryption is passed through on upload and copy;
the catalog can be rebuilt from the manifests alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.config import StoreConfig, load_config
from ckptvault.store import open_store
from ckptvault.store.s3 import S3Store
from ckptvault.store.s3_client import make_client
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.faultproxy import FaultProxy
from tests.helpers import self_signed_cert, write_config
from tests.reliability.conftest import MiB, all_keys, cli_env, run_cli

SLACK_TOKEN = "xoxb-424242424242-1313131313131-ckvSecretSlackTokenDoNotLeak"
WRONG_SECRET = "ckvWrongSecretKey/DoNotLeak+0123456789abcdef"


def _leaks(text: str, secrets: list[str]) -> list[str]:
    return [s for s in secrets if s in text]


@pytest.mark.slow
def test_secrets_never_in_output_logs_artifacts_or_bucket(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path
) -> None:
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    write_checkpoint(root, "hf", 10, 1 * MiB)
    bad = write_checkpoint(root, "hf", 20, 1 * MiB)
    (bad / "optimizer.pt").write_bytes(b"")  # an invalid checkpoint: the run fails and alerts
    extra = '[notify]\nslack_base_url = "http://127.0.0.1:9/api/"\n'  # Slack is down: its failure is logged too
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")], extra=extra)
    secrets = [seaweedfs.secret_key, SLACK_TOKEN, SLACK_TOKEN.split("-")[-1], WRONG_SECRET]

    # 1. wrong secret key: refused at preflight
    env = cli_env(seaweedfs, AWS_SECRET_ACCESS_KEY=WRONG_SECRET, CKPTVAULT_SLACK_TOKEN=SLACK_TOKEN)
    denied = run_cli(cfg, "ingest", env=env)
    assert denied.returncode == 2 and "denied" in denied.stderr, denied.stderr
    # 2. right credentials, a failing ingest that alerts to an unreachable Slack
    env = cli_env(seaweedfs, CKPTVAULT_SLACK_TOKEN=SLACK_TOKEN)
    failed = run_cli(cfg, "ingest", env=env)
    assert failed.returncode == 1, (failed.stdout + failed.stderr)[-3000:]
    assert "optimizer.pt" in failed.stdout + failed.stderr
    # 3. restore of a step that is not there, and a drill: more failure paths
    missing = run_cli(cfg, "restore", "r", "--step", "999", "--dest", str(tmp_path / "x"), env=env)
    # bad input, found from the catalog before any flow runs: exit 2 naming the steps there are
    assert missing.returncode == 2 and "no verified checkpoint at step 999" in missing.stderr, missing.stderr

    printed = "".join(p.stdout + p.stderr for p in (denied, failed, missing))
    assert not _leaks(printed, secrets), f"secret printed: {_leaks(printed, secrets)}"

    from prefect.client.orchestration import get_client

    def every(read: Any) -> list[Any]:  # the API pages its answers: read them all
        out: list[Any] = []
        while page := read(limit=200, offset=len(out)):
            out.extend(page)
        return out

    with get_client(sync_client=True) as client:
        logs = "\n".join(log.message for log in every(client.read_logs))
        artifacts = json.dumps([a.model_dump(mode="json") for a in every(client.read_artifacts)])
        runs = json.dumps([r.model_dump(mode="json") for r in every(client.read_flow_runs)])
    assert "optimizer.pt" in logs, "the flow's logs were not found: the check would prove nothing"
    for where, text in (("Prefect logs", logs), ("Prefect artifacts", artifacts), ("flow runs/states", runs)):
        assert not _leaks(text, secrets), f"secret in {where}: {_leaks(text, secrets)}"

    s3 = seaweedfs.client()
    stored = b"".join(s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in all_keys(s3, bucket))
    assert not _leaks(stored.decode("latin-1"), secrets), "secret stored in the bucket"
    print(f"\n[secrets] grepped {len(printed)} B printed, {len(logs)} B of logs, {len(artifacts)} B of artifacts, "
          f"{len(stored)} B of bucket objects for {len(secrets)} secrets: none found")  # fmt: skip


def test_tls_verification_is_on_by_default_with_a_ca_bundle_option(tmp_path: Path) -> None:
    def verify(**kw: Any) -> Any:
        client = make_client(StoreConfig(bucket="ckpts", endpoint_url="https://s3.example:443", **kw), 2)
        return client._endpoint.http_session._verify  # type: ignore[attr-defined]

    assert verify() is True
    assert verify(ca_bundle="/etc/ssl/ceph-ca.pem") == "/etc/ssl/ceph-ca.pem"
    assert verify(verify_tls=False) is False


def test_tls_endpoint_with_an_unknown_ca_is_refused_and_the_ca_bundle_fixes_it(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A real HTTPS endpoint (a TLS front on 127.0.0.1 with a self-signed certificate, in front of
    SeaweedFS): refused by default, accepted with [store].ca_bundle."""
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    cert, key = self_signed_cert(tmp_path)
    with FaultProxy(seaweedfs.url, tls=(cert, key)) as front:
        base = f'[store]\nbucket = "{bucket}"\nendpoint_url = "{front.url}"\n'
        cfg = tmp_path / "c.toml"
        cfg.write_text(base)
        assert main(["--config", str(cfg), "ls"]) == 2
        err = capsys.readouterr().err
        assert "SSL" in err or "certificate" in err, err
        assert front.url in err, err
        cfg.write_text(base + f'ca_bundle = "{cert}"\n')
        assert main(["--config", str(cfg), "ls"]) == 0, capsys.readouterr().err
        assert front.total_requests > 0


@pytest.mark.parametrize(
    "sse,kms_key",
    [("AES256", None), ("aws:kms", "arn:aws:kms:us-east-1:123456789012:key/ckptvault-test")],
    ids=["sse-s3", "sse-kms"],
)
def test_sse_passed_through_on_upload_put_and_copy(
    moto_server: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any, sse: str, kms_key: str | None
) -> None:
    s3_env(moto_server)
    bucket = bucket_factory(moto_server)
    cfg = StoreConfig(
        bucket=bucket, endpoint_url=moto_server.url, region=moto_server.region, part_size_mb=5, sse=sse,  # type: ignore[arg-type]
        sse_kms_key_id=kms_key,
    )  # fmt: skip
    store = S3Store(cfg)
    small, big = tmp_path / "small.bin", tmp_path / "big.bin"
    small.write_bytes(b"s" * 1000)
    big.write_bytes(b"b" * (7 * MiB))  # multipart
    store.upload_file(small, "p/small.bin", tags={"run": "r"})
    store.upload_file(big, "p/big.bin", tags={"run": "r"})
    store.put_bytes("p/_MANIFEST.json", b"{}", if_none_match=True)
    store.copy_storage_class("p/small.bin", "STANDARD_IA", 1000)  # a client-mode tier transition
    client = moto_server.client()
    for key in ("p/small.bin", "p/big.bin", "p/_MANIFEST.json"):
        head = client.head_object(Bucket=bucket, Key=key)
        assert head.get("ServerSideEncryption") == sse, f"{key}: {head.get('ServerSideEncryption')}"
        if kms_key:
            assert head.get("SSEKMSKeyId", "").endswith("ckptvault-test"), key
    assert client.head_object(Bucket=bucket, Key="p/small.bin").get("StorageClass") == "STANDARD_IA"


@pytest.mark.slow
def test_catalog_rebuild_from_manifests_matches_the_event_log(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from ckptvault_prefect.flows.ingest import ingest

    s3_env(seaweedfs)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    for s in (10, 20, 30):
        write_checkpoint(root, "hf", s, 1 * MiB, seed=s)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")])
    ingest(config_path=str(cfg))
    catalog = Catalog(open_store(load_config(str(cfg)).store), "t")
    before = catalog.current()
    logged = {(e.run, e.step) for e in catalog.events() if e.event == "verified"}

    assert main(["--config", str(cfg), "catalog", "rebuild"]) == 0
    assert "3 checkpoint saves found by their manifests, 0 of them superseded" in capsys.readouterr().out
    rebuilt = catalog.rebuild_from_manifests()
    assert {(e.run, e.step) for e in rebuilt if e.event == "verified"} == logged == {("r", 10), ("r", 20), ("r", 30)}

    # lose the whole catalog, then rebuild it from the manifests alone
    s3 = seaweedfs.client()
    for k in all_keys(s3, bucket, "t/_catalog/"):
        s3.delete_object(Bucket=bucket, Key=k)
    assert catalog.current() == []
    assert main(["--config", str(cfg), "catalog", "rebuild", "--write"]) == 0
    after = catalog.current()

    def essence(states: list[Any]) -> list[tuple[Any, ...]]:
        return [(s.run, s.step, s.verified, s.format, s.bytes, s.files, s.storage_class, s.created_at, s.metrics)
                for s in states]  # fmt: skip

    assert essence(after) == essence(before)
