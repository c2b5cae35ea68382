"""What a process that forks runs imports once, before its first fork: the one preload list.

Two processes fork runs from imports done once: `ckptvault warm` (ckptvault_cli/warm/server.py) forks a
child per command, and `ckptvault serve`'s warm start (ckptvault_prefect/runtime/warm_start.py) forks a
process per served flow run. Both preload what a flow run imports anyway (`FLOW_RUN`); a command imports
the command line and what its own flow run reaches on first use besides (`COMMAND`, which holds
`FLOW_RUN`). Great Expectations is in neither: the gates run it in a child of their own.

Here, in the lowest module both may import, and importing nothing itself (tests/unit/test_architecture.py):
the lists are names, read before what they name is imported. The command line's modules are named as
strings only, so this layer still imports nothing of the one above it. Each name must still exist
(tests/unit/test_preload.py): a module renamed or gone from Prefect fails there, not at a warm start.
"""

# What every flow run imports: Prefect's engine and client, and the seven flows with the library under them.
FLOW_RUN = (
    "prefect.flow_engine",
    "prefect.client.orchestration",
    "ckptvault_prefect.flows.ingest",
    "ckptvault_prefect.flows.restore",
    "ckptvault_prefect.flows.tier",
    "ckptvault_prefect.flows.replicate",
    "ckptvault_prefect.flows.scrub",
    "ckptvault_prefect.flows.drill",
    "ckptvault_prefect.flows.watch",
)

# What a command imports: the command line, a flow run's imports, boto3's S3 client.
COMMAND = (
    "ckptvault_cli.parser",
    "ckptvault_cli.running",
    "ckptvault_cli.preflight",
    *FLOW_RUN,
    "ckptvault.store.s3_client",
    "boto3",
    "botocore.client",
    "fastapi.encoders",  # Prefect's serialize_parameters imports it at each flow run's creation (~0.12 s)
    # What a warm restore's child still imported on first use (~35 ms in all, measured 2026-12-05): a flow
    # call's graph helpers, the task engine and artifacts at the first task run, the catalog decoder's masked
    # arrays, the compaction's Arrow datasets, the event and log workers' asyncio backend, Rich's emoji
    "prefect.utilities.visualization",
    "prefect.task_engine",
    "prefect.artifacts",
    "numpy.ma",
    "pyarrow.dataset",
    "pyarrow.acero",
    "anyio._backends._asyncio",
    "anyio.streams.tls",
    "rich._emoji_codes",
    "encodings.idna",
    "ckptvault_cli.warm.early_exit",
)
