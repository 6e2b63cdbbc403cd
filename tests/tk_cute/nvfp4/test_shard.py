"""`tk_cute.nvfp4.shard` / `unshard`: shards are, byte for byte, the quantization of the matching
slice with the original's global scale; the format's granularity (any row split, K on 16-element
blocks) is enforced with errors that name it."""

import pytest
import torch

from tk_cute import nvfp4
from tk_cute.nvfp4 import NVFP4Tensor, quantize, shard, unshard


def assert_same_bytes(got: NVFP4Tensor, want: NVFP4Tensor, what: str = "") -> None:
    assert got.shape == want.shape, what
    assert got.data.dtype == want.data.dtype == torch.uint8, what
    assert torch.equal(got.data, want.data), f"{what}: data"
    assert got.scales.shape == want.scales.shape, f"{what}: scales shape"
    assert torch.equal(got.scales, want.scales), f"{what}: blocked scales (padding included)"
    assert got.global_scale.dtype == torch.float32 and got.global_scale.dim() == 0, what
    assert torch.equal(got.global_scale, want.global_scale), f"{what}: global scale"


def _values(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-6, 7, shape, generator=g))
    x[..., :3, 16:32] = 0.0  # all-zero blocks (scale 0) and -0 codes near them
    x[..., 0, 5] = -0.0
    return x.to(dtype)


