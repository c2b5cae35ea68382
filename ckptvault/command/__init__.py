"""What the library keeps for the one command a process runs, the same whether it runs in its own
process (direct mode, a cold command) or in a warm process's child: the reads it makes once (memo), the
result it can announce before its bookkeeping is done (early_result) and when the command's process
started (process_clock). Apart from ckptvault/clock/: memo opens a store, and the store's downloads time
their phases.

Imports nothing: the console script reads process_clock before it imports anything else."""
