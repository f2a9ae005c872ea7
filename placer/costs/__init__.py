"""Costs: the per-op cost model and its fits, the cost arrays and the cost graph."""
