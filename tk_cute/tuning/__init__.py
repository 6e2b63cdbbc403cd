# SPDX-License-Identifier: MIT
"""Tuning: how each call's kernel config is chosen, one module per target family.

`sm100`: Blackwell (sm_100a, sm_103a) and Rubin (sm_107a), picked by a cost MODEL (no such GPU
here). The Hopper heuristics, measured on the H200, are in `tk_cute.tuning.sm90`.
Host-only: imported by the public layer (dispatch, report), never by `kernels/`.
"""
