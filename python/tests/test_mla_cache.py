"""write_mla_cache, copy_mla_blocks and mla_workspace_size against NumPy models: every stored
element is the source value converted as NumPy converts it (round to nearest even; fp8 codes of
value / kv_scale, saturating, from _cases' quantizer), every byte no written row owns untouched,
decodes of written caches against the float64 reference of the values written, and bad calls
refused by argument with the cache unchanged. PyTorch on the CPU and CUDA where present."""

import math
import zlib

import numpy as np
import pytest

import pagedattn
from _cases import (DTYPES, FP8_DTYPES, FP8_MAX_CODE, OUT_TOL, arg, check_lse, check_out,
                    fp8_values, load, mla_reference, needs_cuda, needs_torch, quantize_scaled,
                    same_codes, serve_steps, special_values, store, torch_of)

try:
    import torch
except ImportError:
    torch = None

CACHE_DTYPES = DTYPES + FP8_DTYPES
LAYOUTS = ("combined", "parts", "padded")
STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "fp8_e4m3": np.uint8,
           "fp8_e5m2": np.uint8}
# The unit roundoff of each cache dtype (half the spacing of its values relative to a value):
# what rounding a written value to it changes, relative to the value.
UNIT_ROUNDOFF = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8, "fp8_e4m3": 2.0**-4,
                 "fp8_e5m2": 2.0**-3}


