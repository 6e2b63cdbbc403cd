"""Load-compute-finish (TK `lcf`): the template owns the pipeline, the kernel supplies three steps.

The kernel subclasses `LCF`, declares the shared tiles one pipeline stage holds (`inputs`) and
writes, as TK's `lcf` asks:
  - `load(g, inputs, at, k, barrier, multicast)`: the producer (one warp) issues the TMA loads of
    K-step `k` of output tile `at` into the stage tensors `inputs`, completing on `barrier`;
  - `setup(g, thread, smem)`: once per consumer thread, returns its state (accumulators, the
    consumers' own shared tiles from `smem`, ...);
  - `compute(g, state, inputs, k)`: consume one stage (issue the MMAs; the template commits
    them and frees the stage once the next batch is issued, keeping one batch in flight);
  - `finish(g, state, at, smem, thread)`: write tile `at` out (epilogue buffers in `smem`).
`finish_tiles` and `scratch_tiles` declare the consumers' shared tiles (name -> (tile, count));
the template allocates them once, beside the ring, and hands them over as `smem`.
The template: one producer warpgroup (registers lowered to PRODUCER_REGISTERS) and
NUM_CONSUMERS consumer warpgroups (raised to CONSUMER_REGISTERS) that share one accumulator tile
(each owns Mb / NUM_CONSUMERS rows); a LOAD_PIPE_DEPTH-stage ring of the `inputs` with
full/empty mbarriers (a `stage_ring.tma_to_threads`, the Blackwell/Rubin kernel's ring vocabulary:
TK's inputs_arrived / inputs_finished; the expected transaction bytes are the stage's tile bytes); a persistent grid
over output tiles in supergroup order (`ops/schedule.py`, shared with the Blackwell/Rubin
kernels: SUPERGROUP_SIZE tile rows per group, so concurrently running CTAs share A and B panels
in L2); optional clusters
(CLUSTER_M x CLUSTER_N) whose CTAs multicast the shared A rows / B columns.
The schedule is an object the kernel holds (`sched`, set in its constructor): `WholeTiles`
here (each persistent CTA its whole tiles), `SplitK` (each tile's K steps cut into `splits`
ranges, each a unit of work that writes its own partial tile), or
`templates.stream_k.StreamK` (equal shares of the (tile x K-step) units, their partial sums
handed between CTAs). It owns the grid and the
two loops (`produce`, `consume`), taking the kernel as `k`; the kernel's steps are the same
under either. A schedule binds the kernel steps it calls to names before its loops: the DSL
takes an object whose method is called inside a run-time loop or branch for a value the loop
carries (only `self` is exempt), and a kernel is not one.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from tk_cute.ops import cluster as pdl
from tk_cute.ops import schedule, tma, warp, warpgroup
from tk_cute.types.gl import coord
from tk_cute.types.semaphore import stage_ring
from tk_cute.types.st import Shared, smem_bytes, st


class WholeTiles:
    """The persistent schedule: one CTA (cluster) per SM (cluster of SMs), at most one per
    tile, each taking its whole tiles in supergroup order (`ops.schedule`)."""

    def grid(self, k, params, max_ctas: int, ctas):
        clusters = max_ctas // (k.CLUSTER_M * k.CLUSTER_N)
        return schedule.grid(schedule.STATIC, params, clusters)

    def k_range(self, at, k_steps):
        """The K steps [k0, k1) of tile `at`: all of them."""
        return 0, k_steps

    @cute.jit
    def produce(self, k, g, params, ring, inputs, k_steps, mcast):
        """The producer warp: every K step of this CTA's tiles, in order, into the ring."""
        load_stages = k._load_stages  # (kernel steps bound first: see the module docstring)
        tiles = schedule.Tiles.create(schedule.STATIC, params)
        work = tiles.first()
        state = ring.producer()
        while work.is_valid_tile:
            at = coord(work.tile_idx[0], work.tile_idx[1], work.tile_idx[2])
            k0, k1 = self.k_range(at, k_steps)
            state = load_stages(g, ring, inputs, state, at, k0, k1, mcast)
            work = tiles.next()
        ring.drain(state)

    @cute.jit
    def consume(self, k, g, params, ring, inputs, acc_state, consumer_smem, thread,
                k_steps):
        """The consumers: each tile's K steps from the ring, then `finish` it."""
        mma_stages, finish = k._mma_stages, k.finish
        tiles = schedule.Tiles.create(schedule.STATIC, params)
        work = tiles.first()
        read = ring.consumer()
        release = read.clone()
        while work.is_valid_tile:
            at = coord(work.tile_idx[0], work.tile_idx[1], work.tile_idx[2])
            k0, k1 = self.k_range(at, k_steps)
            read, release = mma_stages(g, ring, inputs, acc_state, read, release, k0, k1)
            finish(g, acc_state, at, consumer_smem, thread)
            work = tiles.next()
        k.finish_tail()


