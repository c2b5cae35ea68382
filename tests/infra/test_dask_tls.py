"""Dask with TLS required, for real: a CA and certificates made with openssl (the commands of
infra/k8s/README.md, "Dask TLS"), a `dask scheduler` and one `dask worker` started with the variables the
Kubernetes component gives its pods (DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION and
DASK_DISTRIBUTED__COMM__TLS__*), then: a plain tcp:// client is refused by the scheduler's TLS listener;
`ckptvault ingest --dask-address tls://...` in a process whose only Dask settings are the flow pods'
variables uploads a checkpoint through the cluster's worker (SeaweedFS, a real Prefect API); a client
that presents no certificate, or one from another CA, is refused; and ckptvault refuses a tls:// address
it has no client certificate for (exit 2 naming the settings) instead of a traceback from distributed."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.config
import pytest
from distributed import Client, Security

from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests import servers
from tests.helpers import require_tool, write_config

pytestmark = pytest.mark.dask

MiB = 2**20
TLS_VAR = "DASK_DISTRIBUTED__COMM__TLS__"


def _openssl(cwd: Path, *args: str) -> None:
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, f"openssl {' '.join(args)}:\n{out.stderr}"


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    _openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
             *ca_ext)  # fmt: skip
    return d / f"{name}.crt", d / f"{name}.key"


def issue(d: Path, ca: tuple[Path, Path], name: str, usage: str, san: str = "") -> tuple[Path, Path]:
    """A key and a certificate signed by `ca`; usage: the extendedKeyUsage (serverAuth for a listener)."""
    _openssl(d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
    ext = d / f"{name}.ext"
    ext.write_text(f"extendedKeyUsage={usage}\n" + (f"subjectAltName={san}\n" if san else ""))
    _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", ext.name)  # fmt: skip
    return d / f"{name}.crt", d / f"{name}.key"


@dataclass(frozen=True)
class Certs:
    ca: Path
    node: tuple[Path, Path]  # the scheduler's and the workers' (serverAuth and clientAuth)
    client: tuple[Path, Path]  # the flow pods' (clientAuth only)
    rogue_client: tuple[Path, Path]  # a client certificate from another CA


def make_certs(d: Path) -> Certs:
    ca = make_ca(d, "dask-ca")
    node = issue(d, ca, "dask-node", "serverAuth,clientAuth", "DNS:localhost,IP:127.0.0.1")
    client = issue(d, ca, "dask-client", "clientAuth")
    rogue = issue(d, make_ca(d, "other-ca"), "rogue-client", "clientAuth")
    return Certs(ca[0], node, client, rogue)


def tls_env(ca: Path, **roles: tuple[Path, Path]) -> dict[str, str]:
    """The variables infra/k8s/components/dask gives a pod: encryption required, the CA, each role's pair."""
    env = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True", f"{TLS_VAR}CA_FILE": str(ca)}
    for role, (cert, key) in roles.items():
        env |= {f"{TLS_VAR}{role.upper()}__CERT": str(cert), f"{TLS_VAR}{role.upper()}__KEY": str(key)}
    return env


@dataclass(frozen=True)
class TlsCluster:
    port: int
    http_port: int
    certs: Certs
    scheduler_log: Path

    @property
    def address(self) -> str:
        return f"tls://127.0.0.1:{self.port}"

    def security(self) -> Security:
        cert, key = self.certs.client
        return Security(tls_ca_file=str(self.certs.ca), tls_client_cert=str(cert), tls_client_key=str(key),
                        require_encryption=True)  # type: ignore[no-untyped-call]  # fmt: skip

    def executed(self) -> int:
        """Tasks the cluster's workers have run so far."""
        with Client(self.address, security=self.security(), timeout=10, set_as_default=False) as c:  # type: ignore[no-untyped-call]
            counts: dict[str, int] = c.run(lambda dask_worker: dask_worker.state.executed_count)
            return sum(counts.values())