def seeded(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


class Pool:
    """A latent cache of num_blocks x block_size rows of rank + rope elements, filled with 0xff
    bytes (NaN in every float dtype), in one of three layouts: "combined" (one tensor, each row
    c then k_pe), "parts" (two tensors) or "padded" (a combined view of every other block of a
    wider buffer, each row 8 elements in)."""

    def __init__(self, num_blocks, block_size, rank, rope, dtype, layout):
        self.dtype, self.layout, self.rank, self.width = dtype, layout, rank, rank + rope
        t = STORAGE[dtype]
        if layout == "parts":
            shapes = [(num_blocks, block_size, rank), (num_blocks, block_size, rope)]
        elif layout == "combined":
            shapes = [(num_blocks, block_size, rank + rope)]
        else:
            shapes = [(2 * num_blocks, block_size, rank + rope + 16)]
        size = np.dtype(t).itemsize
        self.buffers = [np.full(s[:2] + (s[2] * size,), 0xFF, np.uint8).view(t) for s in shapes]

    def rows(self, buffers):
        """The combined view [num_blocks, block_size, width] of `buffers` (not for "parts")."""
        return buffers[0] if self.layout == "combined" else buffers[0][::2, :, 8:8 + self.width]

    def parts(self, buffers=None):
        """(c, k_pe): views of the two parts of `buffers` (self.buffers or copies of them)."""
        buffers = self.buffers if buffers is None else buffers
        if self.layout == "parts":
            return buffers[0], buffers[1]
        rows = self.rows(buffers)
        return rows[..., :self.rank], rows[..., self.rank:]

    def kv_cache(self):
        """The cache as the calls take it, marked for its dtype."""
        if self.layout == "parts":
            return tuple(arg(b, self.dtype) for b in self.buffers)
        return arg(self.rows(self.buffers), self.dtype)

    def copies(self):
        return [b.copy() for b in self.buffers]

    def same_bytes(self, want_buffers):
        for got, want in zip(self.buffers, want_buffers):
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def cached(raw, src, dst, kv_scale=1.0):
    """What the cache stores for the source elements `raw` (of dtype src): the value through
    float32, rounded to dst, or for fp8 the code of value / kv_scale."""
    x = load(raw, src).astype(np.float32)
    if dst in FP8_DTYPES:
        return quantize_scaled(x, dst, np.float32(kv_scale))
    return store(x, dst)


def scale_for(dtype):
    """A kv_scale for the cache dtype: a non-power-of-two one for fp8, 1 otherwise."""
    return 0.3 if dtype in FP8_DTYPES else 1.0


# ----------------------------------------------------------------------------------------------
# write_mla_cache


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dst", CACHE_DTYPES)
@pytest.mark.parametrize("src", DTYPES)
def test_write_converts_and_places(src, dst, layout):
    rng = seeded("place", src, dst, layout)
    pool = Pool(6, 8, 64, 16, dst, layout)
    want = pool.copies()
    magnitudes = np.array([1e-3, 0.1, 1, 10, 100, 300, 1, 2], np.float32)[:, None]
    kv_c = store(rng.standard_normal((8, 64), dtype=np.float32) * magnitudes, src)
    k_pe = store(rng.standard_normal((8, 16), dtype=np.float32) * magnitudes, src)
    # Negative slots of every kind are skipped; the others are scattered over the pool.
    slots = np.array([3, -1, 8 * 5 + 7, 17, -2, 0, 40, -(2**31)], np.int32)
    pagedattn.write_mla_cache(arg(kv_c, src), arg(k_pe, src), slots, pool.kv_cache(),
                              kv_scale=scale_for(dst))
    want_c, want_pe = pool.parts(want)
    for i, s in enumerate(slots):
        if s >= 0:
            want_c[s // 8, s % 8] = cached(kv_c[i], src, dst, scale_for(dst))
            want_pe[s // 8, s % 8] = cached(k_pe[i], src, dst, scale_for(dst))
    pool.same_bytes(want)  # padding and every unwritten row included


def test_sources_may_be_slices_of_one_tensor():
    """kv_c and k_pe as the two column ranges of one projection output, every other row of it:
    the same cache as from two dense arrays."""
    rng = seeded("slices")
    x = rng.standard_normal((10, 64 + 16 + 5), dtype=np.float32)
    views = x[::2, :64], x[::2, 64:80]
    slots = np.array([9, 2, 30, 31, 4], np.int32)
    strided, dense = Pool(4, 8, 64, 16, "bf16", "combined"), Pool(4, 8, 64, 16, "bf16", "combined")
    pagedattn.write_mla_cache(*views, slots, strided.kv_cache())
    pagedattn.write_mla_cache(*(np.ascontiguousarray(v) for v in views), slots, dense.kv_cache())
    strided.same_bytes(dense.buffers)
    assert not np.isnan(load(strided.buffers[0][1, 1], "bf16")).any()  # slot 9 written


@pytest.mark.parametrize("fmt", FP8_DTYPES)
@pytest.mark.parametrize("kv_scale", [0.5, 0.3])
def test_fp8_rounds_to_nearest_even_and_saturates(fmt, kv_scale):
    """Every finite code, the midpoints between neighbouring codes and the floats either side,
    values past the largest code, tiny values, Inf and NaN, times kv_scale: each stored code is
    the NumPy quantizer's of value / kv_scale (in float32), bit for bit. At the power-of-two
    scale the midpoints stay exact ties, so ties to even are tested; 3e38 / 0.5 overflows
    float32 and saturates like any finite value."""
    values = special_values(fmt)
    with np.errstate(over="ignore"):
        x = (values * np.float32(kv_scale)).astype(np.float32)
    width, rope = 64, 16
    n = -(-len(x) // (width + rope))
    rows = np.zeros(n * (width + rope), np.float32)
    rows[:len(x)] = x
    rows = rows.reshape(n, width + rope)
    bs = 8
    num_blocks = -(-n // bs) + 2
    slots = seeded("fp8", fmt).permutation(num_blocks * bs)[:n].astype(np.int32)
    pool = Pool(num_blocks, bs, width, rope, fmt, "combined")
    pagedattn.write_mla_cache(rows[:, :width], rows[:, width:], slots, pool.kv_cache(),
                              kv_scale=kv_scale)
    stored = pool.buffers[0][slots // bs, slots % bs]  # [n, width + rope]
    same_codes(stored, quantize_scaled(rows, fmt, np.float32(kv_scale)), fmt)
    # The data reached every case: saturation of both signs, NaN, and Inf in e5m2.
    top = FP8_MAX_CODE[fmt]
    assert np.isin(top, stored) and np.isin(0x80 | top, stored)
    assert np.isnan(fp8_values(fmt)[stored]).any()
    if fmt == "fp8_e5m2":
        assert np.isin(0x7C, stored) and np.isin(0xFC, stored)
    if kv_scale == 0.5:  # a midpoint between codes 2 and 3 goes to 2, between 3 and 4 to 4
        table = fp8_values(fmt)
        mids = np.array([(table[2] + table[3]) / 2, (table[3] + table[4]) / 2]) * kv_scale
        tie = Pool(1, 1, 16, 0, fmt, "combined")
        source = np.zeros((1, 16), np.float32)
        source[0, :2] = mids
        pagedattn.write_mla_cache(source, np.zeros((1, 0), np.float32), np.array([0], np.int32),
                                  tie.kv_cache(), kv_scale=kv_scale)
        assert tie.buffers[0][0, 0, :2].tolist() == [2, 4]


def test_negative_slots_and_no_tokens_write_nothing():
    pool = Pool(3, 4, 32, 16, "f16", "parts")
    before = pool.copies()
    rows = np.ones((4, 48), np.float32)
    slots = np.array([-1, -3, -(2**31), -100], np.int32)
    pagedattn.write_mla_cache(rows[:, :32], rows[:, 32:], slots, pool.kv_cache())
    pagedattn.write_mla_cache(rows[:0, :32], rows[:0, 32:], slots[:0], pool.kv_cache())
    pool.same_bytes(before)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", CACHE_DTYPES)
def test_round_trip_decode(dtype, layout):
    """Sequences written token by token through their block tables, then decoded: the output
    matches the float64 reference over the values as written (before rounding to the cache),
    within f32 arithmetic's bound plus twice the cache dtype's unit roundoff. The output is a
    weighted mean of latent rows each rounded by at most that much relative to itself, and
    the scores' rounding moves the weights by about as much again."""
    rng = seeded("round trip", dtype, layout)
    lens, bs, heads, rank, rope = [1, 5, 40, 300], 16, 16, 128, 32
    used = [math.ceil(n / bs) for n in lens]
    num_blocks = sum(used) + 3
    perm = rng.permutation(num_blocks).astype(np.int32)
    table = np.full((len(lens), max(used) + 1), -1, np.int32)
    for b, n in enumerate(lens):
        table[b, :used[b]] = perm[sum(used[:b]):sum(used[:b + 1])]
    pool = Pool(num_blocks, bs, rank, rope, dtype, layout)
    kv_scale = 1 / 64 if dtype in FP8_DTYPES else 1.0  # N(0, 1) values / 64 well inside e4m3
    written = np.zeros((num_blocks, bs, rank + rope))
    for b, n in enumerate(lens):
        t = np.arange(n)
        slots = (table[b, t // bs] * bs + t % bs).astype(np.int32)
        rows = rng.standard_normal((n, rank + rope), dtype=np.float32)
        pagedattn.write_mla_cache(rows[:, :rank], rows[:, rank:], slots, pool.kv_cache(),
                                  kv_scale=kv_scale)
        written[slots // bs, slots % bs] = rows
    q_nope = rng.standard_normal((len(lens), heads, rank), dtype=np.float32)
    q_pe = rng.standard_normal((len(lens), heads, rope), dtype=np.float32)
    lens = np.array(lens, np.int32)
    out, lse = pagedattn.mla_decode(q_nope, q_pe, pool.kv_cache(), table, lens,
                                    kv_scale=kv_scale, return_lse=True)
    want_out, _ = mla_reference(q_nope.astype(np.float64), q_pe.astype(np.float64),
                                written[..., :rank], written[..., rank:], table, lens)
    check_out(out, "f32", want_out, tol=OUT_TOL["f32"] + 2 * UNIT_ROUNDOFF[dtype])
    # Against the values as stored, the usual f32 bound.
    c_part, pe_part = pool.parts()
    scale = float(np.float32(kv_scale))
    stored_out, stored_lse = mla_reference(q_nope, q_pe, load(c_part, dtype) * scale,
                                           load(pe_part, dtype) * scale, table, lens)
    check_out(out, "f32", stored_out)
    check_lse(lse, stored_lse)


# ----------------------------------------------------------------------------------------------
# copy_mla_blocks


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3", "f32"])
def test_copy_moves_whole_blocks_of_both_parts(dtype, layout):
    rng = seeded("copy", dtype, layout)
    pool = Pool(6, 4, 32, 16, dtype, layout)
    for b in pool.buffers:
        b.view(np.uint8)[...] = rng.integers(0, 256, b.view(np.uint8).shape, dtype=np.uint8)
    want = pool.copies()
    want_c, want_pe = pool.parts(want)
    for src, dst in [(0, 3), (1, 5)]:
        want_c[dst], want_pe[dst] = want_c[src], want_pe[src]
    pagedattn.copy_mla_blocks(pool.kv_cache(), [(0, 3), (1, 5)])
    pool.same_bytes(want)  # the padded layout's padding stays as it was
    for src, dst in [(2, 4)]:
        want_c[dst], want_pe[dst] = want_c[src], want_pe[src]
    pagedattn.copy_mla_blocks(pool.kv_cache(), np.array([[2, 4]], np.int64))
    pagedattn.copy_mla_blocks(pool.kv_cache(), [])  # nothing to do
    pool.same_bytes(want)


def test_serving_loop_with_forks():
    """Prompts, forks with copy-on-write, decode steps, through BlockManager, write_mla_cache and
    copy_mla_blocks: every step against the float64 reference over each sequence's latent rows,
    kept aside in token order."""
    rng = seeded("serving")
    heads, rank, rope, bs, pool_blocks, dtype = 4, 64, 16, 4, 48, "bf16"
    bm = pagedattn.BlockManager(pool_blocks, bs)
    pool = Pool(pool_blocks, bs, rank, rope, dtype, "combined")
    history = {}  # seq -> stored rows [n, rank + rope] as float64

    def write(seq_slots):
        rows = rng.standard_normal((len(seq_slots), rank + rope), dtype=np.float32)
        slots = np.array([s for _, s in seq_slots], np.int32)
        pagedattn.write_mla_cache(rows[:, :rank], rows[:, rank:], slots, pool.kv_cache())
        for i, (seq, _) in enumerate(seq_slots):
            history[seq] = np.concatenate([history[seq], load(store(rows[i:i + 1], dtype), dtype)])

    def copy_blocks(copies):
        pagedattn.copy_mla_blocks(pool.kv_cache(), copies)

    steps = serve_steps(bm, history, np.zeros((0, rank + rope)), write, copy_blocks)
    for step, seqs, table, lens, copies in steps:
        assert step > 0 or copies  # the fork's shared partial block is copied on its first token
        q = store(rng.standard_normal((len(seqs), heads, rank + rope), dtype=np.float32), dtype)
        out = pagedattn.mla_decode(pagedattn.bf16(q[..., :rank]), pagedattn.bf16(q[..., rank:]),
                                   pool.kv_cache(), table, lens)
        for b, seq in enumerate(seqs):
            rows = history[seq]
            assert len(rows) == lens[b]
            # The sequence's own rows as a cache of one row per block, in token order.
            qb = load(q[b:b + 1], dtype)
            want, _ = mla_reference(qb[..., :rank], qb[..., rank:], rows[:, None, :rank],
                                    rows[:, None, rank:], np.arange(len(rows))[None], [len(rows)])
            check_out(out[b:b + 1], dtype, want)
    bm.check_invariants()


# ----------------------------------------------------------------------------------------------
# mla_workspace_size


def test_workspace_size_is_zero_on_the_cpu_and_checks_its_arguments():
    q_nope, q_pe = np.zeros((2, 16, 512), np.float32), np.zeros((2, 16, 64), np.float32)
    kv = np.zeros((4, 64, 576), np.uint8)
    table = np.zeros((2, 4), np.int32)
    assert pagedattn.mla_workspace_size(q_nope, q_pe, pagedattn.fp8_e4m3(kv), table) == 0
    parts = (pagedattn.fp8_e4m3(kv[..., :512]), pagedattn.fp8_e4m3(kv[..., 512:]))
    assert pagedattn.mla_workspace_size(q_nope, q_pe, parts, table, max_q_len=3,
                                        batch_invariant=True) == 0
    cases = [
        ((q_nope, q_pe, pagedattn.fp8_e4m3(kv[..., :500]), table), {}, "kv_cache",
         "kv_lora_rank + rope_dim"),
        ((q_nope, q_pe, pagedattn.fp8_e4m3(kv), table[:1]), {}, "block_table",
         "q_nope.shape[0]"),
        ((q_nope, q_pe, pagedattn.fp8_e4m3(kv), table.astype(np.int64)), {}, "block_table",
         "int32"),
        ((q_nope, q_pe[:, :8], pagedattn.fp8_e4m3(kv), table), {}, "q_pe", "num_heads"),
        ((q_nope, q_pe, "cache", table), {}, "kv_cache", "expected a tensor"),
        ((q_nope, q_pe, pagedattn.fp8_e4m3(kv), table), dict(backend="tpu"), "backend", "tpu"),
        ((q_nope, q_pe, pagedattn.fp8_e4m3(kv), table), dict(max_q_len="2"), "max_q_len",
         "expected an int"),
    ]
    for args, kwargs, argument, text in cases:
        with pytest.raises(pagedattn.Error) as info:
            pagedattn.mla_workspace_size(*args, **kwargs)
        assert info.value.argument == argument and text in str(info.value), str(info.value)
    if not pagedattn.built_with_cuda:
        with pytest.raises(pagedattn.Error) as info:
            pagedattn.mla_workspace_size(q_nope, q_pe, pagedattn.fp8_e4m3(kv), table,
                                         backend="cuda")
        assert info.value.argument == "backend"


# ----------------------------------------------------------------------------------------------
# Errors


def refused_write(kv_c, k_pe, slots, pool, **kwargs) -> pagedattn.Error:
    """The pagedattn.Error of a bad write, with the cache unchanged."""
    before = pool.copies()
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.write_mla_cache(kv_c, k_pe, slots, kwargs.pop("kv_cache", pool.kv_cache()),
                                  **kwargs)
    pool.same_bytes(before)
    return info.value


def test_write_errors_name_the_argument_and_write_nothing():
    pool = Pool(4, 8, 32, 16, "bf16", "combined")
    fp8 = Pool(4, 8, 32, 16, "fp8_e4m3", "parts")
    c, p = np.ones((3, 32), np.float32), np.ones((3, 16), np.float32)
    slots = np.array([0, 5, 9], np.int32)
    read_only = pool.rows(pool.buffers).copy()
    read_only.setflags(write=False)
    cases = [
        ((c[0], p, slots), {}, "kv_c", "[num_tokens, kv_lora_rank]"),
        ((c, p[:2], slots), {}, "k_pe", "num_tokens"),
        ((c, p, slots[:2]), {}, "slot_mapping", "num_tokens"),
        ((c, p, slots.astype(np.int64)), {}, "slot_mapping", "int32"),
        ((c, p.astype(np.float16), slots), {}, "k_pe", "dtype"),
        ((c[:, :16], p, slots), {}, "kv_cache", "kv_lora_rank + rope_dim, kv_c.shape[1]"),
        ((c, p, np.array([0, 5, 32], np.int32)), {}, "slot_mapping[2]", "32"),
        ((c, p, np.array([0, 5, 0], np.int32)), {}, "slot_mapping[2]", "distinct"),
        ((c, p, slots), dict(kv_scale=2.0), "kv_scale", "unquantized"),
        ((c, p, slots), dict(kv_scale="1"), "kv_scale", "expected a number"),
        ((c, p, slots), dict(kv_cache=pagedattn.bf16(read_only)), "kv_cache", "writable"),
        ((c, p, slots), dict(kv_cache="cache"), "kv_cache", "expected a tensor"),
        ((c, p, slots), dict(kv_cache=(pool.kv_cache(),)), "kv_cache", "pair"),
        ((c, p, slots), dict(kv_cache=np.zeros((4, 8, 48), np.int8)), "kv_dtype", "int8"),
        ((c, p, slots), dict(backend="tpu"), "backend", "tpu"),
        ((np.broadcast_to(c[:1], (3, 32)), p, slots), {}, "kv_c", "overlap"),
        ((np.ones((3, 64), np.float32)[:, ::2], p, slots), {}, "kv_c", "contiguous"),
        ((pagedattn.fp8_e4m3(np.ones((3, 32), np.uint8)), pagedattn.fp8_e4m3(p.astype(np.uint8)),
          slots), {}, "src_dtype", "fp8"),
        ((np.ones((3, 24), np.float32), np.ones((3, 24), np.float32), slots), {}, "kv_lora_rank",
         "multiple of 16"),
    ]
    for args, kwargs, argument, text in cases:
        e = refused_write(*args, pool, **kwargs)
        assert e.argument == argument and text in str(e), (argument, str(e))
    # The pair: widths against each part, and an fp8 cache's scale.
    pair = fp8.kv_cache()
    e = refused_write(np.ones((3, 48), np.float32), p, slots, fp8, kv_cache=pair)
    assert e.argument == "c_cache" and "kv_lora_rank, kv_c.shape[1]" in str(e)
    e = refused_write(c, p, slots, fp8, kv_cache=pair, kv_scale=0.0)
    assert e.argument == "kv_scale"
    e = refused_write(c, p, slots, fp8, kv_cache=(pair[0], np.zeros((4, 8, 16), np.uint8)))
    assert e.argument == "kpe_cache" and "dtype" in str(e)


def test_copy_errors_name_the_argument_and_copy_nothing():
    pool = Pool(4, 8, 32, 16, "f32", "parts")
    before = pool.copies()
    cases = [
        ([(0, 1), (2, 1)], "pairs[1].dst", "two pairs"),
        ([(0, 9)], "pairs[0].dst", "out of range"),
        ([(1, 2), (2, 3)], "pairs[0].dst", "src"),
        ("01", "pairs", "expected a sequence"),
        ([(0, "1")], "pairs", "pair of int32"),
        (np.zeros((2, 3), np.int32), "pairs", "[n, 2]"),
    ]
    for pairs, argument, text in cases:
        with pytest.raises(pagedattn.Error) as info:
            pagedattn.copy_mla_blocks(pool.kv_cache(), pairs)
        assert info.value.argument.startswith(argument) and text in str(info.value), (
            argument, str(info.value))
    pool.same_bytes(before)
    for kv_cache, argument in [(np.zeros((4, 8, 20), np.float32), "kv_cache"),
                               ((np.zeros((4, 8, 32)), np.zeros((4, 8, 16))), "c_cache"),
                               ((pool.buffers[0], pool.buffers[1][:2]), "kpe_cache")]:
        with pytest.raises(pagedattn.Error) as info:
            pagedattn.copy_mla_blocks(kv_cache, [(0, 1)])
        assert info.value.argument == argument, str(info.value)


# ----------------------------------------------------------------------------------------------
# PyTorch and CUDA


def codes_of(t):
    """A torch cache's raw bytes as a NumPy uint8 array."""
    return t.detach().cpu().contiguous().view(torch.uint8).numpy()


def torch_write_and_copy(dtype, device):
    """A write and a copy on torch tensors: the cache's bytes, and those NumPy gives."""
    rng = seeded("torch", dtype)
    rows = rng.standard_normal((5, 80), dtype=np.float32)
    slots = np.array([3, -1, 20, 9, 30], np.int32)
    pool = Pool(4, 8, 64, 16, dtype, "combined")
    kv = torch_of(pool.buffers[0], dtype, device)
    x = torch_of(store(rows, "bf16"), "bf16", device)
    kw = dict(kv_scale=scale_for(dtype))
    pagedattn.write_mla_cache(x[:, :64], x[:, 64:], torch.from_numpy(slots).to(device), kv,
                              checked=device != "cpu", **kw)
    pagedattn.copy_mla_blocks(kv, [(1, 3)])
    raw = store(rows, "bf16")
    pagedattn.write_mla_cache(arg(raw[:, :64], "bf16"), arg(raw[:, 64:], "bf16"), slots,
                              pool.kv_cache(), **kw)
    pagedattn.copy_mla_blocks(pool.kv_cache(), [(1, 3)])
    return codes_of(kv), pool.buffers[0].view(np.uint8)


@needs_torch
@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_torch_cpu_tensors(dtype):
    got, want = torch_write_and_copy(dtype, "cpu")
    assert np.array_equal(got, want)


@needs_cuda
@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3", "fp8_e5m2"])
def test_cuda_writes_and_copies_as_the_cpu_does(dtype):
    got, want = torch_write_and_copy(dtype, "cuda")
    assert np.array_equal(got, want)


@needs_cuda
def test_cuda_workspace_size_serves_mla_decode():
    rng = seeded("cuda workspace")
    kv = torch.from_numpy(rng.standard_normal((8, 64, 576), dtype=np.float32)).to(
        "cuda", torch.bfloat16)
    q = torch.randn(2, 16, 576, device="cuda", dtype=torch.bfloat16)
    table = torch.arange(8, dtype=torch.int32, device="cuda").reshape(2, 4)
    lens = torch.tensor([200, 256], dtype=torch.int32, device="cuda")
    size = pagedattn.mla_workspace_size(q[..., :512], q[..., 512:], kv, table)
    assert size > 0
    workspace = torch.empty(size, dtype=torch.uint8, device="cuda")
    out = pagedattn.mla_decode(q[..., :512], q[..., 512:], kv, table, lens, workspace=workspace)
    plain = pagedattn.mla_decode(q[..., :512], q[..., 512:], kv, table, lens)
    assert torch.equal(out, plain)
