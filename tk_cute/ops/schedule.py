# SPDX-License-Identifier: MIT
"""Persistent tile schedulers in TK terms: static supergroup order, or cluster launch control.

`STATIC` (Hopper and Blackwell/Rubin): a persistent grid of at most `max_clusters` clusters;
each strides through the linear cluster index (`StaticScheduler`: blockIdx.z, + gridDim.z).
`CLC` (sm_100a, sm_103a, sm_107a): the grid covers every tile; when a cluster finishes a tile
its scheduler warp (CTA 0 of the cluster) issues `clusterlaunchcontrol.try_cancel.multicast`
and steals a cluster that has not started (dynamic work stealing, TK's CLC scheduler). The
16-byte response lands in every CTA's shared memory through a one-stage
`PipelineClcFetchAsync`; every warp that walks tiles waits on it.

Both kinds map the linear cluster index to a tile in TK's supergroup order (`supergroup_coord`):
groups of `supergroup` cluster rows along M, M fastest inside a group, the last group as many
rows as are left. Both walkers are tk_cute's (the wheel's persistent schedulers are deprecated
copies of CUTLASS examples; their swizzle, `swizzle_size > 1`, rounded the cluster count along
N up and handed out the padding as valid tiles, and under CLC never the last real tiles).

Stream-K (`stream_k_share`, `stream_k_owner`; in a kernel, `Shares`): a grid of `ctas`
persistent CTAs splits the flattened (tile x K step) units into equal contiguous shares, so no
wave is left part-empty whatever the tile count; a tile whose units span several CTAs gets one
partial sum per CTA, to be reduced in CTA order (deterministic); CTA c's partial of tile t may
be kept at slot c + t (every pair its own slot, `stream_k_slots` of them).
`stream_k_grid` is the grid of a kernel whose CTAs each keep at most one partial (`StreamK`;
the host's picks of grids and tiles are `tk_cute.tuning`). Plain integer arithmetic, the same
on the host and in a kernel.

Split K (`k_split`): a tile's K steps in equal runs, each run a work unit of its own whose
partial D the caller sums (a batch coordinate l * splits + s).

Every role writes the same loop for both kinds:
    tiles = Tiles.create(*walk(kind, params, clc_barriers, clc_response, cluster, walkers))
    work = tiles.first()
    while work.is_valid_tile: ...; work = tiles.next()
"""

from __future__ import annotations


import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cutlass_dsl import Int32, extract_mlir_values, new_from_mlir_values
from cutlass.cutlass_dsl import min as cutlass_min
from cutlass.utils import WorkTileInfo

from tk_cute.types.gl import coord
from tk_cute.types.struct import DeviceStruct

STATIC, CLC = "static", "clc"
KINDS = (STATIC, CLC)
CLC_RESPONSE_BYTES = 16  # x, y, z of the stolen cluster's first CTA, and a valid bit


class Params:
    """Scheduler parameters: the problem's clusters along M, N, L (device integers; every
    cluster index a real tile, nothing padded), the cluster shape (static) and the supergroup
    size (clusters along M per group) the walk applies."""

    def __init__(self, clusters_mnl, cluster_mn, supergroup: int):
        self.clusters, self.cluster_mn = tuple(clusters_mnl), tuple(cluster_mn)
        self.supergroup = supergroup

    def total(self):
        """Clusters in the problem."""
        m, n, l = self.clusters
        return m * n * l

    def __extract_mlir_values__(self):
        return extract_mlir_values(list(self.clusters))

    def __new_from_mlir_values__(self, values):
        return Params(new_from_mlir_values(list(self.clusters), values), self.cluster_mn,
                      self.supergroup)


