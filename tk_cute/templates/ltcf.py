"""Load-transform-compute-finish: `lcf` with a transform warpgroup between the loads and the MMAs.

For kernels whose operands must be rewritten before the tensor cores can read them (an FP4
decode on Hopper), doing the rewrite in the consumer warpgroups serialises it with the MMAs: the
consumers hold the accumulators, so few registers are left for the rewrite's independent work,
and 2 warps per scheduler cannot hide its latencies. Here the producer warpgroup's idle warps
do it (a fourth warpgroup would cap every thread at 128 registers, too few for a 64x256
accumulator):

  loader (warp 0 of warpgroup 0): TMA of the raw stage tiles (`inputs`) into a LOAD_PIPE_DEPTH
    ring; tiles that need no rewrite (`direct_inputs`) go straight into the compute ring;
  transform (warps 1-3 of warpgroup 0, PRODUCER_REGISTERS): waits for a raw stage, calls
    `transform(g, raw, out, thread, threads, share=(0, TRANSFORM_SHARE))` to write its share
    of the compute-ring stage, frees the raw stage, arrives on the compute stage's full barrier
    (every thread, after a proxy fence);
  consumers (NUM_CONSUMERS warpgroups): wait for a compute stage, finish the transform's work
    (`transform(..., share=(TRANSFORM_SHARE, 1))`),
    free the raw stage, meet on a named barrier, `compute(...)`, commit, free the compute stage
    once the next batch is issued (one elected lane per warp), `finish` per tile.
Splitting the rewrite pays because the 3 transform warps alone cannot keep up with the tensor
cores, while the consumers idle between MMA batches (their rewrite of stage k overlaps the MMAs
of stage k - 1).
The compute ring (COMPUTE_PIPE_DEPTH stages of `compute_tiles`) uses plain mbarriers with TK's
phase rule (`tk_cute.types.semaphore.ring`: "full" barriers wait on the pass's parity,
"empty" ones on its flip, so the first use passes at once). The loader takes a compute slot
before loading the raw stage that will fill it, so the transform never overtakes the consumers.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from tk_cute.ops import schedule, warp, warpgroup
from tk_cute.templates.lcf import LCF
from tk_cute.types.gl import coord
from tk_cute.types.semaphore import NamedBarrier, ring, semaphore
from tk_cute.types.st import Shared, smem_bytes

WG = warpgroup.WARPGROUP_THREADS


class LTCF(LCF):
    """Base class of load-transform-compute-finish kernels; see the module docstring."""

    COMPUTE_PIPE_DEPTH = 3
    PRODUCER_REGISTERS = 104  # the transform warps run here: room for several chunks in flight
    CONSUMER_REGISTERS = 200  # 128 accumulator registers + MMA/epilogue state
    TRANSFORM_THREADS = 96  # warps 1-3 of the producer warpgroup
    TRANSFORM_SHARE = 0.5  # fraction of each stage's rewrite done by the transform warps

    def compute_tiles(self) -> dict:
        raise NotImplementedError

    def direct_inputs(self) -> dict:
        return {}

    def dynamic_shared_memory(self) -> int:
        tiles = [(t, self.LOAD_PIPE_DEPTH) for t in self.inputs().values()]
        tiles += [(t, self.COMPUTE_PIPE_DEPTH) for t in self.compute_tiles().values()]
        tiles += list(self.consumer_tiles().values())
        return smem_bytes(*tiles, barriers=2 * (self.LOAD_PIPE_DEPTH + self.COMPUTE_PIPE_DEPTH))

    def stage_bytes(self) -> int:
        return sum(t.bytes for t in self.inputs().values())

    def direct_bytes(self) -> int:
        return sum(self.compute_tiles()[n].bytes for n in self.direct_inputs())

    @cute.kernel
    def kernel(self, g, params: schedule.Params):
        warp_id = warp.warpid()
        group = warpgroup.groupid()
        tid = cute.arch.thread_idx()[0]
        if warp_id == 0:
            self.prefetch(g)
        depth = self.COMPUTE_PIPE_DEPTH
        smem = Shared()
        raw_ring = self._ring(smem.barriers(2 * self.LOAD_PIPE_DEPTH))
        stages = ring(depth)  # the compute ring's phases
        full, empty = smem.barriers(depth), smem.barriers(depth)
        if tid == 0:
            direct = 1 if cutlass.const_expr(self.direct_inputs()) else 0
            for s in cutlass.range_constexpr(depth):
                semaphore(full + s).init(self.TRANSFORM_THREADS + direct)
                semaphore(empty + s).init(self.NUM_CONSUMERS * 4)
        raw = {n: smem.alloc(t, self.LOAD_PIPE_DEPTH) for n, t in self.inputs().items()}
        out = {n: smem.alloc(t, depth) for n, t in self.compute_tiles().items()}
        consumer_smem = {n: smem.alloc(t, c) for n, (t, c) in self.consumer_tiles().items()}
        k_steps = self.k_steps(g)
        cute.arch.mbarrier_init_fence()
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))

        tiles = schedule.Tiles.create(schedule.STATIC, params)
        work = tiles.first()
        i = cutlass.Int32(0)  # running stage count of this role
        if group == 0:
            warpgroup.decrease_registers(self.PRODUCER_REGISTERS)
            if warp_id == 0:
                state = pipeline.make_pipeline_state(
                    pipeline.PipelineUserType.Producer, self.LOAD_PIPE_DEPTH)
                while work.is_valid_tile:
                    at = coord(work.tile_idx[0], work.tile_idx[1], work.tile_idx[2])
                    for k in range(k_steps):
                        s = stages.stage(i)
                        stages.wait_finished(empty, i)
                        raw_ring.producer_acquire(state)
                        stage = {m: t[None, None, state.index] for m, t in raw.items()}
                        slot = {m: t[None, None, s] for m, t in out.items()}
                        if cutlass.const_expr(self.direct_inputs()):
                            with warp.elect_leader():
                                semaphore(full + s).expect_bytes(self.direct_bytes())
                        self.load(g, stage, slot, at, k, raw_ring.producer_get_barrier(state),
                                  full + s)
                        raw_ring.producer_commit(state)
                        state.advance()
                        i += 1
                    work = tiles.next()
                raw_ring.producer_tail(state)
            else:
                self._transform_loop(g, raw_ring, raw, out, tiles, work, k_steps, full, tid - 32)
        else:
            warpgroup.increase_registers(self.CONSUMER_REGISTERS)
            thread = tid - WG
            acc_state = self.setup(g, thread, consumer_smem)
            consumers = warpgroup.sync(NamedBarrier.CONSUMERS, self.NUM_CONSUMERS)
            raw_state = pipeline.make_pipeline_state(
                pipeline.PipelineUserType.Consumer, self.LOAD_PIPE_DEPTH)
            while work.is_valid_tile:
                at = coord(work.tile_idx[0], work.tile_idx[1], work.tile_idx[2])
                warpgroup.mma_fence()
                for k in range(k_steps):
                    slot = {m: t[None, None, stages.stage(i)] for m, t in out.items()}
                    stages.wait_arrived(full, i)
                    if cutlass.const_expr(self.TRANSFORM_SHARE < 1):
                        raw_ring.consumer_wait(raw_state)
                        stage = {m: t[None, None, raw_state.index] for m, t in raw.items()}
                        self.transform(g, stage, slot, thread, self.NUM_CONSUMERS * WG,
                                       (self.TRANSFORM_SHARE, 1))
                        cute.arch.fence_proxy("async.shared", space="cta")
                    raw_ring.consumer_release(raw_state)
                    raw_state.advance()
                    if cutlass.const_expr(self.TRANSFORM_SHARE < 1):
                        consumers()
                    self.compute(g, acc_state, slot, k)
                    warpgroup.mma_commit_group()
                    if k > 0:  # the previous stage's MMAs are done once at most one batch runs
                        warpgroup.mma_async_wait(1)
                        with warp.elect_leader():
                            stages.at(empty, i - 1).arrive()
                    i += 1
                warpgroup.mma_async_wait(0)
                with warp.elect_leader():
                    stages.at(empty, i - 1).arrive()
                self.finish(g, acc_state, at, consumer_smem, thread)
                work = tiles.next()
            self.finish_tail()

    @cute.jit
    def _transform_loop(self, g, raw_ring, raw, out, tiles, work, k_steps, full, thread):
        """Transform warps: raw stage -> compute stage, in the loader's order."""
        stages = ring(self.COMPUTE_PIPE_DEPTH)
        i = cutlass.Int32(0)
        state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.LOAD_PIPE_DEPTH)
        while work.is_valid_tile:
            for k in range(k_steps):
                s = stages.stage(i)
                raw_ring.consumer_wait(state)
                stage = {m: t[None, None, state.index] for m, t in raw.items()}
                slot = {m: t[None, None, s] for m, t in out.items()}
                self.transform(g, stage, slot, thread, self.TRANSFORM_THREADS,
                               (0, self.TRANSFORM_SHARE))
                cute.arch.fence_proxy("async.shared", space="cta")
                raw_ring.consumer_release(state)
                stages.at(full, i).arrive()
                state.advance()
                i += 1
            work = tiles.next()

    def _ring(self, barriers):
        """The raw ring: TMA producer, the transform warpgroup's 4 warps as consumers."""
        raw = pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers,
            num_stages=self.LOAD_PIPE_DEPTH,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.TRANSFORM_THREADS // 32 + self.NUM_CONSUMERS * 4),
            tx_count=self.stage_bytes(),
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
            defer_sync=True,
        )
        return raw
