# SPDX-License-Identifier: MIT
"""CTA-pair and cluster plumbing in ThunderKittens terms (Blackwell / Rubin).

On a CTA pair (`cta_group::2`) the even CTA is the leader: it issues the pair's MMAs, and the
TMA loads of both CTAs complete on the leader's barrier (`leader_sem`). `everyone.cluster`
arrive/wait order barrier initialisation across the cluster before anyone multicasts into it.
`elect_leader` picks one lane to issue thread-scope ops. PDL (`griddepcontrol`) lets the next
kernel's prologue overlap this one's tail. `multicast_ctas` counts the CTAs whose multicast
loads fill one stage (a ring's consumer count); `tma.multicast` gives a CTA its masks.
`ld_shared_remote_u32` / `ld_shared_remote_v4_f32` read a word / 16 bytes of a peer CTA's shared
memory (distributed shared memory); `sum_ranks_v4_f32` adds 16 bytes of fp32 over the ranks.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from tk_cute.ops.ptx import asm, unpack
from tk_cute.ops.warp import elect_leader  # noqa: F401  (re-exported for CTA-pair code)

PORTABLE_SIZES = (1, 2, 4, 8)  # CTAs per cluster every sm_90a+ GPU launches without opt-in


def cta_rank_in_pair():
    """0 on the leader CTA of the pair, 1 on its peer (block x parity)."""
    bidx, _, _ = cute.arch.block_idx()
    return bidx % 2


def cta_rank():
    """This CTA's rank in its cluster (`%cluster_ctarank`)."""
    return cute.arch.block_idx_in_cluster()


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


def multicast_ctas(cluster_mn, *operands: str, pair: int = 2) -> int:
    """CTAs (counted in pairs) whose TMA multicasts land in one stage holding `operands`: A
    comes from the pairs along N, B from those along M; together they share this CTA."""
    along = {"A": cluster_mn[1], "B": cluster_mn[0] // pair}
    n = [along[o] for o in operands]
    return sum(n) - (len(n) - 1)


def pdl_wait():
    """`griddepcontrol.wait`: block until the previous kernel in the stream has flushed (PDL)."""
    cute.arch.griddepcontrol_wait()


def pdl_launch_dependents():
    """`griddepcontrol.launch_dependents`: let the next kernel start its prologue (PDL)."""
    cute.arch.griddepcontrol_launch_dependents()


@dsl_user_op
def ld_shared_remote_u32(addr: Int32, rank: Int32, *, loc=None, ip=None) -> Uint32:
    """32 bits at shared address `addr` of the cluster's CTA `rank` (``mapa`` then
    ``ld.shared::cluster``; ordered after the cluster barrier that published them)."""
    text = ("{ .reg .b32 ra; mapa.shared::cluster.u32 ra, $1, $2; "
            "ld.shared::cluster.u32 $0, [ra]; }")
    return Uint32(asm(T.i32(), [Int32(addr), Int32(rank)], text, "=r,r,r", loc, ip, True))


@dsl_user_op
def ld_shared_remote_v4_f32(addr: Int32, rank: Int32, *, loc=None, ip=None) -> list:
    """4 float32 at shared address `addr` (16-byte aligned) of the cluster's CTA `rank`, as
    `ld_shared_remote_u32` reads one word."""
    ret = llvm.StructType.get_literal([T.f32()] * 4)
    text = ("{ .reg .b32 ra; mapa.shared::cluster.u32 ra, $4, $5; "
            "ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [ra]; }")
    res = asm(ret, [Int32(addr), Int32(rank)], text, "=f,=f,=f,=f,r,r", loc, ip, True)
    return unpack(res, T.f32(), 4, Float32, loc, ip)


def sum_ranks_v4_f32(addr, ranks: int) -> list:
    """The 4 float32 at shared address `addr` of the cluster's CTAs 0 .. ranks - 1, added in
    rank order (deterministic; read after the cluster barrier that published them)."""
    total = ld_shared_remote_v4_f32(addr, 0)
    for q in range(1, ranks):
        part = ld_shared_remote_v4_f32(addr, q)
        total = [total[e] + part[e] for e in range(4)]
    return total
