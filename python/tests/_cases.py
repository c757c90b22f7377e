"""Random paged decode cases and a NumPy float64 reference, shared by the tests.

Storage dtypes: "f32" (np.float32), "f16" (np.float16) and "bf16", and for K and V caches the
quantized ones: the fp8 formats "fp8_e4m3" and "fp8_e5m2", and "int8" (np.int8 codes -127..127).
NumPy has neither bfloat16 nor fp8, so a bf16 tensor is a uint16 array of bf16 bit patterns here,
passed as pagedattn.bf16(array), and an fp8 one a uint8 array of codes, passed as
pagedattn.fp8_e4m3(array) or pagedattn.fp8_e5m2(array); the conversions below round to nearest
even like the library does. The fp8 conversions come from 256-entry tables of the codes' values,
built from the formats' bit definitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import pytest

import pagedattn

try:
    import torch
except ImportError:  # the NumPy tests run without it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch")
needs_cuda = pytest.mark.skipif(
    torch is None or not (torch.cuda.is_available() and pagedattn.cuda_available()[0]),
    reason="needs PyTorch, a CUDA GPU and a pagedattn built with CUDA")

DTYPES = ("f32", "f16", "bf16")
FP8_DTYPES = ("fp8_e4m3", "fp8_e5m2")
QUANTIZED_DTYPES = FP8_DTYPES + ("int8",)
# The largest code magnitude of each quantized dtype: write_cache's per-token scales map a row's
# largest finite |x| onto it.
MAX_CODE_MAGNITUDE = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0, "int8": 127.0}
# The range of every scale of a quantized cache (pagedattn's kMinKvScale, kMaxKvScale).
MIN_KV_SCALE, MAX_KV_SCALE = np.float32(1e-30), np.float32(1e30)

# The error bound against the f64 reference, relative to max |out|: f32 arithmetic plus the
# final rounding to the output dtype (half an ulp: 2^-11 for f16, 2^-8 for bf16), with headroom.
OUT_TOL = {"f32": 2e-5, "f16": 1e-3, "bf16": 8e-3}
LSE_TOL = 1e-4


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float -> bf16 bit patterns (uint16), round to nearest even, NaN kept."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# fp8 formats: (exponent bits, mantissa bits, exponent bias, whether the all-ones exponent holds
# Inf and NaN as in IEEE: e5m2; e4m3 has no Inf and one NaN per sign, S.1111.111).
_FP8_FORMATS = {"fp8_e4m3": (4, 3, 7, False), "fp8_e5m2": (5, 2, 15, True)}
# The largest finite code of each format (sign bit clear): e4m3 448, e5m2 57344.
FP8_MAX_CODE = {"fp8_e4m3": 0x7E, "fp8_e5m2": 0x7B}
_FP8_TABLES: Dict[str, np.ndarray] = {}


def fp8_values(dtype: str) -> np.ndarray:
    """The values of the 256 codes of an fp8 format (float64, indexed by code), from the bit
    definitions: sign, exponent, mantissa; subnormals at exponent 0."""
    table = _FP8_TABLES.get(dtype)
    if table is None:
        exp_bits, man_bits, bias, ieee = _FP8_FORMATS[dtype]
        top = (1 << exp_bits) - 1
        values = []
        for code in range(256):
            e = (code >> man_bits) & top
            m = code & ((1 << man_bits) - 1)
            if ieee and e == top:
                v = math.inf if m == 0 else math.nan
            elif not ieee and e == top and m == (1 << man_bits) - 1:
                v = math.nan
            elif e == 0:
                v = math.ldexp(m, 1 - bias - man_bits)
            else:
                v = math.ldexp((1 << man_bits) + m, e - bias - man_bits)
            values.append(math.copysign(v, -1.0 if code & 0x80 else 1.0))
        table = np.array(values, dtype=np.float64)
        table.setflags(write=False)
        _FP8_TABLES[dtype] = table
    return table


def fp8_quantize(y: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values -> fp8 codes (uint8) as the library stores them: the nearest finite code,
    ties to the even code; beyond the largest finite value, that value (saturation); NaN ->
    NaN; Inf -> Inf in e5m2 and NaN in e4m3 (which has no Inf). Signs kept (-0 -> 0x80)."""
    y = np.asarray(y, dtype=np.float32).astype(np.float64)
    top = FP8_MAX_CODE[dtype]
    mags = fp8_values(dtype)[: top + 1]  # codes 0 .. top, increasing
    a = np.abs(y)
    finite = np.isfinite(a)
    a_f = np.where(finite, a, 0.0)
    hi = np.minimum(np.searchsorted(mags, a_f, side="left"), top)
    lo = np.maximum(hi - 1, 0)
    mid = (mags[lo] + mags[hi]) / 2  # exact: the codes have at most 3 mantissa bits
    code = np.where(a_f < mid, lo, np.where(a_f > mid, hi, np.where(lo % 2 == 0, lo, hi)))
    nan_code = 0x7F if dtype == "fp8_e4m3" else 0x7E
    inf_code = 0x7F if dtype == "fp8_e4m3" else 0x7C
    code = np.where(np.isnan(y), nan_code, code)
    code = np.where(np.isinf(y), inf_code, code)
    code = code | np.where(np.signbit(y), 0x80, 0)
    return code.astype(np.uint8)


