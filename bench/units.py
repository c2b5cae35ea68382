"""Byte units of the bench's sizes and tables."""

GiB = 1024**3
MiB = 1024**2