def _base_env() -> dict[str, str]:
    # no Dask settings of the caller's shell: each process gets exactly the ones under test
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env["PYTHONPATH"] = str(servers.REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # its own group: the worker's nanny and worker process too
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    require_tool("openssl", "apt-get install openssl")
    d = tmp_path_factory.mktemp("dask-tls")
    certs = make_certs(d)
    port = servers.free_port_base((0, 1))
    node_env = _base_env() | tls_env(certs.ca, scheduler=certs.node, worker=certs.node, client=certs.node)
    node_env |= {"AWS_ACCESS_KEY_ID": servers.TEST_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": servers.TEST_SECRET_KEY,
                 "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> Path:
        log = d / f"{name}.log"
        with log.open("wb") as out:
            procs.append(subprocess.Popen(
                [str(Path(sys.executable).parent / "dask"), *args], env=node_env, cwd=d, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            ))  # fmt: skip
        return log

    # the Kubernetes scheduler's arguments (infra/k8s/components/dask/dask.yaml) but for host and ports
    sched_log = start("scheduler", "scheduler", "--protocol", "tls", "--host", "127.0.0.1", "--port", str(port),
                      "--dashboard-address", f"127.0.0.1:{port + 1}", "--no-dashboard")  # fmt: skip
    cluster = TlsCluster(port, port + 1, certs, sched_log)
    start("worker", "worker", cluster.address, "--name", "node-0", "--host", "127.0.0.1", "--nworkers", "1",
          "--nthreads", "1", "--memory-limit", "0", "--local-directory", str(d / "w"), "--no-dashboard")  # fmt: skip
    try:
        deadline, last = time.monotonic() + 90, ""
        while True:
            try:
                with Client(cluster.address, security=cluster.security(), timeout=5, set_as_default=False) as c:  # type: ignore[no-untyped-call]
                    if c.scheduler_info(n_workers=-1)["workers"]:
                        break
            except OSError as e:
                last = str(e)
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                logs = "\n".join(servers._tail(p.read_text(errors="replace"), 30) for p in d.glob("*.log"))
                pytest.fail(f"the TLS Dask cluster did not come up ({last}):\n{logs}", pytrace=False)
            time.sleep(0.5)
        yield cluster
    finally:
        for p in reversed(procs):
            _stop(p)


def test_the_cluster_listens_only_over_tls_and_a_plain_tcp_client_is_refused(tls_cluster: TlsCluster) -> None:
    c = tls_cluster
    with Client(c.address, security=c.security(), timeout=10, set_as_default=False) as client:  # type: ignore[no-untyped-call]
        (worker,) = client.scheduler_info(n_workers=-1)["workers"]
        assert worker.startswith("tls://127.0.0.1:")  # the worker listens over TLS too (worker-to-worker data)
        assert client.submit(sum, [1, 2]).result(timeout=30) == 3
    plain = Security(require_encryption=False)  # type: ignore[no-untyped-call]  # no TLS settings at all
    with pytest.raises(OSError):
        Client(f"tcp://127.0.0.1:{c.port}", security=plain, timeout=5, set_as_default=False)  # type: ignore[no-untyped-call]
    # refused by the TLS listener, not by a closed port: the scheduler saw a handshake that was not TLS
    deadline = time.monotonic() + 10
    while "TLS handshake failed" not in c.scheduler_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "TLS handshake failed" in c.scheduler_log.read_text()
    # the kubelet's readiness probe: the scheduler's HTTP /health stays plain HTTP and answers
    with urllib.request.urlopen(f"http://127.0.0.1:{c.http_port}/health", timeout=5) as r:
        assert r.read() == b"ok"


def _handshake(port: int, ctx: ssl.SSLContext) -> str:
    """What a TLS client with this context gets from the scheduler: 'spoke' once the scheduler sends the
    first bytes of Dask's own handshake (it speaks first), else why the connection ended."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        tls.settimeout(5)
        try:
            got = tls.recv(1)  # TLS 1.3: the server's verdict on the client's certificate comes after the handshake
        except (ssl.SSLError, ConnectionResetError, TimeoutError) as e:
            return f"{type(e).__name__}: {e}"
        return "spoke" if got else "closed"


def test_a_client_without_a_certificate_or_with_another_cas_is_refused(tls_cluster: TlsCluster) -> None:
    c = tls_cluster
    ctx = ssl.create_default_context(cafile=str(c.certs.ca))  # trusts the cluster's CA, presents nothing
    ctx.check_hostname = False
    refused = _handshake(c.port, ctx)
    assert "CERTIFICATE_REQUIRED" in refused, refused
    ctx.load_cert_chain(*c.certs.client)  # the same, with the flow pods' certificate: let in
    assert _handshake(c.port, ctx) == "spoke"

    cert, key = c.certs.rogue_client
    rogue = Security(tls_ca_file=str(c.certs.ca), tls_client_cert=str(cert), tls_client_key=str(key),
                     require_encryption=True)  # type: ignore[no-untyped-call]  # fmt: skip
    with pytest.raises(OSError):
        Client(c.address, security=rogue, timeout=5, set_as_default=False)  # type: ignore[no-untyped-call]


def test_ckptvault_refuses_a_tls_address_without_a_client_certificate_and_tcp_under_required_encryption(
    tls_cluster: TlsCluster, seaweedfs: Any, bucket_factory: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Before any work, exit 2 naming the settings; distributed alone would end in a TypeError (no
    certificate) or a RuntimeError (tcp:// under require-encryption), each a traceback."""
    c = tls_cluster
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # never reached: refused before
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket_factory(seaweedfs), [("r", tmp_path, "hf")])
    ca_only = {"distributed.comm.require-encryption": True, "distributed.comm.tls.ca-file": str(c.certs.ca)}
    client_cert, client_key = (str(p) for p in c.certs.client)
    full = ca_only | {"distributed.comm.tls.client.cert": client_cert, "distributed.comm.tls.client.key": client_key}
    cases = [
        (c.address, ca_only, f"{TLS_VAR}CLIENT__CERT"),
        (f"tcp://127.0.0.1:{c.port}", full, "use the scheduler's tls:// address"),
    ]
    for address, settings, said in cases:
        with dask.config.set(settings):
            capsys.readouterr()
            assert main(["--config", str(cfg), "ingest", "--dask-address", address]) == 2
        err = capsys.readouterr().err
        assert said in err and address in err and "Traceback" not in err, err


def test_ckptvault_ingest_runs_on_the_tls_cluster_with_the_flow_pods_settings(
    tls_cluster: TlsCluster, seaweedfs: Any, bucket_factory: Any, prefect_api: None, tmp_path: Path
) -> None:
    """`ckptvault ingest --dask-address tls://...` in a process whose Dask settings are only the flow pods'
    variables (CA, client certificate and key, encryption required): distributed's default Security,
    which every Client ckptvault makes uses, reads them from the environment; the upload runs on the
    cluster's worker."""
    from prefect.settings import PREFECT_API_URL

    c = tls_cluster
    root = tmp_path / "hot"
    write_checkpoint(root, "hf", 100, 2 * MiB, seed=1)
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")],
                       extra="[validation]\nenabled = false\n")  # fmt: skip
    env = _base_env() | seaweedfs.env() | {"PREFECT_API_URL": str(PREFECT_API_URL.value())}
    env |= tls_env(c.certs.ca, client=c.certs.client)
    before = c.executed()
    out = subprocess.run(
        [sys.executable, "-m", "ckptvault_cli.main", "--config", str(cfg), "ingest", "--json",
         "--dask-address", c.address],
        env=env, capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (outcome,) = json.loads(out.stdout)["outcomes"]
    assert (outcome["step"], outcome["result"]) == (100, "uploaded")
    assert c.executed() - before >= outcome["files"] > 0  # every file's upload ran on the TLS cluster's worker
    keys = [o["Key"] for o in seaweedfs.client().list_objects_v2(Bucket=bucket, Prefix="t/r/")["Contents"]]
    assert any(k.endswith("/_MANIFEST.json") for k in keys), keys
