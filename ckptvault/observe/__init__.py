"""What an operator watches: the Prometheus metrics computed from the catalog, and the ledger in the
bucket that counts what the flows did (docs/metrics.md)."""
