"""What the library keeps for the one command a process runs: the reads it makes once (memo) and the
result it can announce before its bookkeeping is done (early_result). Apart from ckptvault/clock/:
memo opens a store, and the store's downloads time their phases."""
