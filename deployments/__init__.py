"""ckptvault's deployments, where a Prefect project keeps them: `prefect.yaml` here is the one shipped
in ckptvault_prefect/deployments/ (a symlink), so `cd deployments && prefect --no-prompt deploy --all`
works from a checkout; `python -m deployments.serve` is `ckptvault serve`."""
