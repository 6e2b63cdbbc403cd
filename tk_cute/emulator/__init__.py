"""A CPU emulator for tcgen05 / Hopper kernels (issue 44), piece by piece.

- `launch`: capture a kernel launch without a GPU (grid, block, cluster, shared memory, launch
  attributes, every parameter's bytes) by running the DSL's exported host code against a C
  stand-in for the CUDA runtime.
- `tensormap`: decode the 128-byte TMA descriptors (CUtensorMap) the host code writes.

Submodules are imported on use (``from tk_cute.emulator import launch``); nothing here imports
the DSL.
"""
