"""Random paged decode cases and a NumPy float64 reference, shared by the tests.

Storage dtypes: "f32" (np.float32), "f16" (np.float16) and "bf16". NumPy has no bfloat16, so a
bf16 tensor is a uint16 array of bf16 bit patterns here, passed as pagedattn.bf16(array); the
conversions below round to nearest even like the library does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

import pagedattn

DTYPES = ("f32", "f16", "bf16")

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


def store(x: np.ndarray, dtype: str) -> np.ndarray:
    """Values rounded to the storage dtype, as the raw array the library reads."""
    if dtype == "f32":
        return np.asarray(x, dtype=np.float32)
    if dtype == "f16":
        return np.asarray(x, dtype=np.float16)
    if dtype == "bf16":
        return f32_to_bf16_bits(x)
    raise ValueError(dtype)


def load(raw: np.ndarray, dtype: str) -> np.ndarray:
    """The stored values as float64."""
    if dtype == "bf16":
        return bf16_bits_to_f32(raw).astype(np.float64)
    return np.asarray(raw).astype(np.float64)


def arg(raw: np.ndarray, dtype: str):
    """How a test passes a stored array to pagedattn."""
    return pagedattn.bf16(raw) if dtype == "bf16" else raw


def empty(shape, dtype: str) -> np.ndarray:
    """An output buffer of the storage dtype, filled with NaN (all-ones bits)."""
    np_dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[dtype]
    out = np.empty(shape, dtype=np_dtype)
    out.view(np.uint8)[...] = 0xFF
    return out


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

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    def args(self):
        return (arg(self.q, self.q_dtype), arg(self.k, self.kv_dtype), arg(self.v, self.kv_dtype),
                self.block_table, self.context_lens)

    def reference(self, scale: Optional[float] = None, **variants):
        """The f64 reference of this case; ``variants`` as reference_decode takes them."""
        return reference_decode(load(self.q, self.q_dtype), load(self.k, self.kv_dtype),
                                load(self.v, self.kv_dtype), self.block_table, self.context_lens,
                                scale, **variants)


def make_case(rng: np.random.Generator, *, context_lens: Sequence[int], num_heads: int = 8,
              num_kv_heads: int = 2, head_dim: int = 64, block_size: int = 16,
              q_dtype: str = "f32", kv_dtype: str = "f32", spare_blocks: int = 5,
              extra_width: int = 2, poison: bool = True) -> Case:
    """A fragmented paged case: every sequence's blocks are scattered over an oversized pool in
    random order, table entries past each context are -1 or garbage, and cache slots nobody
    reads hold NaN (poison) so that reading one shows."""
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
    return Case(store(q, q_dtype), store(k, kv_dtype), store(v, kv_dtype), table, lens, q_dtype,
                kv_dtype, block_size)


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


def check_out(got_raw: np.ndarray, out_dtype: str, want: np.ndarray) -> float:
    got = load(got_raw, out_dtype)
    assert np.all(np.isfinite(got)), "non-finite output"
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    err = float(np.abs(got - want).max(initial=0.0))
    assert err <= OUT_TOL[out_dtype] * max(scale, 1.0), (err, scale, out_dtype)
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
