"""int8 KV caches and per-token KV scales from Python: decode, write_cache and copy_blocks on
caches of int8 codes (-127 to 127), with per-tensor (k_scale), per-kv-head (k_scales) and
per-token (k_token_scales: one f32 scale per cache row, [num_blocks, num_kv_heads, block_size] in
any strides) scales.

The references are _cases.py's: int8_quantize (the nearest integer, ties to even, saturation at
+-127, NaN to 0), row_scales and quantize_rows (write_cache's scale of a row, max finite |x| /
(127 x head scale) clamped into [1e-30, 1e30] or 1, and its codes), and the float64 decode of the
dequantized codes (code x scales, exactly). Decode is checked against it within the output
dtype's usual tolerance; the scales and codes write_cache stores bit for bit. The cases poison
the rows nobody reads (NaN values, NaN per-token scales), so reading one shows. NumPy always;
PyTorch's int8 tensors where PyTorch is installed."""

from __future__ import annotations

import numpy as np
import pytest

import pagedattn
from pagedattn import _ext
from _cases import (DTYPES, FP8_DTYPES, MAX_KV_SCALE, MIN_KV_SCALE, arg, check_lse, check_out,
                    described, empty, fp8_values, int8_quantize, lens_for, load, make_case,
                    per_head_scales, quantize_heads, quantize_rows, reference_decode, row_scales,
                    store)

try:
    import torch
except ImportError:  # the NumPy tests run without it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch")
needs_cuda = pytest.mark.skipif(
    torch is None or not (torch.cuda.is_available() and pagedattn.cuda_available()[0]),
    reason="needs PyTorch, a CUDA GPU and a pagedattn built with CUDA")

# Scales of a case: K and V each none, per tensor, per kv head, or both (two kv heads).
SCALES = {
    "none": {},
    "tensor": dict(k_scale=0.0125, v_scale=3.5),
    "head": dict(k_scales=[0.5, 0.02], v_scales=[4.0, 0.25]),
    "both": dict(k_scale=0.25, v_scale=0.5, k_scales=[0.05, 0.1], v_scales=[3.0, 0.125]),
}
NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 2, 64, 16


def int8_case(seed, q_dtype="f32", scales="both", token_scales=True, **kw):
    return make_case(np.random.default_rng(seed),
                     context_lens=kw.pop("context_lens", lens_for(BLOCK_SIZE)), num_heads=8,
                     num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK_SIZE,
                     q_dtype=q_dtype, kv_dtype="int8", token_scales=token_scales,
                     **SCALES[scales], **kw)


def nhd(x: np.ndarray) -> np.ndarray:
    """An HND-ordered cache [blocks, kv heads, slots, ...] stored NHD [blocks, slots, kv heads,
    ...], as a view in HND order of the NHD copy (for scales, what decode takes)."""
    return np.ascontiguousarray(x.swapaxes(1, 2)).swapaxes(1, 2)


def decode_error(c, q=None, k=None, v=None, out=None, **kw) -> pagedattn.Error:
    """The pagedattn.Error a decode of case c raises with the given overrides; out untouched."""
    q = arg(c.q, c.q_dtype) if q is None else q
    k = c.k if k is None else k
    v = c.v if v is None else v
    out = np.full(c.q.shape, np.nan, np.float32) if out is None else out
    before = out.tobytes()
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, k, v, c.block_table, c.context_lens, out=out, **kw)
    assert out.tobytes() == before  # nothing written
    return info.value


class Pool:
    """An int8 pool of 4 blocks (2 kv heads, 8 slots, head dim 64) for write_cache and
    copy_blocks, caches filled with 99 and per-token scales with NaN, HND or NHD; the scales
    stored in the caches' order, with `pad` unused elements after each innermost row."""

    def __init__(self, layout="HND", num_blocks=4, pad=0):
        self.layout, self.pad = layout, pad
        shape = (num_blocks, NUM_KV_HEADS, 8, HEAD_DIM)
        self.k, self.v = np.full(shape, 99, np.int8), np.full(shape, 99, np.int8)
        stored = (num_blocks, NUM_KV_HEADS, 8) if layout == "HND" else (num_blocks, 8, NUM_KV_HEADS)
        padded = stored[:2] + (stored[2] + pad,)
        self.storage = [np.full(padded, np.nan, np.float32) for _ in range(2)]
        self.ks, self.vs = (x[:, :, :stored[2]] for x in self.storage)
        if layout == "NHD":  # stored NHD: the caches as they are, the scales as HND views
            self.k, self.v = self.k.swapaxes(1, 2).copy(), self.v.swapaxes(1, 2).copy()
            self.ks, self.vs = self.ks.swapaxes(1, 2), self.vs.swapaxes(1, 2)

    def hnd(self, x):
        """A cache in HND order (a view of an NHD one)."""
        return x.swapaxes(1, 2) if self.layout == "NHD" else x

    def snapshot(self) -> bytes:
        return b"".join(x.tobytes() for x in [self.k, self.v] + self.storage)

    def write(self, key, value, slots, **kw):
        pagedattn.write_cache(key, value, np.asarray(slots, np.int32), self.k, self.v,
                              kv_layout=self.layout, **kw)

    def copy(self, pairs, **kw):
        pagedattn.copy_blocks(self.k, self.v, pairs, kv_layout=self.layout, **kw)

    def token_kwargs(self):
        return dict(k_token_scales=self.ks, v_token_scales=self.vs)

    def padding_untouched(self) -> bool:
        """Whether the unused elements beside the scales still hold NaN."""
        return all(np.isnan(x[:, :, x.shape[2] - self.pad:]).all() for x in self.storage)


