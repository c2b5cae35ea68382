"""Where a command's time goes: the phase recorder behind `--profile` and the process's own age.
Imports nothing: the console script reads process_clock before it imports anything else."""
