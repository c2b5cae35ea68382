"""`s3_client.prime` (what `ckptvault warm` runs before it forks its commands): afterwards the shared loader
holds S3's service model and endpoint rules, so a command's first client does not parse them again; and it
makes no request and looks up no credentials (it runs with none, no network, an unreachable endpoint)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_PRIME = """
import socket
from ckptvault.store import s3_client

def no_network(*a, **k):
    raise AssertionError("prime opened a connection")

socket.socket.connect = no_network
socket.create_connection = no_network
loader = s3_client._shared_loader()
assert not [k for k in loader._cache if "s3" in k]
s3_client.prime()
cached = {k[0] for k in loader._cache if "s3" in k or any("s3/" in str(p) for p in k)}
assert "load_service_model" in cached, cached
print("ok")
"""


def test_prime_leaves_s3s_model_parsed_in_the_shared_loader_without_a_request(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    done = subprocess.run(
        [sys.executable, "-c", _PRIME], env=env, capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