# ----------------------------------------------------------------------------------------------
# The references


def test_the_int8_quantizer_rounds_ties_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 126.5, 127.49, 127.5, 128.0,
                  1e30, -1e30, np.inf, -np.inf, np.nan, -126.5, -0.0], np.float32)
    want = [0, 2, 2, 0, -2, -2, 0, 126, 127, 127, 127, 127, -127, 127, -127, 0, -126, 0]
    got = int8_quantize(x)
    assert got.dtype == np.int8 and got.tolist() == want
    assert store(np.float32(-300), "int8") == -127  # never -128
    assert load(np.array([-128, -127, 0, 127], np.int8), "int8").tolist() == [-128, -127, 0, 127]


def test_the_row_scales_follow_the_definition():
    rows = np.zeros((1, 2, 6, 4), np.float32)  # [tokens, kv heads, rows, values]
    rows[0, 0, 0] = [3, -254, 1, 0]            # amax 254: 254 / (127 x 1) = 2
    rows[0, 0, 1] = [0, 0, 0, 0]               # nothing nonzero: 1
    rows[0, 0, 2] = [np.nan, np.inf, -np.inf, 0]  # nothing finite and nonzero: 1
    rows[0, 0, 3] = [np.nan, 5.08, np.inf, -1]  # the finite ones only: 5.08 / 127
    rows[0, 0, 4] = [1e-38, 0, 0, 0]           # below 1e-30: clamped
    rows[0, 0, 5] = [3e38, 0, 0, 0]            # 3e38 / 127 above 1e30: clamped
    rows[0, 1] = rows[0, 0]
    s = row_scales(rows, "int8", np.array([1.0, 1e-3], np.float32), head_axis=1)
    assert s.dtype == np.float32 and s.shape == (1, 2, 6)
    assert s[0, 0].tolist() == [2.0, 1.0, 1.0, np.float32(np.float64(np.float32(5.08)) / 127),
                                MIN_KV_SCALE, MAX_KV_SCALE]
    assert s[0, 1, 0] == np.float32(254 / (127 * np.float64(np.float32(1e-3))))
    assert s[0, 1, 1:3].tolist() == [1.0, 1.0]  # 1 whatever the head scale
    assert s[0, 1, 4] == MIN_KV_SCALE and s[0, 1, 5] == MAX_KV_SCALE
    codes, scales = quantize_rows(rows, "int8", np.array([1.0, 1e-3], np.float32))
    assert np.array_equal(scales, s)
    assert codes[0, 0, 0].tolist() == [2, -127, 0, 0]  # 3 / 2 = 1.5 -> 2, 1 / 2 = 0.5 -> 0
    assert codes[0, 0, 2].tolist() == [0, 127, -127, 0]
    assert codes[0, 0, 3].tolist() == [0, 127, 127, -25]


# ----------------------------------------------------------------------------------------------
# decode


@pytest.mark.parametrize("q_dtype", DTYPES)
@pytest.mark.parametrize("scales", list(SCALES))
@pytest.mark.parametrize("token_scales", [False, True], ids=["no_token_scales", "token_scales"])
def test_decode_matches_the_reference(q_dtype, scales, token_scales):
    c = int8_case(1, q_dtype, scales, token_scales)
    kw = c.scale_kwargs()
    assert ("k_token_scales" in kw) == token_scales
    out, lse = pagedattn.decode(*c.args(), return_lse=True, **kw)
    assert out.dtype == c.q.dtype and out.shape == c.q.shape
    want_out, want_lse = c.reference()
    check_out(out, q_dtype, want_out)
    check_lse(lse, want_lse)


def test_decode_into_another_out_dtype():
    c = int8_case(2, "bf16", "head")
    out = empty(c.q.shape, "f16")
    pagedattn.decode(*c.args(), out=out, **c.scale_kwargs())
    check_out(out, "f16", c.reference()[0])


def test_decode_reads_the_token_scales():
    """Doubling every V scale doubles out exactly; changing one K row's scale changes the result
    as the reference says; dropping the per-token scales reads the codes without them."""
    c = int8_case(3, "f32", "both")
    kw = c.scale_kwargs()
    out = pagedattn.decode(*c.args(), **kw)
    doubled = pagedattn.decode(*c.args(), **dict(kw, v_token_scales=c.v_token_scales * 2))
    assert np.array_equal(doubled, 2 * out)
    block = c.block_table[-1, 0]  # the long sequence's first block
    c.k_token_scales[block, 1, 3] *= 40
    changed = pagedattn.decode(*c.args(), **c.scale_kwargs())
    assert not np.allclose(changed[-1], out[-1])
    check_out(changed, "f32", c.reference()[0])
    without = {name: value for name, value in kw.items() if "token" not in name}
    c.k_token_scales = c.v_token_scales = None  # the same codes under the head scales alone
    check_out(pagedattn.decode(*c.args(), **without), "f32", c.reference()[0])


