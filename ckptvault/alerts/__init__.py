"""Alerts: their kinds and messages, the watch that raises them, their state, and the channels."""
