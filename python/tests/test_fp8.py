"""fp8 KV caches (docs/fp8.md) from Python: decode, write_cache and copy_blocks on caches of fp8
codes, e4m3 or e5m2, with per-tensor (k_scale, v_scale) and per-kv-head (k_scales, v_scales)
scales.

The references are _cases.py's: the codes' values come from 256-entry tables built from the
formats' bit definitions, decode is checked against the float64 reference of the dequantized
codes (code x scale, exactly) within the output dtype's usual tolerance, and write_cache against
a NumPy quantizer (the nearest code, ties to the even code, saturation, NaN and Inf) bit for bit.
NumPy always (uint8 codes marked with pagedattn.fp8_e4m3() / fp8_e5m2(), and ml_dtypes arrays
where ml_dtypes is installed); PyTorch's float8 tensors on the CPU where PyTorch is installed and
on CUDA where a GPU is present."""

from __future__ import annotations

import math

import numpy as np
import pytest

import pagedattn
from pagedattn import _ext
from _cases import (DTYPES, FP8_DTYPES, FP8_MAX_CODE, arg, check_lse, check_out, empty,
                    fp8_quantize, fp8_values, lens_for, load, make_case, per_head_scales,
                    quantize_heads, same_codes, special_values, store)

try:
    import torch
except ImportError:  # the NumPy tests run without it
    torch = None

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

needs_torch_fp8 = pytest.mark.skipif(
    torch is None or not hasattr(torch, "float8_e4m3fn"), reason="needs PyTorch with float8")
needs_cuda = pytest.mark.skipif(
    torch is None or not hasattr(torch, "float8_e4m3fn")
    or not (torch.cuda.is_available() and pagedattn.cuda_available()[0]),
    reason="needs PyTorch with float8, a CUDA GPU and a pagedattn built with CUDA")
needs_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason="needs ml_dtypes")

# Scales of a case: K and V each per tensor, per kv head, or both (two kv heads).
SCALES = {
    "tensor": dict(k_scale=0.0125, v_scale=3.5),
    "head": dict(k_scales=[0.5, 0.02], v_scales=[4.0, 0.25]),
    "both": dict(k_scale=0.25, v_scale=0.5, k_scales=[0.05, 0.1], v_scales=[3.0, 0.125]),
}


def to_layout(x_hnd: np.ndarray, layout: str) -> np.ndarray:
    return x_hnd if layout == "HND" else np.ascontiguousarray(x_hnd.transpose(0, 2, 1, 3))


def as_hnd(x: np.ndarray, layout: str) -> np.ndarray:
    return x if layout == "HND" else x.transpose(0, 2, 1, 3)


def fp8_case(seed, fmt, q_dtype="f32", scales="both", **kw):
    return make_case(np.random.default_rng(seed), context_lens=kw.pop("context_lens",
                                                                      lens_for(16)),
                     num_heads=8, num_kv_heads=2, head_dim=64, block_size=16, q_dtype=q_dtype,
                     kv_dtype=fmt, **SCALES[scales], **kw)


# ----------------------------------------------------------------------------------------------
# The reference's tables and quantizer


def test_the_tables_follow_the_bit_definitions():
    e4m3, e5m2 = fp8_values("fp8_e4m3"), fp8_values("fp8_e5m2")
    assert e4m3[0x7E] == 448 and e4m3[0xFE] == -448 and e4m3[0x38] == 1.0
    assert e4m3[0x01] == 2.0**-9 and e4m3[0x08] == 2.0**-6 and e4m3[0x07] == 7 * 2.0**-9
    assert np.isnan(e4m3[0x7F]) and np.isnan(e4m3[0xFF]) and np.isnan(e4m3).sum() == 2
    assert not np.isinf(e4m3).any()
    assert e5m2[0x7B] == 57344 and e5m2[0x3C] == 1.0 and e5m2[0x01] == 2.0**-16
    assert e5m2[0x7C] == math.inf and e5m2[0xFC] == -math.inf and np.isnan(e5m2).sum() == 6
    for table in (e4m3, e5m2):
        assert table[0x00] == 0 and table[0x80] == 0 and np.signbit(table[0x80])
        positive = table[: 0x80][np.isfinite(table[: 0x80])]
        assert np.all(np.diff(positive) > 0)  # codes order as their values
        assert np.array_equal(table[0x80:], -table[:0x80], equal_nan=True)


@needs_ml_dtypes
@pytest.mark.parametrize("fmt,ml_name", [("fp8_e4m3", "float8_e4m3fn"),
                                         ("fp8_e5m2", "float8_e5m2")])
