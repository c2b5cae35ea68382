import dataclasses
from pathlib import Path
from typing import Any
import pytest
from ckptvault.synthetic import write_checkpoint
from tests.faultproxy import FaultProxy, FaultRates
from tests.helpers import write_config
from tests.reliability.conftest import MiB

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_explore(prefect_api, seaweedfs, bucket_factory, tmp_path, s3_env, seed):
    from flows.ingest import ingest
    from flows.tier import tier
    s3_env(seaweedfs)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    for s in (100, 200, 300):
        write_checkpoint(root, "deepspeed", s, 24 * MiB, seed=s)
    with FaultProxy(seaweedfs.url, FaultRates(reset_response=0.25), seed=seed) as proxy:
        via = dataclasses.replace(seaweedfs, url=proxy.url)
        cfg = write_config(tmp_path / "c.toml", via, bucket, [("r", root, "deepspeed")], extra='[policy]\nkeep_hot = 1\ntiers = [{ after_days = 0, tier = "warm" }]\n')
        st = ingest(config_path=str(cfg), return_state=True)
        print("INGEST", st, st.result(raise_on_failure=False))
        st = tier(apply=True, config_path=str(cfg), return_state=True)
        print("TIER", st, st.result(raise_on_failure=False))
        print(proxy.summary(), dict(proxy.counts))