def test_decode_with_variants():
    c = int8_case(4, "bf16", "both", context_lens=[0, 5, 40, 300])
    rng = np.random.default_rng(5)
    slopes = rng.uniform(0.01, 0.5, 8).astype(np.float32)
    sinks = rng.standard_normal(8).astype(np.float32)
    variants = dict(window_left=20, logits_soft_cap=30.0, alibi_slopes=slopes, sinks=sinks)
    out, lse = pagedattn.decode(*c.args(), return_lse=True, **variants, **c.scale_kwargs())
    want_out, want_lse = c.reference(**variants)
    check_out(out, "bf16", want_out)
    check_lse(lse, want_lse)


def test_decode_of_nhd_caches_with_strided_scale_views():
    """NHD caches with their scales kept NHD-ordered ([num_blocks, block_size, num_kv_heads],
    passed as the permuted view), as views into one combined tensor, and as a slice of a padded
    pool: the bits of the dense HND call."""
    c = int8_case(6, "f16", "both")
    want = pagedattn.decode(*c.args(), **c.scale_kwargs())
    kw = dict(k_scale=c.k_scale, v_scale=c.v_scale, k_scales=c.k_scales, v_scales=c.v_scales)
    k_nhd, v_nhd = c.k.swapaxes(1, 2).copy(), c.v.swapaxes(1, 2).copy()
    ks, vs = nhd(c.k_token_scales), nhd(c.v_token_scales)
    assert ks.shape == c.k_token_scales.shape and not ks.flags.c_contiguous
    got = pagedattn.decode(c.q, k_nhd, v_nhd, c.block_table, c.context_lens, kv_layout="NHD",
                           k_token_scales=ks, v_token_scales=vs, **kw)
    assert got.tobytes() == want.tobytes()
    # vLLM-like: [num_blocks, 2, block_size, num_kv_heads, ...] for codes and scales alike.
    nb = c.k.shape[0]
    codes = np.full((nb, 2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM), 127, np.int8)
    codes[:, 0], codes[:, 1] = k_nhd, v_nhd
    scales = np.full((nb, 2, BLOCK_SIZE, NUM_KV_HEADS), np.nan, np.float32)
    scales[:, 0] = c.k_token_scales.swapaxes(1, 2)
    scales[:, 1] = c.v_token_scales.swapaxes(1, 2)
    got = pagedattn.decode(c.q, codes[:, 0], codes[:, 1], c.block_table, c.context_lens,
                           kv_layout="NHD", k_token_scales=scales[:, 0].swapaxes(1, 2),
                           v_token_scales=scales[:, 1].swapaxes(1, 2), **kw)
    assert got.tobytes() == want.tobytes()
    # HND caches, scales a slice of a pool padded per head and with spare blocks.
    pad = np.full((nb + 3, NUM_KV_HEADS, BLOCK_SIZE + 5), np.nan, np.float32)
    pads = pad.copy(), pad.copy()
    pads[0][:nb, :, :BLOCK_SIZE] = c.k_token_scales
    pads[1][:nb, :, :BLOCK_SIZE] = c.v_token_scales
    got = pagedattn.decode(c.q, c.k, c.v, c.block_table, c.context_lens,
                           k_token_scales=pads[0][:nb, :, :BLOCK_SIZE],
                           v_token_scales=pads[1][:nb, :, :BLOCK_SIZE], **kw)
    assert got.tobytes() == want.tobytes()


def test_int8_through_dlpack_alone():
    """A producer that offers DLPack only (no buffer protocol), as CuPy and JAX do."""

    class DLPackOnly:
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, *args, **kwargs):
            return self._a.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    c = int8_case(7, "f32", "tensor")
    want = pagedattn.decode(*c.args(), **c.scale_kwargs())
    kw = dict(c.scale_kwargs(), k_token_scales=DLPackOnly(c.k_token_scales),
              v_token_scales=DLPackOnly(c.v_token_scales))
    got = pagedattn.decode(c.q, DLPackOnly(c.k), DLPackOnly(c.v), c.block_table, c.context_lens,
                           **kw)
    assert got.tobytes() == want.tobytes()


# ----------------------------------------------------------------------------------------------
# write_cache and copy_blocks


# Where write tests put special_keys' tokens: (block, slot) (1, 1), (0, 0), (3, 7), (2, 1),
# skipped, (1, 0), of 8-slot blocks.
SPECIAL_SLOTS = [9, 0, 31, 17, -1, 8]


def special_keys(rng):
    """Keys [6 tokens, kv heads, head dim] whose rows cover the per-token scale's cases: random
    rows, zero and non-finite rows, NaN and Inf among finite values, ties, and values that
    clamp the scale at either end (with head scales of at most 1)."""
    key = (rng.standard_normal((6, NUM_KV_HEADS, HEAD_DIM)) * 3).astype(np.float32)
    key[1, 0] = 0  # no nonzero value: scale 1
    key[1, 1] = np.nan  # no finite value: scale 1, codes 0
    key[2, 0, :4] = [np.inf, np.nan, -np.inf, 2.0]  # the finite ones set the scale
    key[2, 1] = 1e-38  # amax / 127 below 1e-30: the scale clamps to 1e-30, codes 0
    key[3, 0, :3] = [3e38, -3e38, 1.0]  # amax / 127 above 1e30: clamps to 1e30
    key[3, 1] = 0  # amax 127: scale 1 / head scale, so the codes are x rounded: ties to even
    key[3, 1, :7] = [127, 0.5, 1.5, 2.5, -0.5, -1.5, -126.5]
    key[4] = 1.0  # a skipped token
    key[5, 0] = np.float32(-0.0)  # -0 is no nonzero value: scale 1
    return key


