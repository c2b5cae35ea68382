"""The Prefect layer of ckptvault: `tasks` (one library call each, retries for transient errors only),
`flows` (wiring) and `deployments` (schedules: prefect.yaml and `ckptvault serve`).

One package, so that `pip install ckptvault` puts no module named `tasks`, `flows` or `deployments`
into site-packages, where other projects' would collide with them. Imports point down only:
deployments -> flows -> tasks -> ckptvault (tests/unit/test_architecture.py).
"""
