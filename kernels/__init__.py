"""Kernels built from the tk_cute vocabulary. Imported as ``tk_cute.kernels``."""