@pytest.mark.parametrize("layout,pad", [("HND", 0), ("NHD", 0), ("HND", 3)])
@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("scales", ["none", "both"])
def test_write_cache_computes_the_token_scales_and_codes(layout, pad, src, scales):
    rng = np.random.default_rng(10)
    key = special_keys(rng)
    value = (rng.standard_normal(key.shape) * 0.1).astype(np.float32)
    slots = SPECIAL_SLOTS
    kw = {k: (np.asarray(v, np.float32) if isinstance(v, list) else v)
          for k, v in SCALES[scales].items()}
    if scales == "both":  # kv head 0 under 0.25 x 1e-3, kv head 1 under 0.25 x 0.5 = 1/8
        kw["k_scales"] = np.array([1e-3, 0.5], np.float32)
    pool = Pool(layout, pad=pad)
    with np.errstate(over="ignore"):  # 3e38 is Inf in f16
        key_in, value_in = store(key, src), store(value, src)
    pool.write(arg(key_in, src), arg(value_in, src), slots, **pool.token_kwargs(), **kw)
    # The reference quantizes the values as read in f32 (the source dtype's rounding first).
    key_f, value_f = load(key_in, src).astype(np.float32), load(value_in, src).astype(np.float32)
    k_heads = per_head_scales(kw.get("k_scale", 1.0), kw.get("k_scales"), NUM_KV_HEADS)
    v_heads = per_head_scales(kw.get("v_scale", 1.0), kw.get("v_scales"), NUM_KV_HEADS)
    k_codes, k_rows = quantize_rows(key_f, "int8", k_heads)
    v_codes, v_rows = quantize_rows(value_f, "int8", v_heads)
    written = np.zeros((4, 8), bool)
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        b, s = divmod(slot, 8)
        written[b, s] = True
        assert pool.ks[b, :, s].tobytes() == k_rows[t].tobytes(), (t, pool.ks[b, :, s], k_rows[t])
        assert pool.vs[b, :, s].tobytes() == v_rows[t].tobytes()
        assert np.array_equal(pool.hnd(pool.k)[b, :, s], k_codes[t]), t
        assert np.array_equal(pool.hnd(pool.v)[b, :, s], v_codes[t]), t
    # The rows not written keep their contents: codes 99, scales NaN.
    rest = ~written
    assert np.isnan(pool.ks.swapaxes(1, 2)[rest]).all()
    assert np.isnan(pool.vs.swapaxes(1, 2)[rest]).all()
    assert (pool.hnd(pool.k).swapaxes(1, 2)[rest] == 99).all()
    assert (pool.hnd(pool.v).swapaxes(1, 2)[rest] == 99).all()
    assert pool.padding_untouched()
    if src == "f32":  # the special rows, spelled out
        k = pool.hnd(pool.k)
        assert pool.ks[0, 0, 0] == 1.0 and (k[0, 0, 0] == 0).all()  # zeros
        assert pool.ks[0, 1, 0] == 1.0 and (k[0, 1, 0] == 0).all()  # NaN -> 0
        assert k[3, 0, 7, :3].tolist() == [127, 0, -127]  # Inf saturates, NaN -> 0
        assert pool.ks[3, 1, 7] == MIN_KV_SCALE and (k[3, 1, 7] == 0).all()
        assert pool.ks[2, 0, 1] == MAX_KV_SCALE and k[2, 0, 1, :3].tolist() == [127, -127, 0]
        assert k[2, 1, 1, :8].tolist() == [127, 0, 2, 2, 0, -2, -126, 0]
        assert pool.ks[1, 0, 0] == 1.0  # -0


def test_write_cache_without_token_scales():
    rng = np.random.default_rng(11)
    key = (rng.standard_normal((5, NUM_KV_HEADS, HEAD_DIM)) * 40).astype(np.float32)
    key[0, 0, :3] = [np.nan, np.inf, -np.inf]
    key[0, 0, 3:7] = [0.5, 1.5, -2.5, 200.0]  # ties and saturation at head scale 1
    pool = Pool()
    scales = np.array([1.0, 0.25], np.float32)
    pool.write(key, -key, [0, 5, 13, 30, 25], k_scales=scales, v_scale=2.0)
    assert np.isnan(pool.ks).all()  # no per-token scales given: none written
    want_k = quantize_heads(key, "int8", per_head_scales(1.0, scales, NUM_KV_HEADS))
    want_v = quantize_heads(-key, "int8", per_head_scales(2.0, None, NUM_KV_HEADS))
    for t, slot in enumerate([0, 5, 13, 30, 25]):
        b, s = divmod(slot, 8)
        assert np.array_equal(pool.k[b, :, s], want_k[t])
        assert np.array_equal(pool.v[b, :, s], want_v[t])
    assert pool.k[0, 0, 0, :7].tolist() == [0, 127, -127, 0, 2, -2, 127]