# Rows: boundaries off the 128-row bands (300 / 3 = 100), a one-row shard, one band exactly.
# K: 64-element atoms split across shards (K = 96, count 2: 48 = 3 blocks per shard).
@pytest.mark.parametrize("M, K", [(300, 96), (128, 256), (5, 32), (130, 512)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shards_are_quantized_slices_byte_for_byte(M, K, dtype, seed):
    x = _values((M, K), dtype, seed)
    q = quantize(x)
    g = q.global_scale
    for dim, size in ((0, M), (1, K)):
        gran = 1 if dim == 0 else 16
        counts = [c for c in (1, 2, 3, 4, 5, 8) if size % (c * gran) == 0]
        assert counts  # every case exercises at least the trivial split
        for count in counts:
            step = size // count
            for i in range(count):
                sl = x[i * step:(i + 1) * step] if dim == 0 else x[:, i * step:(i + 1) * step]
                want = quantize(sl, global_scale=g)
                got = shard(q, dim, i, count)
                assert_same_bytes(got, want, f"dim {dim}, shard {i} of {count}")
                assert got.data.data_ptr() != q.data.data_ptr()  # owns its memory


def test_batched_shards_along_every_dim(seed):
    x = _values((4, 130, 64), torch.float32, seed)
    q = quantize(x)
    for dim, cut in ((0, lambda i: x[2 * i:2 * i + 2]), (1, lambda i: x[:, 65 * i:65 * i + 65]),
                     (2, lambda i: x[..., 32 * i:32 * i + 32]), (-1, lambda i: x[..., 32 * i:
                                                                                  32 * i + 32])):
        for i in range(2):
            assert_same_bytes(shard(q, dim, i, 2), quantize(cut(i), global_scale=q.global_scale),
                              f"dim {dim} shard {i}")


def test_ue5m3_shards_keep_their_format(seed):
    # Rubin's UE5M3 block scales: the same per-block recipe, so the same shard property.
    x = _values((130, 96), torch.float32, seed)
    q = quantize(x, scale_dtype="ue5m3")
    for dim, count in ((0, 2), (0, 5), (1, 2), (1, 3)):
        step = q.shape[dim] // count
        for i in range(count):
            got = shard(q, dim, i, count)
            assert got.scale_format == "ue5m3"
            want = quantize(x.narrow(dim, i * step, step), global_scale=q.global_scale,
                            scale_dtype="ue5m3")
            assert_same_bytes(got, want, f"ue5m3 dim {dim} shard {i}")
        back = unshard([shard(q, dim, i, count) for i in range(count)], dim)
        assert back.scale_format == "ue5m3"
        assert_same_bytes(back, q, f"ue5m3 unshard dim {dim}")
    g = q.global_scale
    with pytest.raises(ValueError, match="shard 1 has ue4m3 scales, shard 0 ue5m3"):
        unshard([shard(q, 0, 0, 2), quantize(x[65:], global_scale=g)], 0)


def test_own_amax_slices_are_not_shards(seed):
    # Why a shard keeps the global scale: a slice quantized with its own amax gets other bytes
    # (here the half without the tensor's largest value).
    x = _values((8, 64), torch.float32, seed)
    x[0, 0] = 1000.0
    q = quantize(x)
    own = quantize(x[:, 32:])
    assert not torch.equal(own.global_scale, q.global_scale)
    assert not torch.equal(own.scales, shard(q, 1, 1, 2).scales)


def test_unshard_inverts_shard(seed):
    x = _values((300, 192), torch.bfloat16, seed)
    q = quantize(x)
    for dim, count in ((0, 1), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4), (-1, 12)):
        parts = [shard(q, dim, i, count) for i in range(count)]
        assert_same_bytes(unshard(parts, dim), q, f"dim {dim}, count {count}")
    # Unequal pieces gather too (a row split of 300 as 100 + 200; K as 64 + 128).
    rows = [quantize(x[:100], global_scale=q.global_scale),
            quantize(x[100:], global_scale=q.global_scale)]
    assert_same_bytes(unshard(rows, 0), q, "uneven rows")
    cols = [quantize(x[:, :64], global_scale=q.global_scale),
            quantize(x[:, 64:], global_scale=q.global_scale)]
    assert_same_bytes(unshard(cols, 1), q, "uneven K")


def test_nonzero_scale_padding_is_reset_to_what_quantize_writes(seed):
    x = _values((5, 48), torch.float32, seed)
    q = quantize(x)
    padded = q.scales.clone()
    padded[0, 0, 511] = 0x38  # row 127 of the band: padding (M = 5); a valid UE4M3 byte
    odd = NVFP4Tensor(q.data, padded, q.global_scale, q.shape)
    assert_same_bytes(shard(odd, 1, 0, 1), q, "re-blocked")
    assert_same_bytes(shard(odd, 0, 2, 5), quantize(x[2:3], global_scale=q.global_scale))


def test_column_split_gemm_is_exact_on_the_reference():
    # Column parallelism on one process: the shards' outputs side by side ARE the full GEMM's
    # (each output element is one row of W: the exact reference computes it identically).
    torch.manual_seed(0)
    a = quantize(torch.randn(7, 96))
    w = quantize(torch.randn(48, 96))
    full = nvfp4.gemm(a, w, torch.float32)
    parts = [nvfp4.gemm(a, shard(w, 0, i, 3), torch.float32) for i in range(3)]
    assert torch.equal(torch.cat(parts, dim=1), full)
    xb = torch.randn(2, 7, 96).to(torch.bfloat16)
    parts = [nvfp4.gemm(xb, shard(w, 0, i, 4)) for i in range(4)]
    assert torch.equal(torch.cat(parts, dim=-1), nvfp4.gemm(xb, w))


@pytest.mark.parametrize("dim, count, match", [
    (1, 4, (r"K / count % 16 == 0 is needed, got K=96, count=4 \(K / count = 24\); counts "
            r"that work here: 1, 2, 3, 6")),
    (1, 5, r"K / count % 16 == 0"),
    (1, 7, r"K / count = 13.7143"),
    (0, 7, (r"rows \(N\) shards must be equal: 30 % count == 0 is needed, got count=7 .*"
            r"counts that work here: 1, 2, 3, 5, 6, 10, 15, 30")),
    (0, 0, r"shard count must be a positive int, got 0"),
    (0, 2.0, r"shard count must be a positive int, got 2.0"),
    (2, 2, r"shard dim must be 0 \(rows, N\) or 1 \(K\) .* got 2"),
    (-3, 2, r"shard dim must be"),
    (True, 2, r"shard dim must be"),
])
def test_bad_counts_and_dims_name_the_constraint(dim, count, match):
    q = quantize(torch.randn(30, 96))
    with pytest.raises(ValueError, match=match):
        shard(q, dim, 0, count)


def test_bad_index_and_types():
    q = quantize(torch.randn(4, 32))
    for index in (-1, 2, 1.0):
        with pytest.raises(ValueError, match=r"shard index must be an int in \[0, 2\)"):
            shard(q, 0, index, 2)
    with pytest.raises(TypeError, match="shard takes an NVFP4Tensor, got Tensor"):
        shard(torch.zeros(4, 32), 0, 0, 2)
    with pytest.raises(TypeError, match="non-empty sequence of NVFP4Tensors"):
        unshard([], 0)
    with pytest.raises(TypeError, match="non-empty sequence of NVFP4Tensors"):
        unshard([q, torch.zeros(1)], 0)


def test_unshard_rejects_pieces_of_different_tensors():
    x = torch.randn(8, 64)
    a, b = quantize(x[:4]), quantize(x[4:] * 3)  # each with its own amax
    with pytest.raises(ValueError, match="share its global scale, but shard 1 has"):
        unshard([a, b], 0)
    g = a.global_scale
    with pytest.raises(ValueError, match=r"every other dimension must match"):
        unshard([quantize(x, global_scale=g), quantize(x[:, :32], global_scale=g)], 0)
    with pytest.raises(ValueError, match=r"shard 1 is 3-D"):
        unshard([a, quantize(x.reshape(2, 4, 64), global_scale=g)], 0)
