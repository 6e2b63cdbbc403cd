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
full/empty mbarriers (`cutlass.pipeline.PipelineTmaAsync`: TK's inputs_arrived /
inputs_finished; the expected transaction bytes are the stage's tile bytes); a persistent grid
over output tiles in supergroup order (`ops/schedule.py`, shared with the Blackwell/Rubin
kernels: SUPERGROUP_SIZE tile rows per group, so concurrently running CTAs share A and B panels
in L2); optional clusters
(CLUSTER_M x CLUSTER_N) whose CTAs multicast the shared A rows / B columns.
Stream-K (`STREAM_K`, no clusters): the CTAs take equal contiguous shares of the (tile x
K-step) units in supergroup tile order (`schedule.stream_k_share`) on a grid of `ctas` CTAs
the host picks (`schedule.stream_k_grid`; 1 <= ctas <= min(units, SMs): no share empty). A
share's first tile, if it starts inside it, is that tile's tail; a share inside one tile is a
middle part: either way the consumers hand its sums to the tile's head (the end of the share
the tile starts in) through `store_partial` (the fp32 accumulators to the CTA's slot of
`g.partials`, `partial_bytes` each) and a flag `g.flags[slot]` (released after a named barrier
of the consumers); the head waits for the flags of the CTAs after it that hold the rest of the
tile (acquired), `add_partial`s their slots in CTA order, clears the flags for the next launch
and `finish`es. Every CTA writes at most one partial (its first segment), every head ends its
CTA's share, and tails and middle parts wait for nothing, so a head waits only for later CTAs
to have started: with one CTA per SM all are resident, and where fewer SMs are free (other
work), CTAs dispatched in index order still progress (every CTA below the highest resident one
finds its partners started, finishes and frees an SM for the next). The sum is head + the
parts in CTA order, the same on every run (not bit for bit whole tiles' single sum). A kernel
with stream-K names its accumulator tile (`accumulator(state)`) and puts `partials` and
`flags` pointers in its globals. With `STREAM_K_DP` each CTA first runs its whole tiles of the
waves the tiles fill (`schedule.stream_k_dp_tiles`: tiles c, c + ctas, ..., finished directly)
and the shares split only the last partial wave's units: the same hand-over, with CTAs that
each reach their share after the same number of whole tiles.
Stream-K teams (`STREAM_K_TEAMS`, on `schedule.stream_k_team_grid`: every tile in `team` = 2
to TEAM_MAX equal shares, CTA team * T + p holding part p of tile T; the parts end together):
rather than one head adding all the other parts and writing all of D's tile, consumer warp w of
part w % team finishes its 16 rows, adding the other parts of them in CTA order, and every other
warp hands its rows to that part (its fragment to the CTA's slot, then a flag per CTA and warp,
released after `bar.warp.sync`). Per CTA about 1 / team of the epilogue and (team - 1) / team
of a slot's bytes stored and loaded, where a head loads team - 1 slots. With two parts the sums
are the same (a + b = b + a in fp32: D bit for bit the head-takes-all hand-over's); with more,
the owner's part comes first (deterministic, the same error bound).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from tk_cute.ops import cluster as pdl
from tk_cute.ops import memory, register, schedule, tma, warp, warpgroup
from tk_cute.types.gl import coord
from tk_cute.types.rt import rt
from tk_cute.types.semaphore import NamedBarrier, stage_ring
from tk_cute.types.st import Shared, smem_bytes, st


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
    # Equal shares of the (tile x K-step) units instead of whole tiles (module docstring)
    STREAM_K = False
    # Stream-K partial sums moved as 16-byte vectors of 4 consecutive accumulator elements
    # (one instruction per 4 elements) instead of one 4-byte access per element
    PARTIAL_V4 = False
    # Stream-K teams (module docstring): every tile in the same number of shares (the host's
    # `schedule.stream_k_team_grid`), each finishing some consumer warps' rows of it. Needs a
    # `finish` whose warps write their own rows without each other.
    STREAM_K_TEAMS = False
    # Stream-K after data-parallel waves (`schedule.stream_k_dp_tiles`): every CTA first runs
    # whole tiles, a wave of one per CTA at a time, and only the last partial wave is shared
    STREAM_K_DP = False

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
        `max_ctas` persistent CTAs; with STREAM_K on `ctas` (run time, checked by the host)."""
        cluster = (self.CLUSTER_M, self.CLUSTER_N, 1)
        params = schedule.params(
            schedule.STATIC, (m_tiles, n_tiles, batches), cluster, self.SUPERGROUP_SIZE)
        grid = schedule.grid(schedule.STATIC, params, max_ctas // (self.CLUSTER_M * self.CLUSTER_N))
        if self.STREAM_K:
            if self.CLUSTER_M * self.CLUSTER_N != 1:
                raise ValueError(f"stream-K runs without clusters, got CLUSTER_M="
                                 f"{self.CLUSTER_M}, CLUSTER_N={self.CLUSTER_N}")
            grid = [ctas, 1, 1]
        self.kernel(g, params).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=cluster, min_blocks_per_mp=1,
            stream=stream, use_pdl=self.PDL,
        )

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
            if cutlass.const_expr(self.STREAM_K):
                if warp_id == 0:
                    shares = schedule.Shares(params, k_steps, self.STREAM_K_DP)
                    state = pipeline.make_pipeline_state(
                        pipeline.PipelineUserType.Producer, self.LOAD_PIPE_DEPTH)
                    if cutlass.const_expr(self.STREAM_K_DP):
                        for j in cutlass.range(shares.dp_waves(), unroll=1):
                            at, k0, k1 = shares.dp_tile(j)
                            state = self._load_stages(g, ring, inputs, state, at, k0, k1,
                                                      mcast)
                    u, end = shares.bounds()
                    while u < end:
                        at, k0, k1 = shares.segment(u, end)
                        state = self._load_stages(g, ring, inputs, state, at, k0, k1, mcast)
                        u = u + k1 - k0
                    ring.producer_tail(state)
            elif warp_id == 0:
                tiles = schedule.Tiles.create(schedule.STATIC, params)
                work = tiles.first()
                state = pipeline.make_pipeline_state(
                    pipeline.PipelineUserType.Producer, self.LOAD_PIPE_DEPTH)
                while work.is_valid_tile:
                    at = coord(work.tile_idx[0], work.tile_idx[1], work.tile_idx[2])
                    state = self._load_stages(g, ring, inputs, state, at, 0, k_steps, mcast)
                    work = tiles.next()
                ring.producer_tail(state)
        else:
            warpgroup.increase_registers(self.CONSUMER_REGISTERS)
            thread = cute.arch.thread_idx()[0] - warpgroup.WARPGROUP_THREADS
            acc_state = self.setup(g, thread, consumer_smem)
            if cutlass.const_expr(self.STREAM_K and self.STREAM_K_TEAMS):
                self._consume_team(g, params, ring, inputs, acc_state, consumer_smem, thread,
                                   k_steps)
            elif cutlass.const_expr(self.STREAM_K):
                self._consume_shares(g, params, ring, inputs, acc_state, consumer_smem, thread,
                                     k_steps)
            else:
                tiles = schedule.Tiles.create(schedule.STATIC, params)
                work = tiles.first()
                read = pipeline.make_pipeline_state(
                    pipeline.PipelineUserType.Consumer, self.LOAD_PIPE_DEPTH)
                release = read.clone()
                while work.is_valid_tile:
                    at = coord(work.tile_idx[0], work.tile_idx[1], work.tile_idx[2])
                    read, release = self._mma_stages(g, ring, inputs, acc_state, read, release,
                                                     0, k_steps)
                    self.finish(g, acc_state, at, consumer_smem, thread)
                    work = tiles.next()
                self.finish_tail()

    @cute.jit
    def _load_stages(self, g, ring, inputs, state, at, k0, k1, mcast):
        """The producer's K steps k0 .. k1 - 1 of tile `at`: wait for a free stage, `load` it;
        returns the ring cursor."""
        for k in range(k0, k1):
            ring.producer_acquire(state)
            stage = {n: s[None, None, state.index] for n, s in inputs.items()}
            self.load(g, stage, at, k, ring.producer_get_barrier(state), mcast)
            ring.producer_commit(state)
            state.advance()
        return state

    @cute.jit
    def _mma_stages(self, g, ring, inputs, acc_state, read, release, k0, k1):
        """The consumers' K steps k0 .. k1 - 1 of one tile: `compute` each landed stage, free
        the one before once at most one batch of MMAs runs, the last once all are done;
        returns the ring cursors (read, release)."""
        warpgroup.mma_fence()
        for k in range(k0, k1):
            ring.consumer_wait(read)
            stage = {n: s[None, None, read.index] for n, s in inputs.items()}
            self.compute(g, acc_state, stage, k)
            warpgroup.mma_commit_group()
            read.advance()
            if k > k0:  # the previous stage's MMAs are done once at most one batch runs
                warpgroup.mma_async_wait(1)
                ring.consumer_release(release)
                release.advance()
        warpgroup.mma_async_wait(0)
        ring.consumer_release(release)
        release.advance()
        return read, release

    @cute.jit
    def _consume_shares(self, g, params, ring, inputs, acc_state, consumer_smem, thread,
                        k_steps):
        """Stream-K consumers: each segment of the share as the tile loop's body; a tail or
        middle part hands its sums over, a head takes the later CTAs' (module docstring)."""
        shares = schedule.Shares(params, k_steps, self.STREAM_K_DP)
        cta, k_steps = shares.cta, shares.k_steps
        consumers = warpgroup.sync(NamedBarrier.PARTIALS, self.NUM_CONSUMERS)
        read = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.LOAD_PIPE_DEPTH)
        release = read.clone()
        if cutlass.const_expr(self.STREAM_K_DP):  # whole tiles first
            for j in cutlass.range(shares.dp_waves(), unroll=1):
                at, k0, k1 = shares.dp_tile(j)
                read, release = self._mma_stages(g, ring, inputs, acc_state, read, release, k0,
                                                 k1)
                self.finish(g, acc_state, at, consumer_smem, thread)
        u, end = shares.bounds()
        while u < end:
            at, k0, k1 = shares.segment(u, end)
            read, release = self._mma_stages(g, ring, inputs, acc_state, read, release, k0, k1)
            if k0 > 0:
                self._hand_over(g, acc_state, cta, thread, consumers)
            else:
                if k1 < k_steps:  # the tile's head: CTAs cta + 1 .. last hold the rest
                    last = shares.owner(u - k0 + k_steps - 1)
                    self._take_over(g, acc_state, cta, last, thread, consumers)
                self.finish(g, acc_state, at, consumer_smem, thread)
            u = u + k1 - k0
        self.finish_tail()

    @cute.jit
    def _consume_team(self, g, params, ring, inputs, acc_state, consumer_smem, thread, k_steps):
        """Stream-K teams (STREAM_K_TEAMS): this CTA's share is part `part` of one tile's
        `team` equal parts. Consumer warp w finishes its rows here when w % team == part,
        adding the team's other parts of them in CTA order; else it hands its rows to that
        part's CTA (its slot, its flag: the same lanes' fragments on every CTA)."""
        shares = schedule.Shares(params, k_steps)
        cta = shares.cta
        team = cutlass.Int32(shares.ctas // (shares.units // shares.k_steps))
        part = cta % team
        u, end = shares.bounds()
        read = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.LOAD_PIPE_DEPTH)
        release = read.clone()
        at, k0, k1 = shares.segment(u, end)
        read, release = self._mma_stages(g, ring, inputs, acc_state, read, release, k0, k1)
        w = thread // 32
        lane = thread % 32
        if w % team == part:
            self._team_take(g, acc_state, cta - part, team, part, w, thread)
            self.finish(g, acc_state, at, consumer_smem, thread)
        else:
            self.store_partial(g, acc_state, cta, thread)
            warp.sync()  # (bar.warp.sync: the lanes' stores are ordered before the release)
            if lane == 0:
                memory.st_release_u32(self._team_flag(g, cta, w), cutlass.Uint32(1))
        self.finish_tail()

    @cute.jit
    def _team_take(self, g, acc_state, first, team, part, w, thread):
        """Warp w: wait for the other parts' flags of its rows (acquired), add their slots in
        CTA order, clear the flags for the next launch."""
        if thread % 32 == 0:
            for j in range(team):
                if j != part:
                    self._await_flag(self._team_flag(g, first + j, w))
        warp.sync()
        for j in range(team):
            if j != part:
                self.add_partial(g, acc_state, first + j, thread)
        warp.sync()
        if thread % 32 == 0:
            for j in range(team):
                if j != part:
                    memory.st_u32(self._team_flag(g, first + j, w), cutlass.Uint32(0))

    def _team_flag(self, g, cta, w):
        """Address of CTA `cta`'s hand-over flag for consumer warp w's rows (TEAM_MAX each)."""
        return self._flag(g, cutlass.Int64(cta) * schedule.TEAM_MAX + w)

    @cute.jit
    def _hand_over(self, g, acc_state, cta, thread, consumers):
        """A tail or middle part: its sums to this CTA's slot, then (every consumer done) the
        released flag."""
        self.store_partial(g, acc_state, cta, thread)
        consumers()
        if thread == 0:
            memory.st_release_u32(self._flag(g, cta), cutlass.Uint32(1))

    @cute.jit
    def _take_over(self, g, acc_state, cta, last, thread, consumers):
        """A head: wait for the flags of CTAs cta + 1 .. last (acquired), add their slots in
        that order, clear the flags for the next launch."""
        if thread == 0:
            for c in range(cta + 1, last + 1):
                self._await_flag(self._flag(g, c))
        consumers()
        for c in range(cta + 1, last + 1):
            self.add_partial(g, acc_state, c, thread)
        consumers()
        if thread == 0:
            for c in range(cta + 1, last + 1):
                memory.st_u32(self._flag(g, c), cutlass.Uint32(0))

    @cute.jit
    def _await_flag(self, addr):
        """Spin until the hand-over flag at `addr` is set (acquired: the slot it guards is
        then visible)."""
        ready = memory.ld_acquire_u32(addr)
        while ready == 0:
            ready = memory.ld_acquire_u32(addr)

    def _flag(self, g, cta):
        """Address of CTA `cta`'s hand-over flag."""
        return g.flags.toint() + 4 * cutlass.Int64(cta)

    def accumulator(self, state) -> rt:
        """Stream-K: the consumer state's accumulator tile (its fp32 sums hand over)."""
        return state

    @cute.jit
    def store_partial(self, g, state, slot, thread):
        """Stream-K: the accumulators (a tail or middle part of a tile) to partial slot `slot`,
        then zero them."""
        acc = self.accumulator(state)
        v = self._partial_vector(acc)
        for i in cutlass.range_constexpr(0, cute.size(acc.frag), v):
            addr = self._partial_addr(g, slot, i, thread)
            if cutlass.const_expr(v == 4):
                memory.st_v4_f32(addr, [acc.frag[i + j] for j in range(4)])
            else:
                memory.st_cvt(addr, acc.frag[i], "float32")
        register.zero(acc)

    @cute.jit
    def add_partial(self, g, state, slot, thread):
        """Stream-K: add partial slot `slot` (a later CTA's part of the tile, `store_partial`'s
        order) to the accumulators."""
        acc = self.accumulator(state)
        v = self._partial_vector(acc)
        for i in cutlass.range_constexpr(0, cute.size(acc.frag), v):
            addr = self._partial_addr(g, slot, i, thread)
            if cutlass.const_expr(v == 4):
                part = memory.ld_v4_f32(addr)
                for j in cutlass.range_constexpr(4):
                    acc.frag[i + j] = acc.frag[i + j] + part[j]
            else:
                acc.frag[i] = acc.frag[i] + memory.ld_f32(addr)

    def _partial_vector(self, acc) -> int:
        """Accumulator elements per partial access: 4 with PARTIAL_V4 (the fragment holds
        whole vectors), else 1."""
        if not self.PARTIAL_V4:
            return 1
        assert cute.size(acc.frag) % 4 == 0, "PARTIAL_V4 needs whole 4-element vectors"
        return 4

    def _partial_addr(self, g, slot, i, thread):
        """Address of accumulator element i of consumer thread `thread` in partial slot
        `slot`: word i * threads + thread (each warp's scalar stores one 128-byte line), or with
        PARTIAL_V4 the vector of elements i .. i + 3 at 16 * (i / 4 * threads + thread) (each
        warp's vector stores 512 contiguous bytes)."""
        threads = self.NUM_CONSUMERS * warpgroup.WARPGROUP_THREADS
        base = g.partials.toint() + cutlass.Int64(slot) * partial_bytes(self.Mb, self.Nb)
        if self.PARTIAL_V4:
            return base + 16 * (i // 4 * threads + thread)
        return base + 4 * (i * threads + thread)

    def _ring(self, barriers):
        """The stage ring's full/empty barriers. Every consumer warp releases a stage once per
        CTA that multicast into it."""
        mcast_ctas = self.CLUSTER_M + self.CLUSTER_N - 1
        ring = stage_ring.tma_to_threads(
            barriers, self.LOAD_PIPE_DEPTH, self.stage_bytes(),
            mcast_ctas * self.NUM_CONSUMERS * 4,
            cute.make_layout((1, self.CLUSTER_M, self.CLUSTER_N, 1)))
        pipeline.pipeline_init_arrive(
            cluster_shape_mn=(self.CLUSTER_M, self.CLUSTER_N), is_relaxed=True)
        return ring.pipe

    # --- hooks with defaults --------------------------------------------------------------
    def prefetch(self, g):
        pass

    def k_steps(self, g):
        raise NotImplementedError

    def finish_tail(self):
        """Runs once after a consumer's last tile (wait for outstanding stores)."""
        tma.store_async_read_wait(0)


def partial_bytes(Mb: int, Nb: int) -> int:
    """Bytes of one stream-K partial slot: an Mb x Nb tile of fp32 sums."""
    return Mb * Nb * 4
