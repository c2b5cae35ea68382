"""The `ckptvault` subcommands, one module per family; each `cmd_*` takes the parsed arguments and returns
the exit code (ckptvault_cli/preflight.py)."""