def params(kind: str, tiles_mnl, cluster_mnk, supergroup: int) -> Params:
    """Scheduler parameters (host): tiles per (M, N, L) in CTA tiles, `supergroup` clusters
    along M per group (the same for both kinds)."""
    if kind not in KINDS:
        raise ValueError(f"scheduler kind {kind!r} not in {KINDS}")
    if not isinstance(supergroup, int) or supergroup < 1:
        raise ValueError(f"supergroup must be an int >= 1, got {supergroup!r}")
    cm, cn = cluster_mnk[:2]
    m, n, l = tiles_mnl
    return Params(((m + cm - 1) // cm, (n + cn - 1) // cn, l), (cm, cn), supergroup)


def grid(kind: str, sched_params: Params, max_clusters):
    """Launch grid: every cluster of the problem in (M, N, L) (CLC steals the ones that have
    not started), or (cluster M, cluster N, persistent clusters) with at most `max_clusters`
    (static: each walks cluster indices blockIdx.z, + gridDim.z, ...)."""
    (m, n, l), (cm, cn) = sched_params.clusters, sched_params.cluster_mn
    if kind == CLC:
        return (m * cm, n * cn, l)
    return (cm, cn, cutlass_min(sched_params.total(), max_clusters))


def supergroup_coord(k, clusters_m, clusters_n, supergroup: int, min_=cutlass_min):
    """Linear cluster index `k` in [0, clusters_m * clusters_n * L) -> cluster (m, n, l), TK's
    supergroup order: a bijection onto the clusters of the problem, nothing padded. Works on
    Python ints (tests) and on device integers."""
    per_l = clusters_m * clusters_n
    l, r = k // per_l, k % per_l
    g = r // (supergroup * clusters_n)  # group of `supergroup` cluster rows
    rows = min_(supergroup, clusters_m - g * supergroup)  # the last group may be shorter
    q = r - g * supergroup * clusters_n
    return g * supergroup + q % rows, q // rows, l


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


def _cta_in_cluster(block_idx, cluster_mn):
    return (block_idx[0] % cluster_mn[0], block_idx[1] % cluster_mn[1])


class _Carried:
    """A walker whose device values the DSL's while loops carry: `_values()` lists its
    constructor's arguments in order (each a DSL value, or a list or struct of them)."""

    def __extract_mlir_values__(self):
        return [v for x in self._values() for v in extract_mlir_values(x)]

    def __new_from_mlir_values__(self, values):
        out, i = [], 0
        for x in self._values():
            n = len(extract_mlir_values(x))
            out.append(new_from_mlir_values(x, values[i:i + n]))
            i += n
        return type(self)(*out)


class StaticScheduler(_Carried):
    """One warp's static persistent walk: cluster index blockIdx.z, then + gridDim.z, until
    past the problem's clusters (`grid`)."""

    def __init__(self, params: Params, index, stride, cta_in_cluster):
        self.params, self.index, self.stride = params, index, stride
        self.cta_in_cluster = tuple(cta_in_cluster)

    @staticmethod
    def create(params: Params):
        bidx = cute.arch.block_idx()
        return StaticScheduler(params, Int32(bidx[2]), Int32(cute.arch.grid_dim()[2]),
                               tuple(Int32(c) for c in _cta_in_cluster(bidx, params.cluster_mn)))

    def _values(self):
        return [self.params, self.index, self.stride, list(self.cta_in_cluster)]

    def linear_index(self, work):
        return self.index

    def current(self):
        return WorkTileInfo((self.index, 0, 0), self.index < self.params.total())

    def first(self):
        return self.current()

    def next(self):
        self.index = self.index + self.stride
        return self.current()


class ClcScheduler(_Carried):
    """One warp's view of cluster launch control: its own cluster's first, then each stolen
    cluster's from the 16-byte response (`cute.arch.clc_response`: the first CTA's x, y, z and
    a valid bit); `advance_to_next_work` issues the next try_cancel (the scheduler warp)."""

    def __init__(self, params: Params, response, block_idx):
        self.params, self.response, self.block_idx = params, response, tuple(block_idx)
        self.cta_in_cluster = _cta_in_cluster(self.block_idx, params.cluster_mn)

    def _values(self):
        return [self.params, self.response, list(self.block_idx)]

    def linear_index(self, work):
        """The linear cluster index of the cluster whose first CTA is at `work.tile_idx`."""
        (clusters_m, clusters_n, _), (cm, cn) = self.params.clusters, self.params.cluster_mn
        m, n, l = work.tile_idx
        return m // cm + clusters_m * (n // cn + clusters_n * l)

    def first(self):
        x, y = self.cta_in_cluster
        bx, by, bz = self.block_idx
        return WorkTileInfo((bx - x, by - y, bz), cutlass.Boolean(True))

    def current(self):
        m, n, l, valid = cute.arch.clc_response(self.response)
        # read through the generic proxy; the next try_cancel writes it through the async one
        cute.arch.fence_proxy("async.shared", space="cta")
        return WorkTileInfo((m, n, l), valid)

    def advance_to_next_work(self, barrier):
        with cute.arch.elect_one():
            cute.arch.issue_clc_query(barrier, self.response)


class Tiles:
    """One warp's walk over its output tiles (`first`, then `next` until invalid)."""

    def __init__(self, sched, clc=None, state=None):
        self.sched, self.clc, self.state = sched, clc, state

    @staticmethod
    def create(kind: str, sched_params: Params, clc=None, response=None):
        if kind == CLC:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            return Tiles(ClcScheduler(sched_params, response, cute.arch.block_idx()), clc,
                         state)
        return Tiles(StaticScheduler.create(sched_params))

    # loop-carried through the DSL's while loops
    def __extract_mlir_values__(self):
        values = extract_mlir_values(self.sched)
        return values + ([] if self.state is None else extract_mlir_values(self.state))

    def __new_from_mlir_values__(self, values):
        n = len(extract_mlir_values(self.sched))
        sched = new_from_mlir_values(self.sched, values[:n])
        state = None if self.state is None else new_from_mlir_values(self.state, values[n:])
        return Tiles(sched, self.clc, state)

    def _in_supergroup_order(self, work):
        """The walk's linear cluster index -> that cluster's tile in supergroup order (this
        CTA's place in it)."""
        p = self.sched.params
        (clusters_m, clusters_n, _), (cm, cn) = p.clusters, p.cluster_mn
        k = self.sched.linear_index(work)
        m, n, l = supergroup_coord(k, clusters_m, clusters_n, p.supergroup)
        x, y = self.sched.cta_in_cluster
        tile = (m * cm + x, n * cn + y, l)
        return WorkTileInfo(tuple(cute.arch.make_warp_uniform(Int32(c)) for c in tile),
                            work.is_valid_tile)

    def first(self):
        return self._in_supergroup_order(self.sched.first())

    def next(self):
        """The next tile: static stride, or the stolen cluster's tile from the CLC response."""
        if cutlass.const_expr(self.clc is None):
            return self._in_supergroup_order(self.sched.next())
        self.clc.consumer_wait(self.state)
        work = self.sched.current()
        self.clc.consumer_release(self.state)
        self.state.advance()
        return self._in_supergroup_order(work)


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


class Shares(DeviceStruct):
    """This CTA's stream-K share (`stream_k_share` over the grid's CTAs) of the (tile x K-step)
    units, tiles in supergroup order: `bounds()` its [start, end), `segment(u, end)` the tile
    of unit u and the K steps [k0, k1) of it the share holds, `owner(u)` the CTA holding unit
    u. Built in the kernel (64-bit products; the same arithmetic as the host functions). (A
    DeviceStruct: the DSL's while loops carry it.)"""

    _fields = ("params", "k_steps", "units", "ctas", "cta")

    def __init__(self, params: Params, k_steps):
        self.params, self.k_steps = params, Int32(k_steps)
        m, n, l = params.clusters
        self.units = cutlass.Int64(m * n * l) * cutlass.Int64(k_steps)
        self.ctas = cutlass.Int64(cute.arch.grid_dim()[0])
        self.cta = cute.arch.block_idx()[0]

    def bounds(self):
        start, end = stream_k_share(cutlass.Int64(self.cta), self.ctas, self.units)
        return Int32(start), Int32(end)

    def owner(self, u):
        return Int32(stream_k_owner(cutlass.Int64(u), self.ctas, self.units))

    def segment(self, u, end):
        clusters_m, clusters_n, _ = self.params.clusters
        t = u // self.k_steps
        k0 = u - t * self.k_steps
        k1 = cutlass.min(self.k_steps, k0 + end - u)
        m, n, l = supergroup_coord(t, clusters_m, clusters_n, self.params.supergroup)
        uniform = cute.arch.make_warp_uniform
        return (coord(uniform(Int32(m)), uniform(Int32(n)), uniform(Int32(l))), k0, k1)


def k_split(batch_split, splits, k_steps, min_=cutlass_min):
    """Split K (D's batch l * `splits` + s holds run s of batch l's sum): the work unit with
    batch coordinate `batch_split` covers K steps [k0, k1) of batch l, runs of
    ceil(k_steps / splits) steps (the last shorter). Returns (l, k0, k1). Plain integer
    arithmetic, the same on the host and in a kernel (`k_split_count` keeps every run
    non-empty)."""
    per = (k_steps + splits - 1) // splits
    s = batch_split % splits
    return batch_split // splits, s * per, min_(s * per + per, k_steps)


def k_split_count(splits: int, k_steps: int) -> int:
    """The split count to launch for at most `splits` runs of `k_steps` K steps with none empty
    (`k_split`): ceil(k_steps / ceil(k_steps / splits))."""
    per = -(-k_steps // max(1, min(splits, k_steps)))
    return -(-k_steps // per)


def stream_k_share(cta, ctas, units):
    """[start, end) of the units (tile major) that CTA `cta` of `ctas` takes: equal contiguous
    shares (sizes differ by at most one)."""
    return cta * units // ctas, (cta + 1) * units // ctas


def stream_k_owner(u, ctas, units):
    """The CTA whose `stream_k_share` holds unit u."""
    return ((u + 1) * ctas - 1) // units


def stream_k_grid(tiles: int, k_steps: int, limit: int, slack: float = 0.1) -> int:
    """The CTAs of an in-kernel stream-K (`StreamK`) over `tiles` tiles of `k_steps` units
    on at most `limit`: `limit` where the tiles are at least as many (a tile then spans at most
    two shares); fewer tiles: each split into `split` = min(limit // tiles, k_steps) equal
    shares that line up with the tiles, where those fill the grid within `slack` (64 tiles on
    132 SMs: 128 CTAs, every tile in two parts), else one CTA per SM (or per unit), whose
    shares straddle the tiles (96 tiles: 132 CTAs, each tile in two or three parts). Every
    share is at least one unit."""
    if tiles >= limit:
        return limit
    split = min(limit // tiles, k_steps)
    if tiles * split >= (1 - slack) * limit:
        return tiles * split
    return min(limit, tiles * k_steps)


# Most CTAs of a stream-K team (`StreamK.teams`): each part finishes whole consumer warps'
# rows of the tile, and LCF's two consumer warpgroups are 8 warps.
TEAM_MAX = 8


def stream_k_team(tiles: int, k_steps: int, limit: int) -> int:
    """Parts per tile of a stream-K team launch: as many equal shares of every tile as fit
    `limit` CTAs (at most `k_steps` and TEAM_MAX); 0 where fewer than two fit."""
    team = min(limit // tiles, k_steps, TEAM_MAX)
    return team if team >= 2 else 0


def stream_k_team_grid(tiles: int, k_steps: int, limit: int) -> int:
    """The CTAs of a stream-K team launch: every tile split into `stream_k_team` equal shares,
    so each tile's parts end together: 23 tiles of 23 K steps on 132 SMs, 5 parts (115 CTAs).
    ValueError where fewer than two parts per tile fit (128 tiles on 132 SMs)."""
    team = stream_k_team(tiles, k_steps, limit)
    if not team:
        raise ValueError(f"a stream-K team needs two parts per tile or more: {tiles} tiles of "
                         f"{k_steps} K steps on {limit} CTAs give fewer")
    return tiles * team


def stream_k_slots(ctas: int, tiles: int) -> int:
    """Slots for every (CTA, tile) pair's partial sum at slot cta + tile: a CTA's tiles and a
    tile's CTAs are consecutive, so the pairs' slots are distinct, at most ctas + tiles - 2."""
    return ctas + tiles - 1