def same_codes(got: np.ndarray, want: np.ndarray, fmt: str) -> None:
    """Codes equal, except that any NaN code stands for NaN (the quantizer's is canonical)."""
    table = fp8_values(fmt)
    got_nan, want_nan = np.isnan(table[got]), np.isnan(table[want])
    assert np.array_equal(got_nan, want_nan)
    bad = (got != want) & ~want_nan
    assert not bad.any(), (np.argwhere(bad)[:5], got[bad][:5], want[bad][:5])


def special_values(fmt: str) -> np.ndarray:
    """float32 values (in code units) that exercise the rounding: every finite code's value,
    the midpoints between neighbouring codes (ties) and the floats either side of them, values
    past the largest finite code (saturation), below the smallest subnormal, f32 subnormals,
    signed zeros, Inf and NaN."""
    table = fp8_values(fmt)
    top = FP8_MAX_CODE[fmt]
    pos = table[: top + 1]
    mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)
    near = np.concatenate([np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(1e9))])
    big = np.float32(pos[-1])
    beyond = np.array([big * 1.0001, big * 1.06, big * 1.07, big * 1.5, big * 2, 1e10, 1e30,
                       3e38], np.float32)
    tiny = np.array([pos[1] / 2, np.nextafter(np.float32(pos[1] / 2), np.float32(1)),
                     np.nextafter(np.float32(pos[1] / 2), np.float32(0)), pos[1] / 4, 1e-30,
                     1e-45, 0.0], np.float32)
    special = np.array([np.inf, np.nan], np.float32)
    v = np.concatenate([pos.astype(np.float32), mids, near, beyond, tiny, special])
    return np.concatenate([v, -v]).astype(np.float32)


def int8_quantize(y: np.ndarray) -> np.ndarray:
    """float32 values -> int8 codes as the library stores them: the nearest integer, ties to
    even; beyond +-127 (Inf included) +-127; NaN, which no code holds, 0."""
    y = np.asarray(y, dtype=np.float32)
    y = np.nan_to_num(y, nan=0.0, posinf=127.0, neginf=-127.0)
    return np.rint(np.clip(y, -127.0, 127.0)).astype(np.int8)


def store(x: np.ndarray, dtype: str) -> np.ndarray:
    """Values rounded to the storage dtype, as the raw array the library reads."""
    if dtype == "f32":
        return np.asarray(x, dtype=np.float32)
    if dtype == "f16":
        return np.asarray(x, dtype=np.float16)
    if dtype == "bf16":
        return f32_to_bf16_bits(x)
    if dtype in _FP8_FORMATS:
        return fp8_quantize(x, dtype)
    if dtype == "int8":
        return int8_quantize(x)
    raise ValueError(dtype)


def load(raw: np.ndarray, dtype: str) -> np.ndarray:
    """The stored values as float64 (for fp8 and int8, the codes' values, unscaled)."""
    if dtype == "bf16":
        return bf16_bits_to_f32(raw).astype(np.float64)
    if dtype in _FP8_FORMATS:
        return fp8_values(dtype)[np.asarray(raw, dtype=np.uint8)]
    return np.asarray(raw).astype(np.float64)


def arg(raw: np.ndarray, dtype: str):
    """How a test passes a stored array to pagedattn."""
    if dtype == "bf16":
        return pagedattn.bf16(raw)
    if dtype == "fp8_e4m3":
        return pagedattn.fp8_e4m3(raw)
    if dtype == "fp8_e5m2":
        return pagedattn.fp8_e5m2(raw)
    return raw


