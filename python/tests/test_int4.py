"""int4 KV caches from Python: decode, write_cache and copy_blocks on caches of packed int4 codes
(uint8 tensors [..., head_dim / 2] marked with pagedattn.int4(): two signed 4-bit codes a byte,
the even element in the low nibble) with a scale per group of 32 values of every row
(k_token_scales, v_token_scales: float32 [num_blocks, num_kv_heads, block_size, head_dim / 32] in
any strides with the last dimension contiguous), times the per-tensor and per-kv-head scales.

The references are this file's: unpack / pack (the nibbles), int4_quantize (nearest integer,
ties to even, saturation at +-7, NaN to 0), group_scales (write_cache's scale of a group: max
finite |x| / (7 x head scale) clamped into [1e-30, 1e30], or 1), and _cases.py's float64 decode
of the dequantized codes (code x scales, exactly). The cases poison the rows nobody reads (the
code -8, NaN scales), so reading one shows. NumPy only: int4 is a CPU-backend format for now (the
CUDA backend refuses it).
"""

from __future__ import annotations

import numpy as np
import pytest

import pagedattn
from _cases import (DTYPES, MAX_KV_SCALE, MIN_KV_SCALE, arg, check_lse, check_out, empty, load,
                    reference_decode, store)

NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, GROUP = 2, 64, 16, 32
GROUPS = HEAD_DIM // GROUP


def unpack(codes: np.ndarray) -> np.ndarray:
    """Packed int4 codes [..., n / 2] (uint8) -> int codes [..., n]: the low nibble first."""
    b = np.asarray(codes, np.uint8).astype(np.int16)
    lo, hi = b & 0xF, b >> 4
    out = np.stack([lo, hi], axis=-1).reshape(*b.shape[:-1], 2 * b.shape[-1])
    return np.where(out >= 8, out - 16, out).astype(np.int8)


def pack(codes: np.ndarray) -> np.ndarray:
    """int codes [..., n] in -8..7 -> packed uint8 [..., n / 2]."""
    c = np.asarray(codes, np.int16) & 0xF
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def int4_quantize(y: np.ndarray) -> np.ndarray:
    """float32 -> int4 code: nearest integer (ties to even), +-7 beyond, NaN 0."""
    y = np.asarray(y, np.float32)
    with np.errstate(invalid="ignore"):
        q = np.clip(np.rint(y), -7, 7)
    return np.where(np.isnan(y), 0, q).astype(np.int8)


def group_scales(x: np.ndarray, head: np.ndarray) -> np.ndarray:
    """write_cache's scale of each group of 32 values of x [..., D] under its row's head scale
    (broadcast to x[..., 0]): max finite |x| / (7 x head) in float64, clamped into [1e-30, 1e30],
    1 without a finite nonzero value; float32 [..., D / 32]."""
    g = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, GROUP)
    finite = np.where(np.isfinite(g), np.abs(g), 0).astype(np.float64)
    amax = finite.max(axis=-1)
    s = amax / (7.0 * np.asarray(head, np.float32)[..., None].astype(np.float64))
    s = np.clip(s, float(MIN_KV_SCALE), float(MAX_KV_SCALE)).astype(np.float32)
    return np.where(amax > 0, s, np.float32(1)).astype(np.float32)


