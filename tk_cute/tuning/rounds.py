# SPDX-License-Identifier: MIT
"""The rounds model the Hopper planners share (`tuning.sm90`, `tuning.dense_sm90`): a
persistent grid on `sms` SMs runs its output tiles in rounds; a plan's time is its rounds
times a tile's relative cost. Plain integer arithmetic on the host (the kernels' own share and
tile arithmetic is `ops.schedule`)."""

from __future__ import annotations

import math


def stream_k_ctas(units: int, tile_units: int, limit: int, misaligned: float) -> int:
    """A stream-K grid size for `units` (`tile_units` per tile) on at most `limit` CTAs: the
    one of least modelled time, the most units a CTA takes (ceil(units / ctas)) plus
    `misaligned` units where the equal shares do not line up with the tiles (`aligned`); ties
    go to the aligned grid, then to more CTAs."""
    best = None
    for ctas in range(min(limit, units), 0, -1):
        lined_up = aligned(units, tile_units, ctas)
        key = (-(-units // ctas) + (0 if lined_up else misaligned), not lined_up)
        if best is None or key < best[0]:
            best = (key, ctas)
    return best[1]


def aligned(units: int, tile_units: int, ctas: int) -> bool:
    """Whether `ctas` equal shares of `units` line up with the tiles of `tile_units` (a share
    is whole tiles, or a tile whole shares): no share then straddles a tile boundary, each CTA
    writes one partial per tile and every tile has the fewest partials."""
    if units % ctas:
        return False
    share = units // ctas
    return tile_units % share == 0 or share % tile_units == 0


def cluster_tiles(bands: int, cols: int, nb: int, cluster=(1, 1)) -> int:
    """The `bands` x ceil(cols / nb) output tiles padded to whole clusters (bands rounded up
    to cluster_m, column tiles to cluster_n: the scheduler's cluster grid)."""
    cm, cn = cluster
    return -(-bands // cm) * cm * (-(-cols // (nb * cn)) * cn)


def tile_rounds(bands: int, cols: int, nb: int, sms: int, cluster=(1, 1)) -> int:
    """Rounds of a persistent grid on `sms` SMs over the `cluster_tiles`."""
    return -(-cluster_tiles(bands, cols, nb, cluster) // sms)


def width_plan(bands: int, cols: int, sms: int, cost: dict,
              stream_k_overhead: float | None = None) -> tuple[int, bool]:
    """(Nb, stream-K) of the least modelled time, the width Nb a key of `cost` (a tile's time
    per column relative to the others'): whole tiles' `tile_rounds` times Nb * cost[Nb] (wide
    tiles where they fill the SMs, narrower ones where a wide tile leaves a round nearly empty
    or its last tile mostly past `cols`), or, given `stream_k_overhead`, also equal stream-K
    shares of at least one tile per SM (`StreamK`) costing tiles / sms tiles plus that fraction
    of one (the hand-over of split tiles); ties go to whole tiles, then to the wider tile."""
    def time(plan):
        nb, stream_k = plan
        tiles = bands * -(-cols // nb)
        if stream_k:
            rounds = tiles / sms + stream_k_overhead if tiles >= sms else math.inf
        else:
            rounds = tile_rounds(bands, cols, nb, sms)
        return rounds * nb * cost[nb], stream_k, -nb

    kinds = (False,) if stream_k_overhead is None else (False, True)
    return min(((nb, sk) for nb in cost for sk in kinds), key=time)


def cluster_time(bands: int, cols: int, sms: int, nb: int, cluster, cost: dict,
                 clusters: dict) -> float:
    """`cluster_plan`'s model of Nb-wide tiles in `cluster`s: `tile_rounds` (tiles padded to
    whole clusters) times Nb * cost[Nb] * clusters[cluster]."""
    return tile_rounds(bands, cols, nb, sms, cluster) * nb * cost[nb] * clusters[cluster]


def cluster_plan(bands: int, cols: int, sms: int, cost: dict, clusters: dict,
                 min_cluster_width: int = 0) -> tuple[int, tuple[int, int]]:
    """(Nb, (cluster_m, cluster_n)) of the least modelled time of whole tiles in clusters:
    `tile_rounds` (tiles padded to whole clusters) times Nb * cost[Nb] * clusters[cluster]
    (a cluster shape's time relative to the others'; multicast shares tiles). Clusters larger
    than the tile grid, and of tiles narrower than `min_cluster_width`, are left out; ties go
    to the smaller cluster, then to the wider tile."""
    def time(plan):
        nb, c = plan
        return cluster_time(bands, cols, sms, nb, c, cost, clusters), c[0] * c[1], -nb

    plans = [(nb, c) for nb in cost for c in clusters if c == (1, 1) or (
        nb >= min_cluster_width and c[0] <= bands and c[1] <= -(-cols // nb))]
    return min(plans, key=time)
