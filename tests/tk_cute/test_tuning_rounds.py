"""The Hopper planners' shared rounds model (`tk_cute.tuning.rounds`), on the host."""

import pytest

from tk_cute.ops import schedule
from tk_cute.tuning import rounds


@pytest.mark.parametrize("units, tile_units, limit, expected", [
    (1024, 32, 132, 128),  # 32 row blocks x 32 K steps (8192^2, 256 rows): 8 units, a quarter
    (3584, 112, 132, 128),  # 32 x 112 (8192 x 28672): 28 units, a quarter of a tile
    (3584, 32, 132, 132),  # 112 x 32 (28672 x 8192): the aligned 112 takes 32 units, 132 28 + 2
    (276, 12, 132, 92),  # 23 x 12 (2880^2, 128 rows): 3 units each, 132 straddling take 3 + 2
    (392, 14, 132, 56),  # 28 x 14 (3584^2): 7 aligned against 3 + 4 straddling: the tie aligned
    (64, 32, 132, 64),  # fewer units than CTAs: one unit each
    (7, 7, 1, 1),
])
def test_stream_k_ctas(units, tile_units, limit, expected):
    """The grid of the fewest units per CTA, straddling shares counted `misaligned` units more
    (2 here; 4 for 3584^2), ties to the aligned grid; an aligned grid's shares
    never straddle a tile boundary, and no grid takes more units per CTA than the limit's
    plus the penalty."""
    misaligned = 4 if units == 392 else 2
    ctas = rounds.stream_k_ctas(units, tile_units, limit, misaligned)
    assert ctas == expected
    assert -(-units // ctas) <= -(-units // min(limit, units)) + misaligned
    if rounds.aligned(units, tile_units, ctas):
        tiles = units // tile_units
        spans = [schedule.stream_k_owner(t * tile_units + tile_units - 1, ctas, units)
                 - schedule.stream_k_owner(t * tile_units, ctas, units) + 1 for t in range(tiles)]
        assert max(spans) == max(1, ctas // tiles)  # each tile: whole shares only
        for c in range(ctas):
            start, end = schedule.stream_k_share(c, ctas, units)
            assert start // tile_units == (end - 1) // tile_units or start % tile_units == 0


def test_width_plan_takes_stream_k_where_whole_tiles_leave_a_round_part_empty():
    """`width_plan`: whole tiles where their rounds fill the SMs (64 x 4 tiles of 256 = 1.94 per
    SM: 2 rounds, stream-K's 1.94 + 0.12 is more); stream-K where a round would be part empty
    (224 tiles: 1.70 + 0.12 against 2), at the width that pads the rows least (384 rows: 192);
    never with fewer tiles than SMs; without an overhead whole tiles, at the width of the
    fewest rounds x columns."""

    cost = {256: 1.0, 192: 1.02, 128: 1.08}
    assert rounds.width_plan(64, 1024, 132, cost, 0.12) == (256, False)
    assert rounds.width_plan(224, 256, 132, cost, 0.12) == (256, True)
    assert rounds.width_plan(224, 384, 132, cost, 0.12) == (192, True)
    # 128 tiles < 132 SMs at Nb = 128
    assert rounds.width_plan(64, 256, 132, cost, 0.0) == (128, False)
    for bands, cols, nb in ((64, 1024, 256), (224, 384, 192), (64, 640, 192), (8, 4097, 128)):
        assert rounds.width_plan(bands, cols, 132, cost) == (nb, False)
    # 640 columns: 64 x 3 = 192 tiles of 256 (2 rounds x 256) against 64 x 4 of 192 (2 x 192)
    assert (rounds.tile_rounds(64, 640, 256, 132), rounds.tile_rounds(64, 640, 192, 132)) == (2, 2)
    assert rounds.tile_rounds(17, 5000, 224, 132, (2, 1)) == 4  # 18 x 23 = 414 tiles in clusters


def test_cluster_plan_pads_the_tiles_to_whole_clusters():
    """`cluster_plan`: a cluster shape where its padded tiles cost no round (8 x 20 tiles pair
    up either way: 2 x 1, the cheaper), none where padding adds one (17 x 23 tiles: 391, 3
    rounds; in 2 x 1 clusters 18 x 23 = 414, in 1 x 2 17 x 24 = 408: 4 rounds); clusters larger
    than the grid, or of tiles below `min_cluster_width`, are left out (one band: no 2 x 1); ties
    to the smaller cluster."""

    cost = {256: 1.0, 224: 1.05}
    clusters = {(1, 1): 1.0, (2, 1): 0.97, (1, 2): 0.98}
    assert rounds.cluster_plan(8, 5000, 132, {256: 1.0}, clusters) == (256, (2, 1))
    assert rounds.cluster_plan(17, 5000, 132, {224: 1.0}, clusters) == (224, (1, 1))
    assert rounds.cluster_plan(1, 8192, 132, {256: 1.0}, clusters) == (256, (1, 2))
    # 38 tiles: one round
    assert rounds.cluster_plan(1, 8192, 132, cost, clusters) == (224, (1, 2))
    assert rounds.cluster_plan(1, 200, 132, {256: 1.0}, clusters) == (256, (1, 1))  # one tile
    even = {(1, 1): 1.0, (2, 1): 1.0}
    assert rounds.cluster_plan(8, 5000, 132, {256: 1.0}, even) == (256, (1, 1))
    # tiles narrower than the cluster minimum
    assert rounds.cluster_plan(8, 5000, 132, {256: 1.0}, clusters, 257) == (256, (1, 1))