def test_write_then_decode():
    """Tokens written with per-token scales decode to the attention over the unquantized values,
    within int8's rounding (half a code of each row's largest value)."""
    rng = np.random.default_rng(12)
    num_blocks, lens = 8, np.array([13, 29], np.int32)
    pool = Pool(num_blocks=num_blocks)
    table = np.array([[5, 2, 7, 0], [1, 3, 6, 4]], np.int32)
    slots = np.concatenate([table[b, np.arange(n) // 8] * 8 + np.arange(n) % 8
                            for b, n in enumerate(lens)]).astype(np.int32)
    key = rng.standard_normal((len(slots), NUM_KV_HEADS, HEAD_DIM)).astype(np.float32)
    key *= rng.uniform(0.01, 100, (len(slots), NUM_KV_HEADS, 1)).astype(np.float32)
    value = rng.standard_normal((len(slots), NUM_KV_HEADS, HEAD_DIM)).astype(np.float32)
    pool.write(key, value, slots, k_scale=0.5, **pool.token_kwargs())
    q = rng.standard_normal((2, 4, HEAD_DIM)).astype(np.float32) * 0.05
    out, lse = pagedattn.decode(q, pool.k, pool.v, table, lens, return_lse=True, k_scale=0.5,
                                **pool.token_kwargs())
    # Exactly the reference of what was written ...
    k_vals = pool.k * (0.5 * pool.ks.astype(np.float64))[..., None]
    v_vals = pool.v * pool.vs.astype(np.float64)[..., None]
    with np.errstate(invalid="ignore"):
        want_out, want_lse = reference_decode(q.astype(np.float64), k_vals, v_vals, table, lens)
    check_out(out, "f32", want_out)
    check_lse(lse, want_lse)
    # ... and close to the attention over the values before quantization.
    k_exact = np.full(pool.k.shape, np.nan)
    v_exact = np.full(pool.v.shape, np.nan)
    for t, slot in enumerate(slots):
        k_exact[slot // 8, :, slot % 8] = key[t]
        v_exact[slot // 8, :, slot % 8] = value[t]
    exact_out, _ = reference_decode(q.astype(np.float64), k_exact, v_exact, table, lens)
    assert np.abs(out - exact_out).max() < 0.03


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("pad", [0, 3], ids=["dense", "padded"])
def test_copy_blocks_carries_the_token_scales(layout, pad):
    rng = np.random.default_rng(13)
    pool = Pool(layout, pad=pad)
    key = (rng.standard_normal((16, NUM_KV_HEADS, HEAD_DIM)) * 5).astype(np.float32)
    pool.write(key, key * 2, np.arange(16, dtype=np.int32), **pool.token_kwargs())  # blocks 0, 1
    before = [x.copy() for x in (pool.hnd(pool.k), pool.hnd(pool.v), pool.ks, pool.vs)]
    pool.copy([(1, 3), (0, 2)], **pool.token_kwargs())
    after = (pool.hnd(pool.k), pool.hnd(pool.v), pool.ks, pool.vs)
    assert not np.isnan(before[2][:2]).any()
    for old, new in zip(before, after):
        assert new[3].tobytes() == old[1].tobytes() and new[2].tobytes() == old[0].tobytes()
        assert new[:2].tobytes() == old[:2].tobytes()  # the sources unchanged
    assert not np.isnan(pool.ks[2:]).any() and pool.padding_untouched()
    # Without the scales, copy_blocks copies the codes and leaves the scales as they are.
    pool.ks[3] = pool.vs[3] = 7.0
    pool.copy([(0, 3)])
    assert (pool.ks[3] == 7.0).all() and (pool.vs[3] == 7.0).all()
    assert pool.hnd(pool.k)[3].tobytes() == before[0][0].tobytes()


@pytest.mark.parametrize("fmt", FP8_DTYPES)
def test_fp8_caches_with_token_scales(fmt):
    """Per-token scales serve fp8 caches too: decode against the reference, and write_cache's
    scales (over the format's largest code, 448 or 57344) and codes by the same definition."""
    c = make_case(np.random.default_rng(14), context_lens=lens_for(BLOCK_SIZE),
                  num_kv_heads=NUM_KV_HEADS, kv_dtype=fmt, token_scales=True, **SCALES["both"])
    out, lse = pagedattn.decode(*c.args(), return_lse=True, **c.scale_kwargs())
    want_out, want_lse = c.reference()
    check_out(out, "f32", want_out)
    check_lse(lse, want_lse)
    key = special_keys(np.random.default_rng(15))
    shape = (4, NUM_KV_HEADS, 8, HEAD_DIM)
    k, v = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
    ks, vs = np.zeros(shape[:3], np.float32), np.zeros(shape[:3], np.float32)
    slots = np.array(SPECIAL_SLOTS, np.int32)
    pagedattn.write_cache(key, key, slots, arg(k, fmt), arg(v, fmt), k_scale=0.5,
                          k_token_scales=ks, v_token_scales=vs)
    for scales, codes, head in ((ks, k, 0.5), (vs, v, 1.0)):
        want_codes, want_scales = quantize_rows(key, fmt, per_head_scales(head, None, 2))
        for t, slot in enumerate(slots):
            if slot >= 0:
                b, s = divmod(int(slot), 8)
                assert scales[b, :, s].tobytes() == want_scales[t].tobytes(), t
                table = fp8_values(fmt)  # NaN codes compared as NaN
                assert np.array_equal(table[codes[b, :, s]], table[want_codes[t]], equal_nan=True)
    assert ks[2, 0, 1] == MAX_KV_SCALE and ks[0, 0, 0] == 1.0


# ----------------------------------------------------------------------------------------------
# Errors


@pytest.fixture(scope="module")
def case():
    return int8_case(20, "f32", "head", context_lens=[5, 40, 0], poison=False)


def test_int8_is_for_caches_only(case):
    e = decode_error(case, q=case.q.astype(np.int8))
    assert (e.argument, e.code) == ("q_dtype", "unsupported") and "int8" in str(e), str(e)
    e = decode_error(case, out=np.zeros(case.q.shape, np.int8), **case.scale_kwargs())
    assert (e.argument, e.code) == ("out_dtype", "unsupported"), str(e)
    pool = Pool()
    with pytest.raises(pagedattn.Error) as info:
        pool.write(np.ones((1, 2, 64), np.int8), np.ones((1, 2, 64), np.int8), [0])
    assert (info.value.argument, info.value.code) == ("src_dtype", "unsupported")
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.merge_states(np.zeros((2, 3, 64), np.int8), np.zeros((2, 3), np.float32),
                               out=np.zeros((3, 64), np.float32))
    assert (info.value.argument, info.value.code) == ("part_dtype", "unsupported")


def test_cache_dtypes_must_match(case):
    e = decode_error(case, v=pagedattn.fp8_e4m3(case.v))  # fp8 codes marked on an int8 tensor
    assert e.argument == "v_cache" and "pagedattn.fp8_e4m3(int8)" in str(e), str(e)
    e = decode_error(case, v=case.v.astype(np.float32))
    assert e.argument == "v_cache" and "must equal k_cache.dtype (int8)" in str(e), str(e)
    e = decode_error(case, k=case.k.view(np.uint8), v=case.v.view(np.uint8))
    assert e.argument == "k_cache" and "int8" in str(e) and "uint8" in str(e), str(e)


def refusal(fn, case, **kw) -> pagedattn.Error:
    """The error of a decode of `case` (fn "decode"), or of a write_cache or copy_blocks into a
    Pool, whose per-token scales kw replace the good ones (None: left out); nothing written."""
    if fn == "decode":
        base = case.scale_kwargs()
    else:
        pool = Pool()
        base = pool.token_kwargs()
    base.update(kw)
    base = {name: value for name, value in base.items() if value is not None}
    if fn == "decode":
        return decode_error(case, **base)
    before = pool.snapshot()
    with pytest.raises(pagedattn.Error) as info:
        if fn == "write_cache":
            key = np.ones((1, NUM_KV_HEADS, HEAD_DIM), np.float32)
            pool.write(key, key, [3], **base)
        else:
            pool.copy([(0, 1)], **base)
    assert pool.snapshot() == before
    return info.value


FUNCTIONS = ["decode", "write_cache", "copy_blocks"]


def scale_shape(fn, case):
    return case.k.shape[:3] if fn == "decode" else (4, NUM_KV_HEADS, 8)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_token_scales_come_in_pairs(fn, case):
    ones = np.ones(scale_shape(fn, case), np.float32)
    e = refusal(fn, case, k_token_scales=ones, v_token_scales=None)
    assert (e.argument, e.code) == ("v_token_scales", "invalid_argument"), str(e)
    assert "k_token_scales" in str(e)
    e = refusal(fn, case, k_token_scales=None, v_token_scales=ones)
    assert e.argument == "k_token_scales", str(e)


# One bad tensor (made from good scales) and what its error says.
BAD_TENSORS = [
    ("dtype", lambda s: s.astype(np.float64), "expected float32"),
    ("ndim", lambda s: s[..., 0], "[num_blocks, num_kv_heads, block_size]"),
    ("num_blocks", lambda s: s[:-1], "num_blocks, k_cache.shape[0]"),
    ("nhd_unpermuted", lambda s: np.ascontiguousarray(s.swapaxes(1, 2)), "num_kv_heads"),
    ("block_size", lambda s: s[:, :, :-1], "block_size, k_cache.shape[2]"),
    ("list", lambda s: s.tolist(), "tensor"),
    ("strides", lambda s: nhd(s), "must equal"),  # the other one dense
]
# Strides bad for the pair (both alike), told as k_token_scales'.
as_strided = np.lib.stride_tricks.as_strided
BAD_STRIDES = [
    ("zero", lambda s: as_strided(s, strides=(0,) + s.strides[1:]), "positive stride"),
    ("reversed", lambda s: s[:, ::-1], "positive stride"),
    ("overlap", lambda s: as_strided(s, strides=(s.strides[1],) + s.strides[1:]), "overlap"),
]


@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("name", ["k_token_scales", "v_token_scales"])
@pytest.mark.parametrize("what,bad,says", BAD_TENSORS, ids=[b[0] for b in BAD_TENSORS])
def test_bad_token_scale_tensors(fn, name, what, bad, says, case):
    e = refusal(fn, case, **{name: bad(np.ones(scale_shape(fn, case), np.float32))})
    # Strides that differ are V's error, whichever of the two strays.
    want = "v_token_scales" if what == "strides" else name
    assert (e.argument, e.code) == (want, "invalid_argument"), str(e)
    assert says in str(e), str(e)


@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("what,bad,says", BAD_STRIDES, ids=[b[0] for b in BAD_STRIDES])
def test_bad_token_scale_strides(fn, what, bad, says, case):
    shape = scale_shape(fn, case)
    e = refusal(fn, case, k_token_scales=bad(np.ones(shape, np.float32)),
                v_token_scales=bad(np.ones(shape, np.float32)))
    assert (e.argument, e.code) == ("k_token_scales", "invalid_argument"), str(e)
    assert says in str(e) and "k_token_scales.strides" in str(e), str(e)


@pytest.mark.parametrize("fn", ["write_cache", "copy_blocks"])
def test_written_token_scales_must_be_writable(fn, case):
    scales = np.ones((4, NUM_KV_HEADS, 8), np.float32)
    scales.setflags(write=False)
    e = refusal(fn, case, k_token_scales=scales)
    assert e.argument == "k_token_scales" and "writable" in str(e), str(e)


@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_token_scales_on_an_unquantized_cache(fn, dtype):
    c = make_case(np.random.default_rng(21), context_lens=[5, 40], num_kv_heads=NUM_KV_HEADS,
                  q_dtype=dtype, kv_dtype=dtype, poison=False)
    if fn == "decode":
        ones = np.ones(c.k.shape[:3], np.float32)
        e = decode_error(c, k=arg(c.k, dtype), v=arg(c.v, dtype), k_token_scales=ones,
                         v_token_scales=ones)
    else:
        k = empty((4, NUM_KV_HEADS, 8, HEAD_DIM), dtype)
        v, ones = k.copy(), np.ones((4, NUM_KV_HEADS, 8), np.float32)
        before = k.tobytes() + v.tobytes()
        with pytest.raises(pagedattn.Error) as info:
            if fn == "write_cache":
                key = np.ones((1, NUM_KV_HEADS, HEAD_DIM), np.float32)
                pagedattn.write_cache(key, key, np.array([0], np.int32), arg(k, dtype),
                                      arg(v, dtype), k_token_scales=ones, v_token_scales=ones)
            else:
                pagedattn.copy_blocks(arg(k, dtype), arg(v, dtype), [(0, 1)],
                                      k_token_scales=ones, v_token_scales=ones)
        e = info.value
        assert k.tobytes() + v.tobytes() == before and (ones == 1).all()
    assert (e.argument, e.code) == ("k_token_scales", "unsupported"), str(e)
    assert "quantized" in str(e)


@pytest.mark.parametrize("name", ["k_token_scales", "v_token_scales"])
@pytest.mark.parametrize("value", [0.0, -1.0, np.nan, np.inf, 1e31, 1e-31])
def test_bad_token_scale_values(name, value):
    c = int8_case(22, "f32", "tensor", context_lens=[5, 40])
    scales = getattr(c, name).copy()
    block = c.block_table[1, 2]  # sequence 1's third block: slots 0 to 7 are read
    scales[block, 1, 7] = value
    e = decode_error(c, **dict(c.scale_kwargs(), **{name: scales}))
    assert e.code == "invalid_argument", str(e)
    assert e.argument == f"{name}[block {block}, kv head 1, slot 7]", str(e)


def test_unread_token_scales_are_not_checked():
    """Past a context (slot 8 of sequence 1's third block) or in blocks no sequence reads, any
    value (the cases hold NaN there already) is fine."""
    c = int8_case(23, "f32", "tensor", context_lens=[5, 40])
    scales = c.k_token_scales.copy()
    scales[c.block_table[1, 2], :, 8:] = 0.0
    assert np.isnan(scales).any()
    out = pagedattn.decode(*c.args(), **dict(c.scale_kwargs(), k_token_scales=scales))
    check_out(out, "f32", c.reference()[0])


def test_token_scales_on_another_device(case):
    """Described tensors (how PyTorch tensors reach the module) claiming a CUDA device: refused
    by the device check, naming the argument, before anything is read."""
    q, k, v, table, lens = case.args()
    ones = np.ones(k.shape[:3], np.float32)
    cuda = described(ones)[:3] + (2, 0) + described(ones)[5:]
    out = np.full(q.shape, np.nan, np.float32)
    with pytest.raises(pagedattn.Error) as info:
        _ext.decode(described(q), described(k), described(v), described(table), described(lens),
                    described(out), None, None, "cpu", 0, None, False, [],
                    k_token_scales=cuda, v_token_scales=described(ones))
    assert info.value.argument == "k_token_scales" and "device" in str(info.value)
    assert "cuda:0" in str(info.value) and np.isnan(out).all()


# ----------------------------------------------------------------------------------------------
# PyTorch


@needs_torch
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_torch_decode(layout):
    c = int8_case(30, "bf16", "both")
    want = pagedattn.decode(*c.args(), **c.scale_kwargs())
    q = torch.from_numpy(c.q.view(np.int16).copy()).view(torch.bfloat16)
    k, v = torch.from_numpy(c.k), torch.from_numpy(c.v)
    ks, vs = torch.from_numpy(c.k_token_scales), torch.from_numpy(c.v_token_scales)
    if layout == "NHD":  # caches and scales stored NHD; the scales passed as permuted views
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        ks = ks.transpose(1, 2).contiguous().permute(0, 2, 1)
        vs = vs.transpose(1, 2).contiguous().permute(0, 2, 1)
    assert k.dtype == torch.int8
    out = pagedattn.decode(q, k, v, torch.from_numpy(c.block_table),
                           torch.from_numpy(c.context_lens), kv_layout=layout, k_scale=c.k_scale,
                           v_scale=c.v_scale, k_scales=torch.from_numpy(c.k_scales),
                           v_scales=torch.from_numpy(c.v_scales), k_token_scales=ks,
                           v_token_scales=vs)
    assert out.dtype == torch.bfloat16
    assert out.view(torch.int16).numpy().tobytes() == want.tobytes()


@needs_torch
def test_torch_write_cache_and_copy_blocks():
    rng = np.random.default_rng(31)
    key = special_keys(rng)
    value = rng.standard_normal(key.shape).astype(np.float32)
    slots = np.array([1, 9, 30, -1, 17, 0], np.int32)
    pool = Pool()
    pool.write(key, value, slots, k_scale=0.5, **pool.token_kwargs())
    pool.copy([(1, 2)], **pool.token_kwargs())
    k_t = torch.full((4, NUM_KV_HEADS, 8, HEAD_DIM), 99, dtype=torch.int8)
    v_t = k_t.clone()
    ks_t = torch.full((4, 8, NUM_KV_HEADS), float("nan")).permute(0, 2, 1)  # NHD-ordered
    vs_t = torch.full((4, 8, NUM_KV_HEADS), float("nan")).permute(0, 2, 1)
    scales = dict(k_token_scales=ks_t, v_token_scales=vs_t)
    pagedattn.write_cache(torch.from_numpy(key), torch.from_numpy(value),
                          torch.from_numpy(slots), k_t, v_t, k_scale=0.5, **scales)
    pagedattn.copy_blocks(k_t, v_t, [(1, 2)], **scales)
    assert k_t.numpy().tobytes() == pool.k.tobytes()
    assert v_t.numpy().tobytes() == pool.v.tobytes()
    assert ks_t.contiguous().numpy().tobytes() == pool.ks.tobytes()
    assert vs_t.contiguous().numpy().tobytes() == pool.vs.tobytes()


@needs_torch
def test_torch_int8_query_and_wrong_scales_are_refused():
    c = int8_case(32, "f32", "tensor")
    q, k, v = torch.from_numpy(c.q), torch.from_numpy(c.k), torch.from_numpy(c.v)
    table, lens = torch.from_numpy(c.block_table), torch.from_numpy(c.context_lens)
    ks, vs = torch.from_numpy(c.k_token_scales), torch.from_numpy(c.v_token_scales)
    out = torch.full(q.shape, float("nan"))
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q.to(torch.int8), k, v, table, lens, out=out)
    assert (info.value.argument, info.value.code) == ("q_dtype", "unsupported")
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, k, v, table, lens, out=out, k_token_scales=ks.half(),
                         v_token_scales=vs)
    assert info.value.argument == "k_token_scales" and "float32" in str(info.value)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, k, v, table, lens, out=out, k_token_scales=ks, v_token_scales=vs.mT)
    assert info.value.argument == "v_token_scales"
    assert torch.isnan(out).all()