def empty(shape, dtype: str) -> np.ndarray:
    """An output buffer of the storage dtype, filled with NaN (all-ones bits)."""
    np_dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16,
                "fp8_e4m3": np.uint8, "fp8_e5m2": np.uint8, "int8": np.int8}[dtype]
    out = np.empty(shape, dtype=np_dtype)
    out.view(np.uint8)[...] = 0xFF
    return out


def per_head_scales(scale: float, scales: Optional[Sequence[float]], num_kv_heads: int
                    ) -> np.ndarray:
    """The scale of each kv head of a quantized cache, in float32 as the library computes it:
    scale * scales[h] (scales None: scale)."""
    s = np.full(num_kv_heads, scale, dtype=np.float32)
    if scales is not None:
        s = s * np.asarray(scales, dtype=np.float32)
    return s


def quantize_scaled(x: np.ndarray, dtype: str, scales: np.ndarray) -> np.ndarray:
    """What a quantized cache stores for float32 values x under float32 scales (broadcast
    against x): the code of x / scale, the division in float32 as in the library, a finite x
    whose quotient overflows saturating."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        y = x / np.asarray(scales, np.float32)
    # A finite x whose quotient overflows float32 saturates like any finite value.
    big = np.finfo(np.float32).max
    y = np.where(np.isfinite(x) & np.isinf(y), np.copysign(big, y), y).astype(np.float32)
    return int8_quantize(y) if dtype == "int8" else fp8_quantize(y, dtype)


def quantize_heads(x: np.ndarray, dtype: str, head_scales: np.ndarray, head_axis: int = 1
                   ) -> np.ndarray:
    """What write_cache stores into a quantized cache for float32 values x: the code of x / s
    per kv head (the axis head_axis of x) as quantize_scaled gives it."""
    shape = [1] * np.ndim(x)
    shape[head_axis] = len(head_scales)
    return quantize_scaled(x, dtype, np.asarray(head_scales, np.float32).reshape(shape))


def row_scales(x: np.ndarray, dtype: str, head_scales: np.ndarray, head_axis: int = 1
               ) -> np.ndarray:
    """The per-token scale write_cache gives each row (the last axis) of float32 values x, whose
    kv head is its index on head_axis: the row's largest finite |x| over (the dtype's largest
    code magnitude x the head's scale), in float64, clamped into [1e-30, 1e30] and rounded to
    float32; 1 for a row with no finite nonzero value. Shape: x's without the last axis."""
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    amax = np.where(np.isfinite(x), np.abs(x), 0.0).max(axis=-1)
    shape = [1] * amax.ndim
    shape[head_axis] = len(head_scales)
    hs = np.asarray(head_scales, np.float32).astype(np.float64).reshape(shape)
    s = np.clip(amax / (MAX_CODE_MAGNITUDE[dtype] * hs), np.float64(MIN_KV_SCALE),
                np.float64(MAX_KV_SCALE))
    return np.where(amax > 0, s, 1.0).astype(np.float32)


def quantize_rows(x: np.ndarray, dtype: str, head_scales: np.ndarray, head_axis: int = 1):
    """What write_cache with per-token scales stores for float32 values x (rows on the last
    axis, kv heads on head_axis): (codes, scales), each row's codes those of x / (s_h x s) in
    float32, s the row's scale (row_scales)."""
    scales = row_scales(x, dtype, head_scales, head_axis)
    shape = [1] * scales.ndim
    shape[head_axis] = len(head_scales)
    hs = np.asarray(head_scales, np.float32).reshape(shape)
    return quantize_scaled(x, dtype, (hs * scales)[..., None]), scales


def to_torch(raw: np.ndarray, dtype: str, device="cpu"):
    """A stored array as the torch tensor of that dtype (bf16 bits become torch.bfloat16)."""
    if dtype == "bf16":
        return torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(raw.copy()).to(device)


def from_torch(t, dtype: str) -> np.ndarray:
    """A torch tensor as the stored array (torch.bfloat16 becomes bf16 bits)."""
    t = t.detach().cpu()
    if dtype == "bf16":
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def case_tensors(c: "Case", device="cpu", q: Optional[np.ndarray] = None):
    """A case's decode arguments as torch tensors on device; q replaces the case's q (the query
    tokens' rows of a multi-token case)."""
    q = c.q if q is None else q
    return (to_torch(q, c.q_dtype, device), to_torch(c.k, c.kv_dtype, device),
            to_torch(c.v, c.kv_dtype, device), torch.from_numpy(c.block_table).to(device),
            torch.from_numpy(c.context_lens).to(device))