class SplitK(WholeTiles):
    """Whole tiles whose K steps are cut into `splits` contiguous ranges: the kernel launches
    over (m_tiles, n_tiles, splits) work units and unit `at` takes tile (at.r, at.c)'s range
    at.b, steps [at.b * k_steps // splits, (at.b + 1) * k_steps // splits) (none empty: the
    host keeps splits <= k_steps). The kernel loads its operands at batch 0 and writes each
    unit's partial tile to plane at.b of its output, which a second kernel sums (the dense
    GEMM's split-K: few tiles over a long K)."""

    def __init__(self, splits: int):
        self.splits = splits

    def k_range(self, at, k_steps):
        return at.b * k_steps // self.splits, (at.b + 1) * k_steps // self.splits


class LCF:
    """Base class of load-compute-finish kernels; see the module docstring."""

    NUM_CONSUMERS = 2
    LOAD_PIPE_DEPTH = 4
    PRODUCER_REGISTERS = 40
    CONSUMER_REGISTERS = 232
    SUPERGROUP_SIZE = 8
    CLUSTER_M = 1
    CLUSTER_N = 1
    Mb = 128
    Nb = 256
    # Launched as a programmatic dependent (PDL) of the kernel before it on the stream: the
    # launch and everything up to the ring's initialization overlap that kernel's tail, then
    # every thread waits for it (`griddepcontrol.wait`) before reading global memory.
    PDL = False
    sched = WholeTiles()  # the kernel's schedule (module docstring), unless it sets another

    # --- what a kernel declares -----------------------------------------------------------
    def inputs(self) -> dict[str, st]:
        raise NotImplementedError

    def finish_tiles(self) -> dict[str, tuple[st, int]]:
        return {}

    def scratch_tiles(self) -> dict[str, tuple[st, int]]:
        return {}

    def consumer_tiles(self) -> dict[str, tuple[st, int]]:
        return {**self.scratch_tiles(), **self.finish_tiles()}

    # --- sizes ----------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return (1 + self.NUM_CONSUMERS) * warpgroup.WARPGROUP_THREADS

    def dynamic_shared_memory(self) -> int:
        """Bytes of shared memory the kernel allocates (ring + finish buffers + barriers)."""
        tiles = [(t, self.LOAD_PIPE_DEPTH) for t in self.inputs().values()]
        tiles += list(self.consumer_tiles().values())
        return smem_bytes(*tiles, barriers=2 * self.LOAD_PIPE_DEPTH)

    def stage_bytes(self) -> int:
        return sum(t.bytes for t in self.inputs().values())

    def fit_ring(self, requested: int, budget: int) -> int:
        """Set LOAD_PIPE_DEPTH to `requested` or, for 0, to the deepest ring of 2..8 stages
        whose `dynamic_shared_memory` fits `budget` bytes; ValueError when it does not fit."""
        def smem(depth):
            self.LOAD_PIPE_DEPTH = depth
            return self.dynamic_shared_memory()

        fits = [d for d in range(2, 9) if smem(d) <= budget]
        depth = requested or (max(fits) if fits else 2)
        if depth < 2 or smem(depth) > budget:
            raise ValueError(f"{depth} stages of {self.stage_bytes()} B need {smem(depth)} bytes "
                             f"of shared memory; the budget is {budget}")
        return depth

    # --- host -----------------------------------------------------------------------------
    def launch(self, g, m_tiles, n_tiles, batches, max_ctas: int, stream, ctas=None):
        """Launch over an (m_tiles, n_tiles, batches) grid of output tiles on at most
        `max_ctas` persistent CTAs (`ctas`: the stream-K layer's run-time grid)."""
        cluster = (self.CLUSTER_M, self.CLUSTER_N, 1)
        params = schedule.params(
            schedule.STATIC, (m_tiles, n_tiles, batches), cluster, self.SUPERGROUP_SIZE)
        self.kernel(g, params).launch(
            grid=self.grid(params, max_ctas, ctas), block=[self.threads, 1, 1], cluster=cluster,
            min_blocks_per_mp=1, stream=stream, use_pdl=self.PDL,
        )

    def grid(self, params, max_ctas: int, ctas):
        return self.sched.grid(self, params, max_ctas, ctas)

    # --- device ---------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, g, params: schedule.Params):
        warp_id = warp.warpid()
        group = warpgroup.groupid()
        if warp_id == 0:
            self.prefetch(g)

        cluster = cute.make_layout((self.CLUSTER_M, self.CLUSTER_N, 1))
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_at = cluster.get_flat_coord(rank)
        # A rows are shared along the cluster's N extent, B columns along its M extent.
        mcast = {
            "a": tma.Multicast(cluster_at[1], cute.make_layout(self.CLUSTER_N),
                               cute.make_layout_image_mask(cluster, cluster_at, mode=1)),
            "b": tma.Multicast(cluster_at[0], cute.make_layout(self.CLUSTER_M),
                               cute.make_layout_image_mask(cluster, cluster_at, mode=0)),
        }

        smem = Shared()
        ring = self._ring(smem.barriers(2 * self.LOAD_PIPE_DEPTH))
        inputs = {name: smem.alloc(tile, self.LOAD_PIPE_DEPTH)
                  for name, tile in self.inputs().items()}
        consumer_smem = {name: smem.alloc(t, n) for name, (t, n) in self.consumer_tiles().items()}
        k_steps = self.k_steps(g)
        pipeline.pipeline_init_wait(cluster_shape_mn=(self.CLUSTER_M, self.CLUSTER_N))
        if cutlass.const_expr(self.PDL):
            pdl.pdl_wait()

        if group == 0:
            warpgroup.decrease_registers(self.PRODUCER_REGISTERS)
            if warp_id == 0:
                self.produce(g, params, ring, inputs, k_steps, mcast)
        else:
            warpgroup.increase_registers(self.CONSUMER_REGISTERS)
            thread = cute.arch.thread_idx()[0] - warpgroup.WARPGROUP_THREADS
            acc_state = self.setup(g, thread, consumer_smem)
            self.consume(g, params, ring, inputs, acc_state, consumer_smem, thread, k_steps)

    @cute.jit
    def produce(self, g, params, ring, inputs, k_steps, mcast):
        """The producer warp's loop: the schedule's."""
        self.sched.produce(self, g, params, ring, inputs, k_steps, mcast)

    @cute.jit
    def consume(self, g, params, ring, inputs, acc_state, consumer_smem, thread, k_steps):
        """The consumers' loop: the schedule's."""
        self.sched.consume(self, g, params, ring, inputs, acc_state, consumer_smem, thread,
                              k_steps)

    @cute.jit
    def _load_stages(self, g, ring, inputs, state, at, k0, k1, mcast):
        """The producer's K steps k0 .. k1 - 1 of tile `at`: wait for a free stage, `load` it;
        returns the ring cursor."""
        for k in range(k0, k1):
            ring.wait_finished(state)
            stage = {n: s[None, None, state.index] for n, s in inputs.items()}
            self.load(g, stage, at, k, ring.arrived(state), mcast)
            ring.arrive(state)
            state.advance()
        return state

    @cute.jit
    def _mma_stages(self, g, ring, inputs, acc_state, read, release, k0, k1):
        """The consumers' K steps k0 .. k1 - 1 of one tile: `compute` each landed stage, free
        the one before once at most one batch of MMAs runs, the last once all are done;
        returns the ring cursors (read, release)."""
        warpgroup.mma_fence()
        for k in range(k0, k1):
            ring.wait_arrived(read)
            stage = {n: s[None, None, read.index] for n, s in inputs.items()}
            self.compute(g, acc_state, stage, k)
            warpgroup.mma_commit_group()
            read.advance()
            if k > k0:  # the previous stage's MMAs are done once at most one batch runs
                warpgroup.mma_async_wait(1)
                ring.finish(release)
                release.advance()
        warpgroup.mma_async_wait(0)
        ring.finish(release)
        release.advance()
        return read, release

    def _ring(self, barriers):
        """The stage ring (`stage_ring`). Every consumer warp frees a stage once per CTA that
        multicast into it."""
        mcast_ctas = self.CLUSTER_M + self.CLUSTER_N - 1
        ring = stage_ring.tma_to_threads(
            barriers, self.LOAD_PIPE_DEPTH, self.stage_bytes(),
            mcast_ctas * self.NUM_CONSUMERS * 4,
            cute.make_layout((1, self.CLUSTER_M, self.CLUSTER_N, 1)))
        pipeline.pipeline_init_arrive(
            cluster_shape_mn=(self.CLUSTER_M, self.CLUSTER_N), is_relaxed=True)
        return ring

    # --- hooks with defaults --------------------------------------------------------------
    def prefetch(self, g):
        pass

    def k_steps(self, g):
        raise NotImplementedError

    def finish_tail(self):
        """Runs once after a consumer's last tile (wait for outstanding stores)."""
        tma.store_async_read_wait(0)

