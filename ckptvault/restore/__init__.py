"""Restore and drills: bring a checkpoint back, and prove that what is stored restores and loads."""
