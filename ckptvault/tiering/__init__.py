"""Tiering: the retention policy, prices and cost, the plan, and carrying it out."""
