"""The Prefect layer of ckptvault: `tasks` (one library call each, retries for transient errors only),
`runtime` (what the flows run on: the task runner `[scale]` chooses, the failure hooks, the submitter
that runs library calls as tasks), `flows` (wiring) and `deployments` (schedules: prefect.yaml and
`ckptvault serve`).

One package, so that `pip install ckptvault` puts no module named `tasks`, `flows` or `deployments`
into site-packages, where other projects' would collide with them. Imports point down only:
deployments -> flows -> runtime -> tasks -> ckptvault (tests/unit/test_architecture.py); the command
line imports flows and runtime.
"""
