"""Kernel templates: `lcf` (load-compute-finish)."""