def test_the_tables_and_the_quantizer_agree_with_ml_dtypes(fmt, ml_name):
    ml = getattr(ml_dtypes, ml_name)
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(fp8_values(fmt), codes.view(ml).astype(np.float64), equal_nan=True)
    # Within the range (ml_dtypes does not saturate), the same rounding.
    rng = np.random.default_rng(0)
    top = fp8_values(fmt)[FP8_MAX_CODE[fmt]]
    x = (rng.uniform(-1, 1, 100_000) * top).astype(np.float32)
    x = np.concatenate([x, (rng.standard_normal(100_000) * 1e-3).astype(np.float32)])
    assert np.array_equal(fp8_quantize(x, fmt), x.astype(ml).view(np.uint8))


@pytest.mark.parametrize("fmt", FP8_DTYPES)
def test_the_quantizer_keeps_every_code_and_rounds_ties_to_even(fmt):
    table = fp8_values(fmt)
    finite = np.isfinite(table)
    codes = np.arange(256)[finite]
    assert np.array_equal(fp8_quantize(table[finite], fmt), codes)
    top = FP8_MAX_CODE[fmt]
    for c in range(top):  # the midpoint of codes c and c + 1 goes to the even one
        mid = np.float32((table[c] + table[c + 1]) / 2)
        assert fp8_quantize(mid, fmt) == (c if c % 2 == 0 else c + 1)
        assert fp8_quantize(-mid, fmt) == 0x80 | (c if c % 2 == 0 else c + 1)
    assert fp8_quantize(np.float32(1e30), fmt) == top
    assert fp8_quantize(np.float32(-1e30), fmt) == 0x80 | top
    assert np.isnan(table[fp8_quantize(np.float32(np.nan), fmt)])
    inf = table[fp8_quantize(np.float32(np.inf), fmt)]
    assert (np.isnan(inf) if fmt == "fp8_e4m3" else inf == np.inf)


# ----------------------------------------------------------------------------------------------
# decode


@pytest.mark.parametrize("fmt", FP8_DTYPES)
@pytest.mark.parametrize("q_dtype", DTYPES)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("scales", list(SCALES))
def test_decode_matches_the_reference(fmt, q_dtype, layout, scales):
    c = fp8_case(1, fmt, q_dtype, scales)
    out, lse = pagedattn.decode(arg(c.q, q_dtype), arg(to_layout(c.k, layout), fmt),
                                arg(to_layout(c.v, layout), fmt), c.block_table, c.context_lens,
                                return_lse=True, kv_layout=layout, **c.scale_kwargs())
    assert out.dtype == c.q.dtype and out.shape == c.q.shape
    want_out, want_lse = c.reference()
    check_out(out, q_dtype, want_out)
    check_lse(lse, want_lse)


@pytest.mark.parametrize("fmt", FP8_DTYPES)
@pytest.mark.parametrize("q_dtype,out_dtype", [("f32", "bf16"), ("bf16", "f16"), ("f16", "f32")])
def test_decode_into_another_out_dtype(fmt, q_dtype, out_dtype):
    c = fp8_case(2, fmt, q_dtype, "head")
    out = empty(c.q.shape, out_dtype)
    pagedattn.decode(*c.args(), out=arg(out, out_dtype), **c.scale_kwargs())
    check_out(out, out_dtype, c.reference()[0])


@pytest.mark.parametrize("fmt", FP8_DTYPES)
def test_decode_scales_with_variants_and_query_tokens(fmt):
    c = fp8_case(3, fmt, "bf16", "both", context_lens=[0, 5, 40, 300])
    rng = np.random.default_rng(4)
    slopes = rng.uniform(0.01, 0.5, 8).astype(np.float32)
    sinks = rng.standard_normal(8).astype(np.float32)
    out, lse = pagedattn.decode(*c.args(), return_lse=True, window_left=20,
                                logits_soft_cap=30.0, alibi_slopes=slopes, sinks=sinks,
                                **c.scale_kwargs())
    want_out, want_lse = c.reference(window_left=20, logits_soft_cap=30.0, alibi_slopes=slopes,
                                     sinks=sinks)
    check_out(out, "bf16", want_out)
    check_lse(lse, want_lse)


@pytest.mark.parametrize("fmt", FP8_DTYPES)
def test_decode_without_scales_reads_the_codes_as_they_are(fmt):
    c = make_case(np.random.default_rng(5), context_lens=[1, 17, 100], kv_dtype=fmt)
    assert c.scale_kwargs() == {}
    out, lse = pagedattn.decode(*c.args(), return_lse=True)
    want_out, want_lse = c.reference()
    check_out(out, "f32", want_out)
    check_lse(lse, want_lse)
    # A scale of 1 given explicitly is the same call.
    again = pagedattn.decode(*c.args(), k_scale=1.0, v_scale=1, k_scales=np.ones(2, np.float32),
                             v_scales=np.ones(2, np.float32))
    assert np.array_equal(again, out)


