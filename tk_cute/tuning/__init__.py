# SPDX-License-Identifier: MIT
"""Tuning: how each call's kernel config is chosen, one module per target family.

`sm100`: Blackwell (sm_100a, sm_103a) and Rubin (sm_107a), picked by a cost MODEL (no such GPU
here). Hopper, measured on the H200: `sm90` (the NVFP4 paths and their Configs) and
`dense_sm90` (the dense GEMM's tiles and clusters), on the rounds model they share (`rounds`).
Host-only: imported by the public layer (dispatch, report), never by `kernels/`.
"""
