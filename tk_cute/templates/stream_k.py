"""Stream-K on the load-compute-finish template: `StreamK` is a schedule (`LCF.sched`) whose
grid and loops split the (tile x K-step) units between CTAs instead of giving each CTA whole
tiles (`lcf.WholeTiles`).

A kernel offers stream-K by holding one (`self.sched = StreamK(...)` in its constructor, from
its config): the kernel's steps (`load`, `setup`, `compute`, `finish`) are the same; the
schedule owns the grid, `produce` and `consume`. The kernel names its accumulator tile
(`accumulator(state)`), puts `partials` and `flags` pointers in its globals and launches with
the host's `ctas`; kernels without stream-K carry none of this.

The shares (no clusters): the CTAs take equal contiguous shares of the (tile x K-step) units in
supergroup tile order (`schedule.stream_k_share`) on a grid of `ctas` CTAs the host picks
(`schedule.stream_k_grid`; 1 <= ctas <= min(units, SMs): no share empty). A share's first tile,
if it starts inside it, is that tile's tail; a share inside one tile is a middle part: either
way the consumers hand its sums to the tile's head (the end of the share the tile starts in)
through `store_partial` (the fp32 accumulators to the CTA's slot of `g.partials`,
`partial_bytes` each) and a flag `g.flags[slot]` (released after a named barrier of the
consumers); the head waits for the flags of the CTAs after it that hold the rest of the tile
(acquired), `add_partial`s their slots in CTA order, clears the flags for the next launch and
`finish`es. Every CTA writes at most one partial (its first segment), every head ends its CTA's
share, and tails and middle parts wait for nothing, so a head waits only for later CTAs to have
started: with one CTA per SM all are resident, and where fewer SMs are free (other work), CTAs
dispatched in index order still progress (every CTA below the highest resident one finds its
partners started, finishes and frees an SM for the next). The sum is head + the parts in CTA
order, the same on every run (not bit for bit whole tiles' single sum).
Stream-K teams (`StreamK(teams=True)`, on `schedule.stream_k_team_grid`: every tile in `team` = 2
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

from tk_cute.ops import memory, register, schedule, warp, warpgroup
from tk_cute.types.semaphore import NamedBarrier


class StreamK:
    """The stream-K schedule of an `LCF` kernel; see the module docstring. Its methods take
    the kernel (`k`) whose steps they run."""

    def __init__(self, partial_v4: bool = False, teams: bool = False):
        # Stream-K partial sums moved as 16-byte vectors of 4 consecutive accumulator
        # elements (one instruction per 4 elements) instead of one 4-byte access per element.
        self.partial_v4 = partial_v4
        # Stream-K teams (module docstring): every tile in the same number of shares (the
        # host's `schedule.stream_k_team_grid`), each finishing some consumer warps' rows of
        # it. Needs a `finish` whose warps write their own rows without each other.
        self.teams = teams

    def grid(self, k, params, max_ctas: int, ctas):
        """The host's `ctas` CTAs (`schedule.stream_k_grid` / `stream_k_team_grid`)."""
        if k.CLUSTER_M * k.CLUSTER_N != 1:
            raise ValueError(f"stream-K runs without clusters, got CLUSTER_M="
                             f"{k.CLUSTER_M}, CLUSTER_N={k.CLUSTER_N}")
        return [ctas, 1, 1]

    @cute.jit
    def produce(self, k, g, params, ring, inputs, k_steps, mcast):
        """The producer warp: the K steps of this CTA's share's segments, in order, into the
        ring."""
        load_stages = k._load_stages  # (kernel steps bound first: `templates.lcf`)
        shares = schedule.Shares(params, k_steps)
        state = ring.producer()
        u, end = shares.bounds()
        while u < end:
            at, k0, k1 = shares.segment(u, end)
            state = load_stages(g, ring, inputs, state, at, k0, k1, mcast)
            u = u + k1 - k0
        ring.drain(state)

    @cute.jit
    def consume(self, k, g, params, ring, inputs, acc_state, consumer_smem, thread, k_steps):
        """The consumers: a team's part (`teams`) or the share's segments."""
        if cutlass.const_expr(self.teams):
            self._consume_team(k, g, params, ring, inputs, acc_state, consumer_smem, thread,
                               k_steps)
        else:
            self._consume_shares(k, g, params, ring, inputs, acc_state, consumer_smem, thread,
                                 k_steps)

    @cute.jit
    def _consume_shares(self, k, g, params, ring, inputs, acc_state, consumer_smem, thread,
                        k_steps):
        """Stream-K consumers: each segment of the share as the tile loop's body; a tail or
        middle part hands its sums over, a head takes the later CTAs' (module docstring)."""
        mma_stages, finish = k._mma_stages, k.finish
        shares = schedule.Shares(params, k_steps)
        cta, k_steps = shares.cta, shares.k_steps
        consumers = warpgroup.sync(NamedBarrier.PARTIALS, k.NUM_CONSUMERS)
        read = ring.consumer()
        release = read.clone()
        u, end = shares.bounds()
        while u < end:
            at, k0, k1 = shares.segment(u, end)
            read, release = mma_stages(g, ring, inputs, acc_state, read, release, k0, k1)
            if k0 > 0:
                self._hand_over(k, g, acc_state, cta, thread, consumers)
            else:
                if k1 < k_steps:  # the tile's head: CTAs cta + 1 .. last hold the rest
                    last = shares.owner(u - k0 + k_steps - 1)
                    self._take_over(k, g, acc_state, cta, last, thread, consumers)
                finish(g, acc_state, at, consumer_smem, thread)
            u = u + k1 - k0
        k.finish_tail()

    @cute.jit
    def _consume_team(self, k, g, params, ring, inputs, acc_state, consumer_smem, thread, k_steps):
        """Stream-K teams (`teams`): this CTA's share is part `part` of one tile's
        `team` equal parts. Consumer warp w finishes its rows here when w % team == part,
        adding the team's other parts of them in CTA order; else it hands its rows to that
        part's CTA (its slot, its flag: the same lanes' fragments on every CTA)."""
        finish = k.finish
        shares = schedule.Shares(params, k_steps)
        cta = shares.cta
        team = cutlass.Int32(shares.ctas // (shares.units // shares.k_steps))
        part = cta % team
        u, end = shares.bounds()
        read = ring.consumer()
        release = read.clone()
        at, k0, k1 = shares.segment(u, end)
        read, release = k._mma_stages(g, ring, inputs, acc_state, read, release, k0, k1)
        w = thread // 32
        lane = thread % 32
        if w % team == part:
            self._team_take(k, g, acc_state, cta - part, team, part, w, thread)
            finish(g, acc_state, at, consumer_smem, thread)
        else:
            self.store_partial(k, g, acc_state, cta, thread)
            warp.sync()  # (bar.warp.sync: the lanes' stores are ordered before the release)
            if lane == 0:
                memory.st_release_u32(self._team_flag(g, cta, w), cutlass.Uint32(1))
        k.finish_tail()

    @cute.jit
    def _team_take(self, k, g, acc_state, first, team, part, w, thread):
        """Warp w: wait for the other parts' flags of its rows (acquired), add their slots in
        CTA order, clear the flags for the next launch."""
        if thread % 32 == 0:
            for j in range(team):
                if j != part:
                    self._await_flag(self._team_flag(g, first + j, w))
        warp.sync()
        for j in range(team):
            if j != part:
                self.add_partial(k, g, acc_state, first + j, thread)
        warp.sync()
        if thread % 32 == 0:
            for j in range(team):
                if j != part:
                    memory.st_u32(self._team_flag(g, first + j, w), cutlass.Uint32(0))

    def _team_flag(self, g, cta, w):
        """Address of CTA `cta`'s hand-over flag for consumer warp w's rows (TEAM_MAX each)."""
        return self._flag(g, cutlass.Int64(cta) * schedule.TEAM_MAX + w)

    @cute.jit
    def _hand_over(self, k, g, acc_state, cta, thread, consumers):
        """A tail or middle part: its sums to this CTA's slot, then (every consumer done) the
        released flag."""
        self.store_partial(k, g, acc_state, cta, thread)
        consumers()
        if thread == 0:
            memory.st_release_u32(self._flag(g, cta), cutlass.Uint32(1))

    @cute.jit
    def _take_over(self, k, g, acc_state, cta, last, thread, consumers):
        """A head: wait for the flags of CTAs cta + 1 .. last (acquired), add their slots in
        that order, clear the flags for the next launch."""
        if thread == 0:
            for c in range(cta + 1, last + 1):
                self._await_flag(self._flag(g, c))
        consumers()
        for c in range(cta + 1, last + 1):
            self.add_partial(k, g, acc_state, c, thread)
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

    @cute.jit
    def store_partial(self, k, g, state, slot, thread):
        """The accumulators (a tail or middle part of a tile) to partial slot `slot`,
        then zero them."""
        acc = k.accumulator(state)
        v = self._partial_vector(acc)
        for i in cutlass.range_constexpr(0, cute.size(acc.frag), v):
            addr = self._partial_addr(k, g, slot, i, thread)
            if cutlass.const_expr(v == 4):
                memory.st_v4_f32(addr, [acc.frag[i + j] for j in range(4)])
            else:
                memory.st_cvt(addr, acc.frag[i], "float32")
        register.zero(acc)

    @cute.jit
    def add_partial(self, k, g, state, slot, thread):
        """Add partial slot `slot` (a later CTA's part of the tile, `store_partial`'s
        order) to the accumulators."""
        acc = k.accumulator(state)
        v = self._partial_vector(acc)
        for i in cutlass.range_constexpr(0, cute.size(acc.frag), v):
            addr = self._partial_addr(k, g, slot, i, thread)
            if cutlass.const_expr(v == 4):
                part = memory.ld_v4_f32(addr)
                for j in cutlass.range_constexpr(4):
                    acc.frag[i + j] = acc.frag[i + j] + part[j]
            else:
                acc.frag[i] = acc.frag[i] + memory.ld_f32(addr)

    def _partial_vector(self, acc) -> int:
        """Accumulator elements per partial access: 4 with `partial_v4` (the fragment holds
        whole vectors), else 1."""
        if not self.partial_v4:
            return 1
        assert cute.size(acc.frag) % 4 == 0, "partial_v4 needs whole 4-element vectors"
        return 4

    def _partial_addr(self, k, g, slot, i, thread):
        """Address of accumulator element i of consumer thread `thread` in partial slot
        `slot`: word i * threads + thread (each warp's scalar stores one 128-byte line), or with
        `partial_v4` the vector of elements i .. i + 3 at 16 * (i / 4 * threads + thread) (each
        warp's vector stores 512 contiguous bytes)."""
        threads = k.NUM_CONSUMERS * warpgroup.WARPGROUP_THREADS
        base = g.partials.toint() + cutlass.Int64(slot) * partial_bytes(k.Mb, k.Nb)
        if self.partial_v4:
            return base + 16 * (i // 4 * threads + thread)
        return base + 4 * (i * threads + thread)


def partial_bytes(Mb: int, Nb: int) -> int:
    """Bytes of one stream-K partial slot: an Mb x Nb tile of fp32 sums."""
    return Mb * Nb * 4