def test_per_tensor_and_per_head_scales_multiply():
    """k_scale * k_scales[h] is one scale: moving a factor of 2 from one to the other changes
    no bit."""
    c = fp8_case(6, "fp8_e4m3", "f32", "both")
    kw = c.scale_kwargs()
    out = pagedattn.decode(*c.args(), **kw)
    moved = dict(kw, k_scale=kw["k_scale"] * 2, k_scales=c.k_scales / 2,
                 v_scale=kw["v_scale"] / 4, v_scales=c.v_scales * 4)
    assert np.array_equal(pagedattn.decode(*c.args(), **moved), out)


@pytest.mark.parametrize("fmt", FP8_DTYPES)
def test_decode_of_views_into_a_combined_tensor(fmt):
    """vLLM's [num_blocks, 2, block_size, num_kv_heads, head_dim] of fp8 codes: the halves are
    read in place, with the bits of the dense HND call."""
    c = fp8_case(7, fmt, "f16", "head")
    want = pagedattn.decode(*c.args(), **c.scale_kwargs())
    combined = np.full((c.k.shape[0], 2, c.k.shape[2], c.k.shape[1], c.k.shape[3]), 0xFF,
                       np.uint8)
    combined[:, 0] = c.k.transpose(0, 2, 1, 3)
    combined[:, 1] = c.v.transpose(0, 2, 1, 3)
    got = pagedattn.decode(arg(c.q, "f16"), arg(combined[:, 0], fmt), arg(combined[:, 1], fmt),
                           c.block_table, c.context_lens, kv_layout="NHD", **c.scale_kwargs())
    assert got.tobytes() == want.tobytes()


@needs_ml_dtypes
@pytest.mark.parametrize("fmt,ml_name", [("fp8_e4m3", "float8_e4m3fn"),
                                         ("fp8_e5m2", "float8_e5m2")])
def test_ml_dtypes_arrays_need_no_marking(fmt, ml_name):
    ml = getattr(ml_dtypes, ml_name)
    c = fp8_case(8, fmt, "f32", "tensor")
    want = pagedattn.decode(*c.args(), **c.scale_kwargs())
    got = pagedattn.decode(c.q, c.k.view(ml), c.v.view(ml), c.block_table, c.context_lens,
                           **c.scale_kwargs())
    assert got.tobytes() == want.tobytes()
    # write_cache and copy_blocks write ml_dtypes arrays in place.
    k, v = np.zeros((4, 2, 8, 64), ml), np.zeros((4, 2, 8, 64), ml)
    key = np.random.default_rng(9).standard_normal((2, 2, 64)).astype(np.float32)
    pagedattn.write_cache(key, -key, np.array([3, 9], np.int32), k, v, k_scale=0.5)
    assert np.array_equal(k.view(np.uint8)[0, :, 3], fp8_quantize(key[0] / np.float32(0.5), fmt))
    assert np.array_equal(v.view(np.uint8)[1, :, 1], fp8_quantize(-key[1], fmt))
    pagedattn.copy_blocks(k, v, [(1, 2)])
    assert k.view(np.uint8)[2].tobytes() == k.view(np.uint8)[1].tobytes()