def quantize_groups(x: np.ndarray, head: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The codes of x [..., D] under head [...] x scales [..., D / 32], as write_cache stores
    them: x / (head x s) in float32, rounded."""
    div = (np.asarray(head, np.float32)[..., None] * scales).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = (np.asarray(x, np.float32) / np.repeat(div, GROUP, axis=-1)).astype(np.float32)
    return int4_quantize(y)


class Int4Case:
    """A paged int4 case: random codes (every code, -8 included) and group scales in [0.25, 4) for
    every row; per-tensor and per-head scales; the rows nobody reads hold the code -8 and NaN
    scales; q in float32, float16 or bf16."""

    def __init__(self, seed, context_lens, q_dtype="f32", num_heads=8, head_dim=HEAD_DIM,
                 spare=3, k_scale=0.125, v_scale=0.25, k_scales=(0.5, 2.0), v_scales=(1.5, 0.75)):
        rng = np.random.default_rng(seed)
        self.q_dtype = q_dtype
        self.context_lens = np.asarray(context_lens, np.int32)
        batch, kv, bs, d = len(context_lens), NUM_KV_HEADS, BLOCK_SIZE, head_dim
        used = [-(-n // bs) for n in context_lens]
        self.num_blocks = sum(used) + spare
        perm = rng.permutation(self.num_blocks).astype(np.int32)
        width = max(max(used), 1) + 1
        self.block_table = np.full((batch, width), -1, np.int32)
        at = 0
        for b, n in enumerate(used):
            self.block_table[b, :n] = perm[at:at + n]
            at += n
        codes = rng.integers(-8, 8, (2, self.num_blocks, kv, bs, d))
        scales = rng.uniform(0.25, 4, (2, self.num_blocks, kv, bs, d // GROUP)).astype(np.float32)
        readable = np.zeros((self.num_blocks, bs), bool)
        for b, n in enumerate(context_lens):
            for t in range(n):
                readable[self.block_table[b, t // bs], t % bs] = True
        unread = ~readable[None, :, None, :]  # [1, blocks, 1, slots]: every kv head
        codes = np.where(unread[..., None], -8, codes)
        scales = np.where(unread[..., None], np.float32(np.nan), scales).astype(np.float32)
        self.codes, self.scales = codes, scales
        self.k, self.v = pack(codes[0]), pack(codes[1])
        self.ks, self.vs = scales[0], scales[1]
        self.k_scale, self.v_scale = k_scale, v_scale
        self.k_scales = np.asarray(k_scales, np.float32)
        self.v_scales = np.asarray(v_scales, np.float32)
        q = rng.standard_normal((batch, num_heads, d)).astype(np.float32)
        self.q_raw = store(q, q_dtype)
        self.q = load(self.q_raw, q_dtype).astype(np.float64)

    def dequantized(self):
        """K and V in float64 [blocks, kv, slots, D]: code x tensor x head x group scale (NaN
        where nobody reads)."""
        out = []
        for i, (s, heads) in enumerate([(self.k_scale, self.k_scales),
                                        (self.v_scale, self.v_scales)]):
            g = np.repeat(self.scales[i].astype(np.float64), GROUP, axis=-1)
            out.append(self.codes[i] * g * s * heads.astype(np.float64)[None, :, None, None])
        return out

    def kwargs(self):
        return dict(k_scale=self.k_scale, v_scale=self.v_scale, k_scales=self.k_scales,
                    v_scales=self.v_scales, k_token_scales=self.ks, v_token_scales=self.vs)

    def decode(self, k=None, v=None, out_dtype="f32", **kw):
        out = empty(self.q.shape, out_dtype)
        args = dict(self.kwargs())
        args.update(kw)
        lse = np.full(self.q.shape[:2], np.nan, np.float32)
        pagedattn.decode(arg(self.q_raw, self.q_dtype), pagedattn.int4(self.k if k is None else k),
                         pagedattn.int4(self.v if v is None else v), self.block_table,
                         self.context_lens, out=arg(out, out_dtype), lse=lse, **args)
        return out, lse


def test_the_codes_pack_low_nibble_first_and_round_ties_to_even():
    codes = np.arange(-8, 8)
    packed = pack(codes)
    assert packed[0] == 0x98  # -8 low, -7 high
    assert np.array_equal(unpack(packed), codes)
    x = np.array([0.5, 1.5, 2.5, -2.5, 6.5, 7.49, 7.5, 100, -1e30, np.inf, -np.inf, np.nan],
                 np.float32)
    assert int4_quantize(x).tolist() == [0, 2, 2, -2, 6, 7, 7, 7, -7, 7, -7, 0]


@pytest.mark.parametrize("q_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", ["f32", "bf16"])
def test_decode_matches_the_reference(q_dtype, out_dtype):
    c = Int4Case(1, [37, 0, 16, 1, 129], q_dtype=q_dtype)
    k, v = c.dequantized()
    want, want_lse = reference_decode(c.q, k, v, c.block_table, c.context_lens)
    out, lse = c.decode(out_dtype=out_dtype)
    check_out(out, out_dtype, want)
    check_lse(lse, want_lse)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_decode_over_head_dims_and_variants(head_dim):
    c = Int4Case(head_dim, [40, 100], head_dim=head_dim)
    k, v = c.dequantized()
    slopes = np.full(8, -0.05, np.float32)
    want, want_lse = reference_decode(c.q, k, v, c.block_table, c.context_lens, window_left=30,
                                      logits_soft_cap=5.0, alibi_slopes=slopes)
    out, lse = c.decode(window_left=30, logits_soft_cap=5.0, alibi_slopes=slopes)
    check_out(out, "f32", want)
    check_lse(lse, want_lse)


def test_nhd_caches_and_strided_group_scales():
    """The same codes stored NHD ([blocks, slots, kv heads, D / 2]) and the group scales with a
    gap after every row, both as views: the HND decode's result."""
    c = Int4Case(5, [33, 70])
    base, _ = c.decode()
    k_nhd = np.ascontiguousarray(c.k.swapaxes(1, 2))
    v_nhd = np.ascontiguousarray(c.v.swapaxes(1, 2))
    padded = [np.full(c.ks.shape[:3] + (GROUPS + 3,), np.nan, np.float32) for _ in range(2)]
    padded[0][..., :GROUPS], padded[1][..., :GROUPS] = c.ks, c.vs
    out, _ = c.decode(k=k_nhd, v=v_nhd, kv_layout="NHD", k_token_scales=padded[0][..., :GROUPS],
                      v_token_scales=padded[1][..., :GROUPS])
    assert np.array_equal(out, base)


def test_group_scales_matter():
    """A row's groups scaled over many orders of magnitude: the decode follows each group's."""
    c = Int4Case(7, [50, 200])
    rng = np.random.default_rng(8)
    c.scales[1] = np.where(np.isnan(c.scales[1]), np.nan,
                           10.0 ** rng.uniform(-6, 6, c.scales[1].shape)).astype(np.float32)
    c.vs = c.scales[1]
    k, v = c.dequantized()
    want, _ = reference_decode(c.q, k, v, c.block_table, c.context_lens)
    out, _ = c.decode()
    check_out(out, "f32", want)
    first = np.repeat(c.vs[..., :1], GROUPS, axis=-1)
    wrong, _ = c.decode(v_token_scales=np.ascontiguousarray(first))
    assert np.abs(wrong - want).max() > 1e-2 * np.abs(want).max()


class Pool:
    """An int4 pool of 4 blocks (2 kv heads, 8 slots, head dim 64): codes 0x55 and group scales
    NaN, HND or NHD (the scales as HND-ordered views of the caches' order)."""

    def __init__(self, layout="HND"):
        self.layout = layout
        shape = (4, NUM_KV_HEADS, 8, HEAD_DIM // 2)
        self.k, self.v = np.full(shape, 0x55, np.uint8), np.full(shape, 0x55, np.uint8)
        self.ks = np.full((4, NUM_KV_HEADS, 8, GROUPS), np.nan, np.float32)
        self.vs = self.ks.copy()
        if layout == "NHD":
            self.k, self.v = self.k.swapaxes(1, 2).copy(), self.v.swapaxes(1, 2).copy()
            self.ks = np.ascontiguousarray(self.ks.swapaxes(1, 2)).swapaxes(1, 2)
            self.vs = np.ascontiguousarray(self.vs.swapaxes(1, 2)).swapaxes(1, 2)

    def hnd(self, x):
        return x.swapaxes(1, 2) if self.layout == "NHD" else x

    def write(self, key, value, slots, **kw):
        pagedattn.write_cache(key, value, np.asarray(slots, np.int32), pagedattn.int4(self.k),
                              pagedattn.int4(self.v), kv_layout=self.layout, k_token_scales=self.ks,
                              v_token_scales=self.vs, **kw)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_write_cache_stores_each_groups_scale_and_codes(layout):
    rng = np.random.default_rng(11)
    key = (rng.standard_normal((5, NUM_KV_HEADS, HEAD_DIM)) * 3).astype(np.float32)
    value = (rng.standard_normal(key.shape) * 1e-3).astype(np.float32)
    key[1, 0, :32] = 0  # a group of zeros: scale 1, codes 0
    key[2, 1, 3], key[2, 1, 40] = np.nan, np.inf
    value[3, 0] = 1e36
    slots = [0, 9, -1, 31, 17]
    heads = np.array([0.5, 2.0], np.float32)
    p = Pool(layout)
    p.write(key, value, slots, k_scale=0.5, k_scales=heads)
    k, v, ks, vs = p.hnd(p.k), p.hnd(p.v), p.ks, p.vs
    for i, s in enumerate(slots):
        if s < 0:
            continue
        b, t = divmod(s, 8)
        for h in range(NUM_KV_HEADS):
            want_ks = group_scales(key[i, h], 0.5 * heads[h])
            want_vs = group_scales(value[i, h], np.float32(1))
            assert np.array_equal(ks[b, h, t], want_ks)
            assert np.array_equal(vs[b, h, t], want_vs)
            assert np.array_equal(unpack(k[b, h, t]),
                                  quantize_groups(key[i, h], np.float32(0.5 * heads[h]), want_ks))
            assert np.array_equal(unpack(v[b, h, t]), quantize_groups(value[i, h], np.float32(1),
                                                                      want_vs))
    # Slot -1 wrote nothing; unwritten rows kept their bytes and NaN scales.
    assert (k[0, :, 1] == 0x55).all() and np.isnan(ks[0, :, 1]).all()


def test_copy_blocks_carries_codes_and_group_scales():
    rng = np.random.default_rng(12)
    key = rng.standard_normal((8, NUM_KV_HEADS, HEAD_DIM)).astype(np.float32)
    p = Pool()
    p.write(key, key * 2, list(range(8, 16)))
    pagedattn.copy_blocks(pagedattn.int4(p.k), pagedattn.int4(p.v), [(1, 3)],
                          k_token_scales=p.ks, v_token_scales=p.vs)
    assert np.array_equal(p.k[3], p.k[1]) and np.array_equal(p.v[3], p.v[1])
    assert np.array_equal(p.ks[3], p.ks[1]) and np.array_equal(p.vs[3], p.vs[1])
    assert (p.k[0] == 0x55).all() and np.isnan(p.ks[0]).all()


def test_written_rows_decode_close_to_the_unquantized_ones():
    rng = np.random.default_rng(13)
    n = 40
    key = rng.standard_normal((n, NUM_KV_HEADS, HEAD_DIM)).astype(np.float32)
    value = rng.standard_normal(key.shape).astype(np.float32)
    k = np.zeros((3, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM // 2), np.uint8)
    v = k.copy()
    ks = np.zeros((3, NUM_KV_HEADS, BLOCK_SIZE, GROUPS), np.float32)
    vs = ks.copy()
    slots = np.arange(n, dtype=np.int32)
    pagedattn.write_cache(key, value, slots, pagedattn.int4(k), pagedattn.int4(v),
                          k_token_scales=ks, v_token_scales=vs)
    q = rng.standard_normal((1, 8, HEAD_DIM)).astype(np.float32)
    table = np.array([[0, 1, 2]], np.int32)
    lens = np.array([n], np.int32)
    out = pagedattn.decode(q, pagedattn.int4(k), pagedattn.int4(v), table, lens,
                           k_token_scales=ks, v_token_scales=vs)
    kf = np.zeros((3, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM), np.float64)
    vf = kf.copy()
    for t in range(n):
        kf[t // BLOCK_SIZE, :, t % BLOCK_SIZE] = key[t]
        vf[t // BLOCK_SIZE, :, t % BLOCK_SIZE] = value[t]
    want, _ = reference_decode(q.astype(np.float64), kf, vf, table, lens)
    err = np.abs(np.asarray(out) - want).max() / np.abs(want).max()
    assert 0 < err < 0.3


def test_errors_name_the_argument():
    c = Int4Case(3, [20, 9])

    def error(**kw):
        with pytest.raises(pagedattn.Error) as info:
            c.decode(**kw)
        return info.value

    e = error(k_token_scales=None, v_token_scales=None)
    assert e.argument == "k_token_scales" and "int4" in str(e)
    e = error(k_token_scales=c.ks[..., 0].copy())
    assert e.argument == "k_token_scales" and "head_dim / 32" in str(e)
    bad = c.ks.copy()
    b = int(c.block_table[0, 0])
    bad[b, 1, 3, 1] = 0
    e = error(k_token_scales=bad)
    assert e.argument == f"k_token_scales[block {b}, kv head 1, slot 3, group 1]"
    e = error(k=c.k[..., :-1].copy(), v=c.v[..., :-1].copy())
    assert e.argument == "k_cache"
    # head_dim 80 (a multiple of 16 bytes, not of 32 values): refused by the library.
    q = np.zeros((1, 8, 80), np.float32)
    k = np.zeros((2, NUM_KV_HEADS, BLOCK_SIZE, 40), np.uint8)
    ks = np.ones((2, NUM_KV_HEADS, BLOCK_SIZE, 2), np.float32)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, pagedattn.int4(k), pagedattn.int4(k), np.zeros((1, 1), np.int32),
                         np.ones(1, np.int32), k_token_scales=ks, v_token_scales=ks)
    assert info.value.argument == "head_dim"
    # int4 marks 8-bit tensors only; int4 is a cache dtype only.
    with pytest.raises(pagedattn.Error) as info:
        c.decode(k=c.k.astype(np.uint16))
    assert info.value.argument == "k_cache" and "int4" in str(info.value)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(pagedattn.int4(np.zeros((2, 8, HEAD_DIM), np.uint8)), pagedattn.int4(c.k),
                         pagedattn.int4(c.v),
                         c.block_table, c.context_lens, **c.kwargs())
    assert info.value.argument == "q_dtype"