# ----------------------------------------------------------------------------------------------
# CUDA


@needs_cuda
@pytest.mark.parametrize("q_dtype", ["f16", "bf16"])
@pytest.mark.parametrize("scales", ["tensor", "both"])
@pytest.mark.parametrize("token_scales", [False, True], ids=["no_token_scales", "token_scales"])
def test_cuda_decode_matches_the_reference(q_dtype, scales, token_scales):
    c = int8_case(40, q_dtype, scales, token_scales=token_scales)
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[q_dtype]
    q = torch.from_numpy(c.q.view(np.int16).copy()).view(torch_dtype).cuda()
    k, v = torch.from_numpy(c.k).cuda(), torch.from_numpy(c.v).cuda()
    kw = {n: (torch.from_numpy(np.asarray(x, np.float32)).cuda() if n.endswith("scales") else x)
          for n, x in c.scale_kwargs().items()}
    out, lse = pagedattn.decode(q, k, v, torch.from_numpy(c.block_table).cuda(),
                                torch.from_numpy(c.context_lens).cuda(), return_lse=True, **kw)
    torch.cuda.synchronize()
    want_out, want_lse = c.reference()
    check_out(out.cpu().view(torch.int16).numpy().view(c.q.dtype), q_dtype, want_out)
    check_lse(lse.cpu().numpy(), want_lse)


