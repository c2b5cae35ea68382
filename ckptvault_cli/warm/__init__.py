"""The warm process (`ckptvault warm`, docs/warm.md), whole: the server that forks a child per command
(server), the console script's side of the hand-off (client), what the two say (protocol), what a warm
process may still run (fresh), its spare Great Expectations child (spare) and a child's release of its
command before its end (early_exit).

Imports nothing: the console script imports `client` (and through it `protocol`) before anything else,
and a command that finds no warm process must have paid almost nothing for looking.
"""