@pytest.mark.parametrize("fmt,code", [("fp8_e4m3", 10), ("fp8_e5m2", 12)])
def test_described_fp8_caches(fmt, code):
    """PyTorch's float8 tensors reach the module described with DLPack 1.1's type codes
    (float8_e4m3fn 10, float8_e5m2 12): the same result as the marked arrays."""
    c = fp8_case(10, fmt, "f32", "head")
    want = pagedattn.decode(*c.args(), **c.scale_kwargs())

    def described(a, type_code, bits):
        return (a.ctypes.data, type_code, bits, 1, 0, tuple(a.shape),
                tuple(s // a.itemsize for s in a.strides))

    out = np.full_like(want, np.nan)
    _ext.decode(described(c.q, 2, 32), described(c.k, code, 8), described(c.v, code, 8),
                c.block_table, c.context_lens, out, None, None, "cpu", 0, None, False, [],
                k_scales=c.k_scales, v_scales=c.v_scales)
    assert out.tobytes() == want.tobytes()
    # Other 8-bit float formats are refused, by name.
    with pytest.raises(pagedattn.Error) as info:
        _ext.decode(described(c.q, 2, 32), described(c.k, 11, 8), described(c.v, 11, 8),
                    c.block_table, c.context_lens, out, None, None, "cpu", 0, None, False, [])
    assert info.value.argument == "k_cache" and "float8_e4m3fnuz" in str(info.value)


@pytest.mark.parametrize("fmt", FP8_DTYPES)
def test_workspace_size_takes_fp8_caches(fmt):
    c = fp8_case(11, fmt)
    assert pagedattn.workspace_size(arg(c.q, "f32"), arg(c.k, fmt), c.block_table) == 0


# ----------------------------------------------------------------------------------------------
# write_cache


def tokens_of(values: np.ndarray, kv: int, d: int) -> np.ndarray:
    """values laid out as [num_tokens, kv, d], padded with zeros."""
    n = -(-len(values) // (kv * d))
    out = np.zeros(n * kv * d, np.float32)
    out[: len(values)] = values
    return out.reshape(n, kv, d)


@pytest.mark.parametrize("fmt", FP8_DTYPES)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_write_cache_rounds_to_nearest_even_and_saturates(fmt, layout):
    """Scales that are powers of two keep the ties ties: x / scale is exact. Every stored code
    is the reference quantizer's, bit for bit."""
    kv, d, bs = 2, 64, 8
    values = special_values(fmt)
    k_head = per_head_scales(0.5, [2.0, 4.0], kv)  # 1 and 2
    v_head = per_head_scales(2.0, None, kv)
    base = tokens_of(values, kv, d)
    with np.errstate(over="ignore"):
        key = (base * k_head[None, :, None]).astype(np.float32)
        value = (base * v_head[None, :, None]).astype(np.float32)
    n = key.shape[0]
    num_blocks = -(-n // bs) + 2
    slots = np.random.default_rng(12).permutation(num_blocks * bs)[:n].astype(np.int32)
    k_cache = to_layout(np.full((num_blocks, kv, bs, d), 0x55, np.uint8), layout)
    v_cache = k_cache.copy()
    pagedattn.write_cache(key, value, slots, arg(k_cache, fmt), arg(v_cache, fmt),
                          kv_layout=layout, k_scale=0.5, k_scales=np.array([2, 4], np.float32),
                          v_scale=2.0)
    want_k = np.full((num_blocks, kv, bs, d), 0x55, np.uint8)
    want_v = want_k.copy()
    for i, s in enumerate(slots):
        want_k[s // bs, :, s % bs] = quantize_heads(key[i], fmt, k_head, head_axis=0)
        want_v[s // bs, :, s % bs] = quantize_heads(value[i], fmt, v_head, head_axis=0)
    same_codes(as_hnd(k_cache, layout), want_k, fmt)
    same_codes(as_hnd(v_cache, layout), want_v, fmt)
    # The data reached every case: ties, saturation, NaN and (e5m2) Inf codes were written.
    stored = as_hnd(k_cache, layout)[slots // bs, :, slots % bs]
    assert np.isin(FP8_MAX_CODE[fmt], stored) and np.isin(0x80 | FP8_MAX_CODE[fmt], stored)
    assert np.isnan(fp8_values(fmt)[stored]).any()
    if fmt == "fp8_e5m2":
        assert np.isin(0x7C, stored) and np.isin(0xFC, stored)


@pytest.mark.parametrize("fmt", FP8_DTYPES)
@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("scales", list(SCALES))
def test_write_cache_divides_by_the_scales(fmt, src, scales):
    """Any scales: each value x (of the source dtype) becomes the code nearest x / scale, the
    division in float32 with scale = k_scale * k_scales[h]."""
    rng = np.random.default_rng(13)
    kv, d, bs, num_blocks = 2, 64, 4, 6
    kw = dict(SCALES[scales])
    kw = {name: (np.asarray(x, np.float32) if isinstance(x, list) else x)
          for name, x in kw.items()}
    magnitudes = np.array([1e-3, 0.1, 1, 10, 300], np.float32)[:, None, None]
    key32 = (rng.standard_normal((5, kv, d)) * magnitudes).astype(np.float32)
    value32 = (rng.standard_normal((5, kv, d)) * magnitudes).astype(np.float32)
    key, value = store(key32, src), store(value32, src)
    slots = np.array([3, -1, 4 * 5 + 1, 9, 0], np.int32)  # -1: skipped
    k_cache = np.full((num_blocks, kv, bs, d), 0x55, np.uint8)
    v_cache = k_cache.copy()
    pagedattn.write_cache(arg(key, src), arg(value, src), slots, arg(k_cache, fmt),
                          arg(v_cache, fmt), **kw)
    k_head = per_head_scales(kw.get("k_scale", 1.0), kw.get("k_scales"), kv)
    v_head = per_head_scales(kw.get("v_scale", 1.0), kw.get("v_scales"), kv)
    want_k = np.full_like(k_cache, 0x55)
    want_v = want_k.copy()
    for i, s in enumerate(slots):
        if s >= 0:
            x_k = load(key[i], src).astype(np.float32)
            x_v = load(value[i], src).astype(np.float32)
            want_k[s // bs, :, s % bs] = quantize_heads(x_k, fmt, k_head, head_axis=0)
            want_v[s // bs, :, s % bs] = quantize_heads(x_v, fmt, v_head, head_axis=0)
    assert np.array_equal(k_cache, want_k)
    assert np.array_equal(v_cache, want_v)


@pytest.mark.parametrize("fmt", FP8_DTYPES)
def test_written_caches_decode_with_the_same_scales(fmt):
    """write_cache then decode with one set of scales: the decode matches the reference over
    the stored codes times the scales."""
    rng = np.random.default_rng(14)
    kv, heads, d, bs, num_blocks = 2, 8, 64, 8, 12
    lens = np.array([30, 0, 57], np.int32)
    table = np.full((3, 8), -1, np.int32)
    perm = rng.permutation(num_blocks).astype(np.int32)
    table[0, :4], table[2, :8] = perm[:4], perm[4:12]
    kw = dict(k_scale=0.03, k_scales=np.array([1.5, 0.25], np.float32), v_scale=0.2)
    k_cache = np.zeros((num_blocks, bs, kv, d), np.uint8)  # NHD
    v_cache = np.zeros_like(k_cache)
    k_all, v_all = np.zeros((num_blocks, kv, bs, d)), np.zeros((num_blocks, kv, bs, d))
    for b, n in enumerate(lens):
        if n == 0:
            continue
        slots = (table[b, np.arange(n) // bs] * bs + np.arange(n) % bs).astype(np.int32)
        key = rng.standard_normal((n, kv, d)).astype(np.float32)
        value = rng.standard_normal((n, kv, d)).astype(np.float32) * 3
        pagedattn.write_cache(key, value, slots, arg(k_cache, fmt), arg(v_cache, fmt),
                              kv_layout="NHD", **kw)
    q = store(rng.standard_normal((3, heads, d)), "f16")
    out, lse = pagedattn.decode(arg(q, "f16"), arg(k_cache, fmt), arg(v_cache, fmt), table, lens,
                                return_lse=True, kv_layout="NHD", **kw)
    c = make_case(rng, context_lens=[1])  # a Case to compute the reference with
    c.q, c.q_dtype, c.kv_dtype = q, "f16", fmt
    c.k, c.v = k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3)
    c.block_table, c.context_lens = table, lens
    c.k_scale, c.k_scales, c.v_scale = kw["k_scale"], kw["k_scales"], kw["v_scale"]
    want_out, want_lse = c.reference()
    check_out(out, "f16", want_out)
    check_lse(lse, want_lse)


# ----------------------------------------------------------------------------------------------
# copy_blocks


@pytest.mark.parametrize("fmt", FP8_DTYPES)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_copy_blocks_copies_the_codes(fmt, layout):
    rng = np.random.default_rng(15)
    k = rng.integers(0, 256, (6, 8, 2, 64), dtype=np.uint8)  # NaN codes included
    if layout == "HND":
        k = np.ascontiguousarray(k.transpose(0, 2, 1, 3))
    v = rng.integers(0, 256, k.shape, dtype=np.uint8)
    k0, v0 = k.copy(), v.copy()
    pagedattn.copy_blocks(arg(k, fmt), arg(v, fmt), [(0, 3), (5, 1)], kv_layout=layout)
    assert k[3].tobytes() == k0[0].tobytes() and v[1].tobytes() == v0[5].tobytes()
    untouched = [0, 2, 4, 5]
    assert k[untouched].tobytes() == k0[untouched].tobytes()
    assert v[untouched].tobytes() == v0[untouched].tobytes()


# ----------------------------------------------------------------------------------------------
# Errors: each names the argument (or the library's field), before anything is written.


@pytest.fixture
def case():
    return fp8_case(16, "fp8_e4m3", "f32", "head", context_lens=[5, 40, 0], poison=False)


def decode_error(c, q=None, k=None, v=None, out=None, **kw) -> pagedattn.Error:
    q = arg(c.q, c.q_dtype) if q is None else q
    k = arg(c.k, c.kv_dtype) if k is None else k
    v = arg(c.v, c.kv_dtype) if v is None else v
    out = np.full(c.q.shape, np.nan, np.float32) if out is None else out
    raw_out = out.tensor if isinstance(out, (pagedattn.BF16Bits, pagedattn.FP8Bits)) else out
    before = raw_out.tobytes()
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, k, v, c.block_table, c.context_lens, out=out, **kw)
    assert raw_out.tobytes() == before  # nothing written
    return info.value


def write_error(fmt="fp8_e4m3", cache_dtype=None, key=None, **kw) -> pagedattn.Error:
    cache_dtype = fmt if cache_dtype is None else cache_dtype
    key = np.ones((2, 2, 64), np.float32) if key is None else key
    k_cache = empty((3, 2, 8, 64), cache_dtype)
    v_cache = empty((3, 2, 8, 64), cache_dtype)
    before = k_cache.tobytes() + v_cache.tobytes()
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.write_cache(key, key, np.array([0, 9], np.int32), arg(k_cache, cache_dtype),
                              arg(v_cache, cache_dtype), **kw)
    assert k_cache.tobytes() + v_cache.tobytes() == before
    return info.value


def test_fp8_is_for_caches_only(case):
    q8 = store(case.q, "fp8_e4m3")
    e = decode_error(case, q=pagedattn.fp8_e4m3(q8), out=np.zeros(case.q.shape, np.float32))
    assert (e.argument, e.code) == ("q_dtype", "unsupported"), str(e)
    e = decode_error(case, out=pagedattn.fp8_e5m2(np.zeros(case.q.shape, np.uint8)))
    assert (e.argument, e.code) == ("out_dtype", "unsupported"), str(e)
    e = write_error(key=pagedattn.fp8_e4m3(np.zeros((2, 2, 64), np.uint8)))
    assert (e.argument, e.code) == ("src_dtype", "unsupported"), str(e)
    parts = pagedattn.fp8_e4m3(np.zeros((2, 3, 64), np.uint8))
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.merge_states(parts, np.zeros((2, 3), np.float32),
                               out=np.zeros((3, 64), np.float32))
    assert (info.value.argument, info.value.code) == ("part_dtype", "unsupported")


@pytest.mark.parametrize("kw,argument", [
    (dict(k_scale=0.0), "k_scale"),
    (dict(k_scale=-1.0), "k_scale"),
    (dict(k_scale=float("nan")), "k_scale"),
    (dict(v_scale=float("inf")), "v_scale"),
    (dict(k_scale=1e31), "k_scale"),
    (dict(v_scale=1e-31), "v_scale"),
    (dict(k_scale=1e-50), "k_scale"),  # 0 in float32
    (dict(v_scale=1e40), "v_scale"),  # inf in float32
    (dict(k_scales=np.array([1.0, 0.0], np.float32)), "k_scales[1]"),
    (dict(v_scales=np.array([np.nan, 1.0], np.float32)), "v_scales[0]"),
    (dict(v_scales=np.array([1.0, np.inf], np.float32)), "v_scales[1]"),
], ids=str)
def test_bad_scale_values(case, kw, argument):
    e = decode_error(case, **kw)
    assert (e.argument, e.code) == (argument, "invalid_argument"), str(e)
    e = write_error(**kw)
    assert (e.argument, e.code) == (argument, "invalid_argument"), str(e)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw,argument", [
    (dict(k_scale=2.0), "k_scale"),
    (dict(v_scale=0.5), "v_scale"),
    (dict(k_scales=np.ones(2, np.float32)), "k_scales"),
    (dict(v_scales=np.ones(2, np.float32)), "v_scales"),
], ids=str)
def test_scales_on_a_cache_that_is_not_fp8(dtype, kw, argument):
    c = make_case(np.random.default_rng(17), context_lens=[5, 40], num_kv_heads=2,
                  q_dtype=dtype, kv_dtype=dtype, poison=False)
    e = decode_error(c, **kw)
    assert (e.argument, e.code) == (argument, "unsupported"), str(e)
    assert "fp8" in str(e)
    e = write_error(cache_dtype=dtype, **kw)
    assert (e.argument, e.code) == (argument, "unsupported"), str(e)


@pytest.mark.parametrize("kw,argument,says", [
    (dict(k_scales=np.ones(3, np.float32)), "k_scales", "num_kv_heads"),
    (dict(v_scales=np.ones(1, np.float32)), "v_scales", "num_kv_heads"),
    (dict(k_scales=np.ones(2, np.float64)), "k_scales", "float32"),
    (dict(k_scales=np.ones((2, 1), np.float32)), "k_scales", "[num_kv_heads]"),
    (dict(v_scales=np.ones(4, np.float32)[::2]), "v_scales", "contiguous"),
    (dict(k_scales=[1.0, 1.0]), "k_scales", "tensor"),
    (dict(k_scale="2"), "k_scale", "number"),
    (dict(v_scale=True), "v_scale", "number"),
    (dict(k_scale=np.ones(1, np.float32)), "k_scale", "number"),
], ids=str)
def test_bad_scale_arguments(case, kw, argument, says):
    e = decode_error(case, **kw)
    assert (e.argument, e.code) == (argument, "invalid_argument"), str(e)
    assert says in str(e)
    e = write_error(**kw)
    assert (e.argument, e.code) == (argument, "invalid_argument"), str(e)


def test_scales_may_be_numpy_numbers():
    kw = dict(k_scale=np.float32(0.5), v_scale=np.float64(2.0))
    c = fp8_case(16, "fp8_e4m3", "f32", "head", context_lens=[5, 40, 0], poison=False,
                 k_scale=0.5, v_scale=2.0)
    out = pagedattn.decode(*c.args(), k_scales=c.k_scales, v_scales=c.v_scales, **kw)
    check_out(out, "f32", c.reference()[0])


def test_bad_fp8_tensors(case):
    e = decode_error(case, k=case.k, v=case.v)  # codes without a marking
    assert e.argument == "k_cache" and "pagedattn.fp8_e4m3()" in str(e), str(e)
    e = decode_error(case, k=pagedattn.fp8_e4m3(case.k.astype(np.uint16)),
                     v=pagedattn.fp8_e4m3(case.v.astype(np.uint16)))
    assert e.argument == "k_cache" and "8-bit integer" in str(e), str(e)
    e = decode_error(case, v=pagedattn.fp8_e5m2(case.v))  # K e4m3, V e5m2
    assert e.argument == "v_cache" and e.code == "invalid_argument", str(e)
    e = decode_error(case, v=pagedattn.bf16(np.zeros(case.v.shape, np.uint16)))
    assert e.argument == "v_cache", str(e)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.FP8Bits(case.k, "fp8_e3m4")
    assert info.value.argument == "format"


@needs_ml_dtypes
def test_other_ml_dtypes_float8_formats_are_refused(case):
    k = case.k.view(ml_dtypes.float8_e4m3fnuz)
    e = decode_error(case, k=k, v=case.v.view(ml_dtypes.float8_e4m3fnuz))
    assert e.argument == "k_cache" and "float8_e4m3fnuz" in str(e), str(e)


def test_markings_repr():
    a = np.zeros(3, np.uint8)
    assert repr(pagedattn.fp8_e4m3(a)).startswith("pagedattn.fp8_e4m3(")
    assert pagedattn.fp8_e5m2(a).tensor is a and pagedattn.fp8_e5m2(a).format == "fp8_e5m2"


# ----------------------------------------------------------------------------------------------
# PyTorch


TORCH_FP8 = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def torch_codes(raw: np.ndarray, fmt: str, device="cpu"):
    return torch.from_numpy(np.ascontiguousarray(raw)).view(getattr(torch, TORCH_FP8[fmt])).to(
        device)


def torch_raw(t) -> np.ndarray:
    return t.detach().cpu().view(torch.uint8).numpy()


def torch_case(c, device):
    to = {"f32": torch.float32, "f16": torch.float16}
    if c.q_dtype == "bf16":
        q = torch.from_numpy(c.q.view(np.int16).copy()).view(torch.bfloat16)
    else:
        q = torch.from_numpy(c.q.copy()).to(to[c.q_dtype])
    kw = c.scale_kwargs()
    for name in ("k_scales", "v_scales"):
        if name in kw:
            kw[name] = torch.from_numpy(kw[name]).to(device)
    return (q.to(device), torch_codes(c.k, c.kv_dtype, device),
            torch_codes(c.v, c.kv_dtype, device), torch.from_numpy(c.block_table).to(device),
            torch.from_numpy(c.context_lens).to(device)), kw


def torch_out_raw(out, dtype) -> np.ndarray:
    out = out.detach().cpu()
    if dtype == "bf16":
        return out.view(torch.int16).numpy().view(np.uint16)
    return out.numpy()


@needs_torch_fp8
@pytest.mark.parametrize("fmt", FP8_DTYPES)
@pytest.mark.parametrize("q_dtype", DTYPES)
def test_torch_cpu_decode(fmt, q_dtype):
    c = fp8_case(18, fmt, q_dtype, "both")
    tensors, kw = torch_case(c, "cpu")
    out, lse = pagedattn.decode(*tensors, return_lse=True, **kw)
    want = pagedattn.decode(*c.args(), **c.scale_kwargs())
    assert torch_out_raw(out, q_dtype).tobytes() == want.tobytes()
    want_out, want_lse = c.reference()
    check_out(torch_out_raw(out, q_dtype), q_dtype, want_out)
    check_lse(lse.numpy(), want_lse)


@needs_torch_fp8
@pytest.mark.parametrize("fmt", FP8_DTYPES)
def test_torch_cpu_write_cache_and_copy_blocks(fmt):
    rng = np.random.default_rng(19)
    key = rng.standard_normal((3, 2, 64)).astype(np.float32) * 20
    value = rng.standard_normal((3, 2, 64)).astype(np.float32)
    slots = np.array([1, 9, 30], np.int32)
    scales = np.array([0.5, 0.125], np.float32)
    k_np, v_np = np.zeros((4, 2, 8, 64), np.uint8), np.zeros((4, 2, 8, 64), np.uint8)
    pagedattn.write_cache(key, value, slots, arg(k_np, fmt), arg(v_np, fmt), k_scales=scales,
                          v_scale=0.01)
    k_t = torch.zeros(4, 2, 8, 64, dtype=getattr(torch, TORCH_FP8[fmt]))
    v_t = torch.zeros_like(k_t)
    pagedattn.write_cache(torch.from_numpy(key), torch.from_numpy(value),
                          torch.from_numpy(slots), k_t, v_t, k_scales=torch.from_numpy(scales),
                          v_scale=0.01)
    assert torch_raw(k_t).tobytes() == k_np.tobytes()
    assert torch_raw(v_t).tobytes() == v_np.tobytes()
    pagedattn.copy_blocks(k_t, v_t, [(1, 2)])
    assert torch_raw(k_t)[2].tobytes() == k_np[1].tobytes()


@needs_torch_fp8
def test_torch_fp8_query_is_refused():
    c = fp8_case(20, "fp8_e4m3")
    (q, k, v, table, lens), kw = torch_case(c, "cpu")
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q.to(torch.float8_e4m3fn), k, v, table, lens,
                         out=torch.zeros(q.shape), **kw)
    assert (info.value.argument, info.value.code) == ("q_dtype", "unsupported")


@needs_cuda
@pytest.mark.parametrize("fmt", FP8_DTYPES)
@pytest.mark.parametrize("q_dtype", DTYPES)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_cuda_decode(fmt, q_dtype, layout):
    c = fp8_case(21, fmt, q_dtype, "both", context_lens=[0, 1, 15, 16, 17, 300, 2000])
    (q, k, v, table, lens), kw = torch_case(c, "cuda")
    if layout == "NHD":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    out, lse = pagedattn.decode(q, k, v, table, lens, return_lse=True, kv_layout=layout,
                                checked=True, **kw)
    torch.cuda.synchronize()
    want_out, want_lse = c.reference()
    check_out(torch_out_raw(out, q_dtype), q_dtype, want_out)
    check_lse(lse.cpu().numpy(), want_lse)


@needs_cuda
@pytest.mark.parametrize("fmt", FP8_DTYPES)
def test_cuda_write_cache_matches_cpu(fmt):
    rng = np.random.default_rng(22)
    key = torch.from_numpy(special_values(fmt)[: 5 * 2 * 64].reshape(5, 2, 64).copy())
    value = torch.from_numpy(rng.standard_normal((5, 2, 64)).astype(np.float32))
    slots = torch.tensor([0, 17, -1, 100, 127], dtype=torch.int32)
    scales = torch.tensor([1.0, 2.0])
    dtype = getattr(torch, TORCH_FP8[fmt])
    k_cpu = torch.zeros(8, 2, 16, 64, dtype=dtype)
    v_cpu = torch.zeros_like(k_cpu)
    k_gpu, v_gpu = k_cpu.cuda(), v_cpu.cuda()
    pagedattn.write_cache(key, value, slots, k_cpu, v_cpu, k_scales=scales, v_scale=0.25)
    pagedattn.write_cache(key.cuda(), value.cuda(), slots.cuda(), k_gpu, v_gpu,
                          k_scales=scales.cuda(), v_scale=0.25)
    pagedattn.copy_blocks(k_cpu, v_cpu, [(1, 4)])
    pagedattn.copy_blocks(k_gpu, v_gpu, [(1, 4)])
    torch.cuda.synchronize()
    assert torch_raw(k_gpu).tobytes() == torch_raw(k_cpu).tobytes()
    assert torch_raw(v_gpu).tobytes() == torch_raw(v_cpu).tobytes()


@needs_cuda
def test_cuda_errors():
    c = fp8_case(23, "fp8_e5m2", "bf16", "head", context_lens=[30, 70], poison=False)
    (q, k, v, table, lens), kw = torch_case(c, "cuda")
    out = torch.full_like(q, float("nan"))

    def err(**overrides):
        with pytest.raises(pagedattn.Error) as info:
            pagedattn.decode(q, k, v, table, lens, out=out, **dict(kw, **overrides))
        torch.cuda.synchronize()
        assert torch.isnan(out).all()  # nothing written
        return info.value

    e = err(k_scales=kw["k_scales"].cpu())
    assert e.argument == "k_scales" and "device" in str(e)
    e = err(v_scales=kw["v_scales"][:1])
    assert e.argument == "v_scales"
    bad = kw["k_scales"].clone()
    bad[1] = 0
    e = err(k_scales=bad, checked=True)
    assert (e.argument, e.code) == ("k_scales[1]", "invalid_argument")
    e = err(k_scale=0.0)
    assert e.argument == "k_scale"


@pytest.mark.parametrize("fmt", FP8_DTYPES)
def test_write_cache_saturates_a_quotient_beyond_float32(fmt):
    """A finite value over a tiny scale overflows float32 in the division; it still saturates to
    the largest finite code of its sign, as every finite value beyond the range does."""
    kv, d, bs = 1, 64, 4
    key = np.zeros((1, kv, d), np.float32)
    key[0, 0, :4] = [3e38, -3e38, 1.0, np.inf]
    slots = np.array([0], np.int32)
    k_cache = np.zeros((2, kv, bs, d), np.uint8)
    v_cache = k_cache.copy()
    pagedattn.write_cache(key, key, slots, arg(k_cache, fmt), arg(v_cache, fmt), k_scale=1e-3)
    codes = k_cache[0, 0, 0, :4]
    assert codes[0] == FP8_MAX_CODE[fmt] and codes[1] == 0x80 | FP8_MAX_CODE[fmt]
    assert codes[2] == quantize_heads(np.array([[1.0]], np.float32), fmt, np.array([1e-3]))[0, 0]
    # Inf is not finite: Inf in e5m2, NaN in e4m3 (which has no Inf).
    assert codes[3] == (0x7C if fmt == "fp8_e5m2" else 0x7F)
