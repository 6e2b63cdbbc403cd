# SPDX-License-Identifier: MIT
"""CTA-pair and cluster plumbing in ThunderKittens terms (Blackwell / Rubin).

On a CTA pair (`cta_group::2`) the even CTA is the leader: it issues the pair's MMAs, and the
TMA loads of both CTAs complete on the leader's barrier (`leader_sem`). `everyone.cluster`
arrive/wait order barrier initialisation across the cluster before anyone multicasts into it.
`elect_leader` picks one lane to issue thread-scope ops. PDL (`griddepcontrol`) lets the next
kernel's prologue overlap this one's tail.
"""

from __future__ import annotations

import cutlass.cute as cute

from tk_cute.ops.warp import elect_leader  # noqa: F401  (re-exported for CTA-pair code)
from cutlass.cute.nvgpu import cpasync
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait


def cta_rank_in_pair():
    """0 on the leader CTA of the pair, 1 on its peer (block x parity)."""
    bidx, _, _ = cute.arch.block_idx()
    return bidx % 2


def is_leader_cta():
    """True on the CTA that issues the pair's MMAs and owns the pair's TMA barriers."""
    return cta_rank_in_pair() == 0


def cluster_arrive(cluster_shape_mn, relaxed: bool = True):
    """Arrive on the cluster barrier once this CTA's mbarriers are initialised (TK
    `everyone::tma::cluster::arrive`)."""
    pipeline_init_arrive(cluster_shape_mn=cluster_shape_mn, is_relaxed=relaxed)


def cluster_wait(cluster_shape_mn):
    """Wait until every CTA of the cluster arrived (its barriers are initialised)."""
    pipeline_init_wait(cluster_shape_mn=cluster_shape_mn)


def cluster_sync():
    """Full cluster barrier (arrive + wait)."""
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()


def multicast_masks(cluster_layout_vmnk, sfb_cluster_layout_vmnk):
    """TMA multicast masks: A and SFA go to CTAs with this M (mode 2), B/SFB to this N (mode 1)."""
    rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
    coord = cluster_layout_vmnk.get_flat_coord(rank)
    coord_sfb = sfb_cluster_layout_vmnk.get_flat_coord(rank)
    a = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, coord, mcast_mode=2)
    b = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, coord, mcast_mode=1)
    sfb = cpasync.create_tma_multicast_mask(sfb_cluster_layout_vmnk, coord_sfb, mcast_mode=1)
    return a, b, sfb, coord, coord_sfb


def pdl_wait():
    """`griddepcontrol.wait`: block until the previous kernel in the stream has flushed (PDL)."""
    cute.arch.griddepcontrol_wait()


def pdl_launch_dependents():
    """`griddepcontrol.launch_dependents`: let the next kernel start its prologue (PDL)."""
    cute.arch.griddepcontrol_launch_dependents()


def tma_partition(atom, cta_coord, cluster_vmnk, mode, smem, gmem, compact: bool = False):
    """TMA views of staged `smem` (MMA, M, K, stage) and tiled `gmem` for the CTAs that share a
    multicast along `mode` of the cluster (e.g. (0, 0, None, 0): A along N); `compact` drops
    stride-0 modes (scale factors)."""
    ctas = cute.make_layout(cute.slice_(cluster_vmnk, mode).shape)
    s, g = cpasync.tma_partition(atom, cta_coord, ctas, cute.group_modes(smem, 0, 3),
                                 cute.group_modes(gmem, 0, 3))
    return (cute.filter_zeros(s), cute.filter_zeros(g)) if compact else (s, g)