@needs_cuda
def test_cuda_write_cache_and_copy_blocks_match_cpu():
    rng = np.random.default_rng(41)
    key = special_keys(rng)
    value = rng.standard_normal(key.shape).astype(np.float32)
    slots = np.array([1, 9, 30, -1, 17, 0], np.int32)
    pool = Pool()
    pool.write(key, value, slots, k_scale=0.5, v_scale=0.03, **pool.token_kwargs())
    pool.copy([(1, 2)], **pool.token_kwargs())
    k_t = torch.full((4, NUM_KV_HEADS, 8, HEAD_DIM), 99, dtype=torch.int8, device="cuda")
    v_t = k_t.clone()
    ks_t = torch.full((4, NUM_KV_HEADS, 8), float("nan"), device="cuda")
    vs_t = ks_t.clone()
    scales = dict(k_token_scales=ks_t, v_token_scales=vs_t)
    pagedattn.write_cache(torch.from_numpy(key).cuda(), torch.from_numpy(value).cuda(),
                          torch.from_numpy(slots).cuda(), k_t, v_t, k_scale=0.5, v_scale=0.03,
                          **scales)
    pagedattn.copy_blocks(k_t, v_t, [(1, 2)], **scales)
    torch.cuda.synchronize()
    assert k_t.cpu().numpy().tobytes() == pool.k.tobytes()
    assert v_t.cpu().numpy().tobytes() == pool.v.tobytes()
    assert ks_t.cpu().numpy().tobytes() == pool.ks.tobytes()
    assert vs_t.cpu().numpy().tobytes() == pool.vs.tobytes()
