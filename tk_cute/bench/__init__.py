"""Benchmarks: `python -m tk_cute.bench <name> [options]` (see `harness.py` for the method)."""