def indptr(counts: Sequence[int]) -> np.ndarray:
    """int32 offsets [len(counts) + 1] of consecutive spans of the given lengths."""
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int32)


def refused_decode(args, q_shape, out=None, lse=None, **kwargs) -> pagedattn.Error:
    """pagedattn.decode(*args, **kwargs) with a bad argument: the pagedattn.Error it raises, with
    out (f32, shaped like q unless given) and lse (NaN) untouched."""
    out = empty(q_shape, "f32") if out is None else out
    lse = np.full(q_shape[:2], np.nan, np.float32) if lse is None else lse
    before = out.tobytes(), lse.tobytes()
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(*args, out=out, lse=lse, **kwargs)
    assert (out.tobytes(), lse.tobytes()) == before  # nothing written
    return info.value


def described(a: np.ndarray):
    """A host NumPy array as the module's described-tensor tuple (how PyTorch tensors reach it):
    (data pointer, DLPack type code, bits, lanes, device, shape, strides in elements)."""
    codes = {np.dtype(np.float16): (2, 16), np.dtype(np.float32): (2, 32),
             np.dtype(np.float64): (2, 64), np.dtype(np.int32): (0, 32),
             np.dtype(np.int64): (0, 64), np.dtype(np.int8): (0, 8)}
    code, bits = codes[a.dtype]
    return (a.ctypes.data, code, bits, 1, 0, tuple(a.shape),
            tuple(s // a.itemsize for s in a.strides))


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The ALiBi paper's slopes, 2^(-8 (h + 1) / H)."""
    return (2.0 ** (-8.0 * (np.arange(num_heads) + 1) / num_heads)).astype(np.float32)


def random_sinks(rng: np.random.Generator, num_heads: int) -> np.ndarray:
    """Sink logits around the size of the logits, one head without a sink (-inf)."""
    sinks = (2.0 * rng.standard_normal(num_heads)).astype(np.float32)
    sinks[num_heads // 2] = -np.inf
    return sinks


@dataclass
class Case:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    block_table: np.ndarray
    context_lens: np.ndarray
    q_dtype: str
    kv_dtype: str
    block_size: int
    extras: Dict[str, object] = field(default_factory=dict)
    # Quantized caches: a code c of kv head h means c * k_scale * k_scales[h] in K, times the
    # row's k_token_scales[block, h, slot] with per-token scales; alike in V.
    k_scale: float = 1.0
    v_scale: float = 1.0
    k_scales: Optional[np.ndarray] = None  # float32 [num_kv_heads]
    v_scales: Optional[np.ndarray] = None
    k_token_scales: Optional[np.ndarray] = None  # float32 [num_blocks, num_kv_heads, block_size]
    v_token_scales: Optional[np.ndarray] = None

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    def args(self):
        return (arg(self.q, self.q_dtype), arg(self.k, self.kv_dtype), arg(self.v, self.kv_dtype),
                self.block_table, self.context_lens)

    def scale_kwargs(self) -> Dict[str, object]:
        """The quantized cache's scales as decode's keyword arguments (write_cache's too, but for
        the per-token ones, which it writes); none when unset."""
        kw: Dict[str, object] = {}
        if self.k_scale != 1.0:
            kw["k_scale"] = self.k_scale
        if self.v_scale != 1.0:
            kw["v_scale"] = self.v_scale
        if self.k_scales is not None:
            kw["k_scales"] = self.k_scales
        if self.v_scales is not None:
            kw["v_scales"] = self.v_scales
        if self.k_token_scales is not None:
            kw["k_token_scales"] = self.k_token_scales
            kw["v_token_scales"] = self.v_token_scales
        return kw

    def kv_values(self):
        """The caches' values as float64 [num_blocks, num_kv_heads, block_size, head_dim]: the
        stored values, times the scales for quantized caches (exactly, in float64)."""
        k, v = load(self.k, self.kv_dtype), load(self.v, self.kv_dtype)
        if self.kv_dtype in QUANTIZED_DTYPES:
            kv_heads = k.shape[1]
            for x, scale, scales, rows in ((k, self.k_scale, self.k_scales, self.k_token_scales),
                                           (v, self.v_scale, self.v_scales, self.v_token_scales)):
                s = np.full(kv_heads, float(np.float32(scale)))
                if scales is not None:
                    s = s * np.asarray(scales, dtype=np.float32).astype(np.float64)
                with np.errstate(invalid="ignore"):
                    x *= s[None, :, None, None]
                    if rows is not None:
                        x *= np.asarray(rows, dtype=np.float64)[..., None]
        return k, v

    def reference(self, scale: Optional[float] = None, **variants):
        """The f64 reference of this case; ``variants`` as reference_decode takes them."""
        k, v = self.kv_values()
        return reference_decode(load(self.q, self.q_dtype), k, v, self.block_table,
                                self.context_lens, scale, **variants)


def make_case(rng: np.random.Generator, *, context_lens: Sequence[int], num_heads: int = 8,
              num_kv_heads: int = 2, head_dim: int = 64, block_size: int = 16,
              q_dtype: str = "f32", kv_dtype: str = "f32", spare_blocks: int = 5,
              extra_width: int = 2, poison: bool = True, k_scale: float = 1.0,
              v_scale: float = 1.0, k_scales: Optional[Sequence[float]] = None,
              v_scales: Optional[Sequence[float]] = None, token_scales: bool = False) -> Case:
    """A fragmented paged case: every sequence's blocks are scattered over an oversized pool in
    random order, table entries past each context are -1 or garbage, and cache slots nobody
    reads hold NaN (poison) so that reading one shows. A quantized cache holds the random values
    as write_cache stores them with the given scales (x / scale, rounded), and with
    ``token_scales`` per-token scales as write_cache computes them (the scales of the rows
    nobody reads then NaN, poison too); the scales are kept in the case (Case.scale_kwargs) for
    the other dtypes too, which store the values as they are."""
    lens = np.asarray(context_lens, dtype=np.int32)
    batch = len(lens)
    used = [math.ceil(int(n) / block_size) for n in lens]
    width = max(used + [1]) + extra_width
    num_blocks = sum(used) + spare_blocks
    perm = rng.permutation(num_blocks).astype(np.int32)
    table = np.full((batch, width), -1, dtype=np.int32)
    pos = 0
    for b in range(batch):
        table[b, : used[b]] = perm[pos: pos + used[b]]
        pos += used[b]
        if used[b] < width:  # garbage past the context: never read
            table[b, used[b]:] = rng.choice([-1, 10**6, -(10**6), num_blocks], size=width - used[b])
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    k = rng.standard_normal(shape, dtype=np.float32)
    v = rng.standard_normal(shape, dtype=np.float32)
    if poison:
        readable = np.zeros((num_blocks, block_size), dtype=bool)
        for b in range(batch):
            for t in range(int(lens[b])):
                readable[table[b, t // block_size], t % block_size] = True
        k.transpose(0, 2, 1, 3)[~readable] = np.nan  # [blocks, slots, kv heads, dim] view
        v.transpose(0, 2, 1, 3)[~readable] = np.nan
    q = rng.standard_normal((batch, num_heads, head_dim), dtype=np.float32)
    k_scales = None if k_scales is None else np.asarray(k_scales, dtype=np.float32)
    v_scales = None if v_scales is None else np.asarray(v_scales, dtype=np.float32)
    k_rows = v_rows = None
    k_heads = per_head_scales(k_scale, k_scales, num_kv_heads)
    v_heads = per_head_scales(v_scale, v_scales, num_kv_heads)
    if token_scales:
        k_raw, k_rows = quantize_rows(k, kv_dtype, k_heads)
        v_raw, v_rows = quantize_rows(v, kv_dtype, v_heads)
        if poison:
            k_rows.transpose(0, 2, 1)[~readable] = np.nan
            v_rows.transpose(0, 2, 1)[~readable] = np.nan
    elif kv_dtype in QUANTIZED_DTYPES:
        k_raw, v_raw = quantize_heads(k, kv_dtype, k_heads), quantize_heads(v, kv_dtype, v_heads)
    else:
        k_raw, v_raw = store(k, kv_dtype), store(v, kv_dtype)
    return Case(store(q, q_dtype), k_raw, v_raw, table, lens, q_dtype, kv_dtype, block_size,
                k_scale=k_scale, v_scale=v_scale, k_scales=k_scales, v_scales=v_scales,
                k_token_scales=k_rows, v_token_scales=v_rows)


# The f64 oracle of one-token decode(), written apart from the multi-token one (tokens_reference).
def reference_decode(q, k, v, block_table, context_lens, scale: Optional[float] = None, *,
                     window_left: int = -1, logits_soft_cap: float = 0.0,
                     alibi_slopes: Optional[Sequence[float]] = None,
                     sinks: Optional[Sequence[float]] = None):
    """The f64 two-pass reference: (out [B, H, D], lse [B, H]). With the attention variants
    (docs/variants.md), for the query at position L - 1: only tokens t >= L - 1 - window_left
    are attended (all with -1), a logit s becomes cap * tanh(s / cap) and then
    s + slope_h * (t - (L - 1)), and a sink adds exp(sink_h) to the softmax's denominator (an
    empty context then gives lse = sink_h)."""
    batch, num_heads, head_dim = q.shape
    _, num_kv_heads, block_size, _ = k.shape
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = np.zeros((batch, num_heads, head_dim))
    lse = np.full((batch, num_heads), -np.inf)
    for b in range(batch):
        n = int(context_lens[b])
        if n == 0:
            if sinks is not None:
                lse[b] = np.asarray(sinks, dtype=np.float64)
            continue
        first = max(n - 1 - window_left, 0) if window_left >= 0 else 0
        t = np.arange(first, n)
        blocks = np.asarray(block_table[b])[t // block_size]
        for h in range(num_heads):
            kv = h // group
            keys = k[blocks, kv, t % block_size]      # [tokens, D]
            vals = v[blocks, kv, t % block_size]
            s = scale * (keys @ q[b, h])
            if logits_soft_cap > 0:
                s = logits_soft_cap * np.tanh(s / logits_soft_cap)
            if alibi_slopes is not None:
                s = s + float(alibi_slopes[h]) * (t - (n - 1))
            sink = -np.inf if sinks is None else float(sinks[h])
            m = max(s.max(), sink)
            p = np.exp(s - m)
            denominator = p.sum() + math.exp(sink - m)
            out[b, h] = (p @ vals) / denominator
            lse[b, h] = m + math.log(denominator)
    return out, lse


def mla_reference(q_nope, q_pe, c, kpe, block_table, context_lens, scale=None, q_indptr=None):
    """out [rows, heads, rank] and lse [rows, heads] in float64 from the definition: query row r
    of sequence b, its i-th of n_b, attends tokens t < context_lens[b] - n_b + i + 1 (all of them
    without q_indptr); c and kpe are the cache values [num_blocks, block_size, width]."""
    rows, heads, rank = q_nope.shape
    block_size = c.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(rank + q_pe.shape[2])
    scale = float(np.float32(scale))
    batch = len(context_lens)
    starts = np.arange(batch + 1) if q_indptr is None else np.asarray(q_indptr)
    out = np.zeros((rows, heads, rank))
    lse = np.full((rows, heads), -np.inf)
    for b in range(batch):
        n = int(starts[b + 1] - starts[b])
        for i in range(n):
            r = int(starts[b]) + i
            attended = int(context_lens[b]) - n + i + 1
            if attended <= 0:
                continue
            t = np.arange(attended)
            blocks = block_table[b, t // block_size]
            ct, pt = c[blocks, t % block_size], kpe[blocks, t % block_size]  # [L, width]
            s = scale * (q_nope[r] @ ct.T + q_pe[r] @ pt.T)  # [heads, L]
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            out[r] = (p @ ct) / p.sum(axis=1, keepdims=True)
            lse[r] = m[:, 0] + np.log(p.sum(axis=1))
    return out, lse


def check_out(got_raw: np.ndarray, out_dtype: str, want: np.ndarray,
              tol: Optional[float] = None) -> float:
    """max |got - want| within tol (the output dtype's OUT_TOL unless given) times max |want|,
    or times 1 where the outputs are smaller than that."""
    got = load(got_raw, out_dtype)
    assert np.all(np.isfinite(got)), "non-finite output"
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    err = float(np.abs(got - want).max(initial=0.0))
    tol = OUT_TOL[out_dtype] if tol is None else tol
    assert err <= tol * max(scale, 1.0), (err, scale, out_dtype)
    return err


def check_lse(got: np.ndarray, want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float64)
    inf = np.isinf(want)
    assert np.array_equal(np.isinf(got), inf)
    assert np.all(got[inf] == want[inf])
    if (~inf).any():
        assert np.abs(got[~inf] - want[~inf]).max() <= LSE_TOL


def lens_for(block_size: int, long: int = 300) -> List[int]:
    """Contexts around the block boundaries, an empty one and a long one."""
    return sorted({0, 1, max(block_size - 1, 1), block_size, block_size + 1, long})


def variant_kwargs(name: str, rng: np.random.Generator, num_heads: int, *, window_left: int,
                   scale: float, all_window_left: int, all_soft_cap: float) -> dict:
    """One variant-grid row's decode keyword arguments: "window", "soft_cap" (cap 2 with the
    given scale), "alibi", "sinks" (drawn from rng) or "all" of them. The sinks of both rows are
    drawn, in that order, whichever row is asked for, so rng moves the same either way."""
    return {
        "window": dict(window_left=window_left),
        "soft_cap": dict(logits_soft_cap=2.0, scale=scale),
        "alibi": dict(alibi_slopes=alibi_slopes(num_heads)),
        "sinks": dict(sinks=random_sinks(rng, num_heads)),
        "all": dict(window_left=all_window_left, logits_soft_cap=all_soft_cap,
                    alibi_slopes=alibi_slopes(num_heads), sinks=random_sinks(rng, num_heads)),
    }[name]


def rejection(call, out, **kwargs):
    """The pagedattn.Error that call(**kwargs) raises; out, a tensor filled with NaN before, must
    still be all NaN (nothing written)."""
    with pytest.raises(pagedattn.Error) as info:
        call(**kwargs)
    if out.is_cuda:
        torch.cuda.synchronize()
    assert torch.isnan(out).all()  # nothing written
    return info.value


def rejection_case(seed: int, context_lens: Sequence[int], device="cpu"):
    """The decode tensors of a small case on device (q, k_cache, v_cache, block_table,
    context_lens) and an out like q filled with NaN: what rejection and check_rejected call
    with."""
    tensors = case_tensors(make_case(np.random.default_rng(seed), context_lens=context_lens),
                           device)
    return tensors, torch.full_like(tensors[0], float("nan"))


def check_rejected(call, out, bad_calls) -> None:
    """For each (kwargs, argument) of bad_calls: call(**kwargs) is a rejection (above) naming
    argument."""
    for bad, argument in bad_calls:
        e = rejection(call, out, **bad)
        assert e.argument == argument, str(e)


def torch_of(raw: np.ndarray, dtype: str, device="cpu"):
    """A torch tensor of `raw`'s values (bf16 and fp8 raw codes viewed as torch's dtypes)."""
    if dtype == "bf16":
        return torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16).to(device)
    if dtype in FP8_DTYPES:
        fmt = torch.float8_e4m3fn if dtype == "fp8_e4m3" else torch.float8_e5m2
        return torch.from_numpy(raw.copy()).view(fmt).to(device)
    return torch.from_numpy(raw.copy()).to(device)


def serve_steps(bm, history: dict, empty, write, copy_blocks, steps: int = 6):
    """A serving loop through BlockManager bm, shared by the cache tests: prompts of 5, 0 and 13
    tokens for sequences 10, 11 and 12 (history[seq] = empty, then write(pending)), sequence 13
    forked from 12 (history[13] = history[12]), then `steps` decode steps. Each step appends one
    token to every sequence, copies the blocks copy-on-write asks for (copy_blocks(copies),
    where any), writes the new tokens (write(pending), pending [(seq, slot)]) and yields
    (step, seqs, table, lens, copies) for the caller to decode and check; sequence 10 is freed
    after step 2's."""
    for seq, n in [(10, 5), (11, 0), (12, 13)]:
        history[seq] = empty
        write([(seq, s) for s in bm.add_sequence(seq, n)])
    bm.fork(12, 13)
    history[13] = history[12]
    for step in range(steps):
        seqs = bm.sequences()
        pending, copies = [], []
        for seq in seqs:
            slot, copy = bm.append_token(seq)
            if copy is not None:
                copies.append(copy)
            pending.append((seq, slot))
        if copies:
            copy_blocks(copies)
        write(pending)
        table, lens = bm.tables(seqs)
        yield step, seqs, table, lens, copies
        if step == 2:
            bm.free_sequence(10)
