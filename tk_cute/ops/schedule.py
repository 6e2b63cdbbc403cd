# SPDX-License-Identifier: MIT
"""Persistent tile schedulers in TK terms: static supergroup order, or cluster launch control.

`STATIC` (Hopper and Blackwell/Rubin): a persistent grid of at most `max_clusters` clusters;
each cluster walks output tiles in supergroup order (SUPERGROUP_SIZE tiles along M per group,
`cutlass.utils.StaticPersistentTileScheduler`). `CLC` (sm_100a, sm_103a, sm_107a): the grid
covers every tile; when a cluster finishes a tile its scheduler warp (CTA 0 of the cluster)
issues `clusterlaunchcontrol.try_cancel.multicast` and steals a cluster that has not started
(dynamic work stealing, TK's CLC scheduler). The 16-byte response lands in every CTA's shared
memory through a one-stage `PipelineClcFetchAsync`; every warp that walks tiles waits on it.

Every role writes the same loop for both kinds:
    tiles = Tiles.create(*walk(kind, params, clc_barriers, clc_response, cluster, walkers))
    work = tiles.first()
    while work.is_valid_tile: ...; work = tiles.next()
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values

STATIC, CLC = "static", "clc"
KINDS = (STATIC, CLC)
CLC_RESPONSE_BYTES = 16  # x, y, z of the stolen cluster's first CTA, and a valid bit


def params(kind: str, tiles_mnl, cluster_mnk, supergroup: int):
    """Scheduler parameters (host): tiles per (M, N, L) in CTA tiles, supergroup along M."""
    if kind == CLC:
        return utils.ClcDynamicPersistentTileSchedulerParams(tiles_mnl, cluster_mnk, supergroup,
                                                             True)
    return utils.PersistentTileSchedulerParams(tiles_mnl, cluster_mnk, supergroup, True)


def grid(kind: str, sched_params, max_clusters: int):
    """Launch grid: every tile's CTA (CLC steals), else at most `max_clusters` clusters."""
    if kind == CLC:
        return utils.ClcDynamicPersistentTileScheduler.get_grid_shape(sched_params)
    return utils.StaticPersistentTileScheduler.get_grid_shape(sched_params, max_clusters)


def clc_ring(barriers, cluster_vmnk, walkers_per_cta: int):
    """The CLC response ring (one stage): CTA 0's scheduler warp produces, `walkers_per_cta`
    warps of every CTA plus the scheduler warp consume."""
    walkers = 32 * (1 + cute.size(cluster_vmnk) * walkers_per_cta)
    return pipeline.PipelineClcFetchAsync.create(
        barrier_storage=barriers, num_stages=1,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, walkers),
        tx_count=CLC_RESPONSE_BYTES, cta_layout_vmnk=cluster_vmnk, defer_sync=True)


def walk(kind: str, sched_params, clc_barriers, clc_response, cluster_vmnk,
         walkers_per_cta: int) -> tuple:
    """What `Tiles.create(*walk)` needs in every role: the CLC ring is built only for CLC."""
    clc = None
    if kind == CLC:
        clc = clc_ring(clc_barriers, cluster_vmnk, walkers_per_cta)
    return kind, sched_params, clc, clc_response


class Tiles:
    """One warp's walk over its output tiles (`first`, then `next` until invalid)."""

    def __init__(self, sched, clc=None, state=None):
        self.sched, self.clc, self.state = sched, clc, state

    @staticmethod
    def create(kind: str, sched_params, clc=None, response=None):
        bidx, grid_dim = cute.arch.block_idx(), cute.arch.grid_dim()
        if kind == CLC:
            sched = utils.ClcDynamicPersistentTileScheduler.create(sched_params, bidx, grid_dim,
                                                                   response)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            return Tiles(sched, clc, state)
        return Tiles(utils.StaticPersistentTileScheduler.create(sched_params, bidx, grid_dim))

    # loop-carried through the DSL's while loops
    def __extract_mlir_values__(self):
        values = extract_mlir_values(self.sched)
        return values + ([] if self.state is None else extract_mlir_values(self.state))

    def __new_from_mlir_values__(self, values):
        n = len(extract_mlir_values(self.sched))
        sched = new_from_mlir_values(self.sched, values[:n])
        state = None if self.state is None else new_from_mlir_values(self.state, values[n:])
        return Tiles(sched, self.clc, state)

    def first(self):
        return self.sched.initial_work_tile_info()

    def next(self):
        """The next tile: static stride, or the stolen cluster's tile from the CLC response."""
        if cutlass.const_expr(self.clc is None):
            self.sched.advance_to_next_work()
            return self.sched.get_current_work()
        self.clc.consumer_wait(self.state)
        work = self.sched.get_current_work()
        self.clc.consumer_release(self.state)
        self.state.advance()
        return work


@cute.jit
def clc_steal(tiles: Tiles):
    """Scheduler warp (CTA 0 of a cluster): try_cancel one pending cluster per tile walked,
    multicast the response to the cluster, until a try_cancel fails (no clusters left)."""
    produce = pipeline.make_pipeline_state(pipeline.PipelineUserType.ProducerConsumer, 1)
    work = tiles.first()
    while work.is_valid_tile:
        tiles.clc.producer_acquire(produce)
        tiles.sched.advance_to_next_work(tiles.clc.producer_get_barrier(produce))
        produce.advance()
        work = tiles.next()
    tiles.clc.producer_tail(produce)
