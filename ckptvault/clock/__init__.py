"""Where a command's time goes: the phase recorder behind `--profile`. When the command's process
started is ckptvault/command/process_clock.py's: the store imports this package, and the command
package imports the store."""
