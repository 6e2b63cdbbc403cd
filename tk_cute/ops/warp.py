"""Warp scope (32 lanes; TK's `warp::`): lane identity, electing one lane, lane exchange.

`elect_leader()` is a context in which exactly one lane of a converged warp runs (PTX
`elect.sync`): the way to issue single-thread work such as an mbarrier arrive or
`expect_bytes`. Keep the whole warp converged around it: `elect.sync` and the DSL's TMA copies
(which elect their own lane) deadlock when entered from a single-lane branch.
"""

from __future__ import annotations

import cutlass.cute as cute

WARP_THREADS = 32


def laneid():
    """This thread's lane (0-31)."""
    return cute.arch.lane_idx()


def warpid():
    """This thread's warp in the block (warp-uniform)."""
    return cute.arch.make_warp_uniform(cute.arch.warp_idx())


def elect_leader():
    """`with elect_leader(): ...` runs the body on one lane of the (converged) warp."""
    return cute.arch.elect_one()


def sync():
    """Reconverge the warp (`__syncwarp`)."""
    cute.arch.sync_warp()


def shuffle_xor(value, lane_mask: int):
    """The value held by lane `laneid() ^ lane_mask` (butterfly exchange)."""
    return cute.arch.shuffle_sync_bfly(value, offset=lane_mask)
