"""mla_decode() against a NumPy float64 reference of MLA decode: the CPU backend with NumPy, PyTorch
tensors on the CPU, and CUDA where a GPU is present (skipped while the CUDA backend refuses MLA)."""

import math
import zlib
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pytest

import pagedattn
from _cases import (FP8_DTYPES, OUT_TOL, arg, check_lse, check_out, empty, indptr, load,
                    mla_reference, needs_cuda, needs_torch, store, torch_of)

try:
    import torch
except ImportError:
    torch = None


@dataclass
class MlaCase:
    q_nope: np.ndarray  # stored (raw) arrays of q_dtype
    q_pe: np.ndarray
    kv: np.ndarray  # the combined cache [num_blocks, block_size, rank + rope], raw of kv_dtype
    block_table: np.ndarray
    context_lens: np.ndarray
    q_dtype: str
    kv_dtype: str
    kv_scale: float = 1.0
    q_indptr: Optional[np.ndarray] = None

    @property
    def rank(self) -> int:
        return self.q_nope.shape[2]

    def parts(self):
        """The cache as two dense tensors (c_cache, kpe_cache), marked for its dtype."""
        return (arg(np.ascontiguousarray(self.kv[..., :self.rank]), self.kv_dtype),
                arg(np.ascontiguousarray(self.kv[..., self.rank:]), self.kv_dtype))

    def args(self, kv_cache=None):
        cache = arg(self.kv, self.kv_dtype) if kv_cache is None else kv_cache
        return (arg(self.q_nope, self.q_dtype), arg(self.q_pe, self.q_dtype), cache,
                self.block_table, self.context_lens)

    def kwargs(self):
        kw = {}
        if self.kv_scale != 1.0:
            kw["kv_scale"] = self.kv_scale
        if self.q_indptr is not None:
            kw["q_indptr"] = self.q_indptr
        return kw

    def reference(self, scale=None):
        kv = load(self.kv, self.kv_dtype) * float(np.float32(self.kv_scale))
        return mla_reference(load(self.q_nope, self.q_dtype), load(self.q_pe, self.q_dtype),
                             kv[..., :self.rank], kv[..., self.rank:], self.block_table,
                             self.context_lens, scale, self.q_indptr)


def make_mla_case(rng, *, context_lens: Sequence[int], num_heads=16, rank=512, rope=64,
                  block_size=16, q_dtype="f32", kv_dtype="f32", q_counts=None,
                  kv_scale=1.0) -> MlaCase:
    """A fragmented MLA case: each sequence's blocks scattered over an oversized pool, table
    entries past each context -1 or garbage, and NaN in every cache slot nobody reads."""
    lens = np.asarray(context_lens, dtype=np.int32)
    used = [math.ceil(int(n) / block_size) for n in lens]
    width = max(used + [1]) + 2
    num_blocks = sum(used) + 3
    perm = rng.permutation(num_blocks).astype(np.int32)
    table = np.full((len(lens), width), -1, dtype=np.int32)
    readable = np.zeros((num_blocks, block_size), dtype=bool)
    pos = 0
    for b, n in enumerate(lens):
        table[b, :used[b]] = perm[pos:pos + used[b]]
        pos += used[b]
        table[b, used[b]:] = rng.choice([-1, 10**6, num_blocks], size=width - used[b])
        t = np.arange(int(n))
        readable[table[b, t // block_size], t % block_size] = True
    kv = rng.standard_normal((num_blocks, block_size, rank + rope), dtype=np.float32)
    kv[~readable] = np.nan
    if kv_dtype in FP8_DTYPES:
        kv = kv / np.float32(kv_scale)
    rows = len(lens) if q_counts is None else int(sum(q_counts))
    q_nope = rng.standard_normal((rows, num_heads, rank), dtype=np.float32)
    q_pe = rng.standard_normal((rows, num_heads, rope), dtype=np.float32)
    return MlaCase(store(q_nope, q_dtype), store(q_pe, q_dtype), store(kv, kv_dtype), table, lens,
                   q_dtype, kv_dtype, kv_scale, None if q_counts is None else indptr(q_counts))


def seeded(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


LENS = [0, 1, 15, 16, 17, 300]

# (num_heads, kv_lora_rank, rope_dim, block_size): DeepSeek's 512/64 at 16 and 128 heads, other
# widths (rope 0 included), page sizes 1 to 64.
SHAPES = [
    (16, 512, 64, 16),
    (128, 512, 64, 64),
    (1, 512, 64, 1),
    (8, 256, 32, 7),
    (4, 128, 0, 16),
    (3, 16, 16, 5),
]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "H%d-R%d-P%d-BS%d" % s)
def test_matches_reference(dtype, shape):
    heads, rank, rope, block_size = shape
    c = make_mla_case(seeded(dtype, shape), context_lens=LENS, num_heads=heads, rank=rank,
                      rope=rope, block_size=block_size, q_dtype=dtype, kv_dtype=dtype)
    out, lse = pagedattn.mla_decode(*c.args(), return_lse=True)
    assert out.shape == c.q_nope.shape and out.dtype == c.q_nope.dtype  # allocated like q_nope
    assert lse.shape == c.q_nope.shape[:2] and lse.dtype == np.float32
    want_out, want_lse = c.reference()
    check_out(out, dtype, want_out)
    check_lse(lse, want_lse)


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
@pytest.mark.parametrize("q_dtype", ["f32", "bf16"])
def test_fp8_cache_with_kv_scale(kv_dtype, q_dtype):
    c = make_mla_case(seeded(kv_dtype, q_dtype), context_lens=LENS, q_dtype=q_dtype,
                      kv_dtype=kv_dtype, kv_scale=0.0625)
    out, lse = pagedattn.mla_decode(*c.args(), return_lse=True, **c.kwargs())
    want_out, want_lse = c.reference()
    check_out(out, q_dtype, want_out)
    check_lse(lse, want_lse)
    # The same codes as two parts, and through ml_dtypes' fp8 arrays where installed.
    assert np.array_equal(pagedattn.mla_decode(*c.args(c.parts()), **c.kwargs()), out)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    typed = c.kv.view({"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}[
        kv_dtype])
    assert np.array_equal(pagedattn.mla_decode(*c.args(typed), **c.kwargs()), out)


def test_the_two_layouts_give_the_same_bits():
    c = make_mla_case(seeded("layouts"), context_lens=LENS, q_dtype="bf16", kv_dtype="bf16")
    combined, combined_lse = pagedattn.mla_decode(*c.args(), return_lse=True)
    parts, parts_lse = pagedattn.mla_decode(*c.args(c.parts()), return_lse=True)
    assert np.array_equal(combined, parts) and np.array_equal(combined_lse, parts_lse)
    # FlashMLA's [num_blocks, block_size, 1, width], and the pair as a list.
    flash = pagedattn.mla_decode(*c.args(pagedattn.bf16(c.kv[:, :, None, :])))
    assert np.array_equal(flash, combined)
    assert np.array_equal(pagedattn.mla_decode(*c.args(list(c.parts()))), combined)


def test_views_are_read_and_written_in_place():
    """FlashMLA's one q split into two slices, a padded pool, out a slice of a wider buffer: the
    same bits as the dense call, and out's padding untouched."""
    c = make_mla_case(seeded("views"), context_lens=[3, 40, 17], num_heads=8, rank=128, rope=32)
    dense_out, dense_lse = pagedattn.mla_decode(*c.args(), return_lse=True)
    q = np.concatenate([c.q_nope, c.q_pe], axis=2)  # [rows, heads, rank + rope]
    pool = np.full((c.kv.shape[0] * 2, c.kv.shape[1], 200), np.nan, dtype=np.float32)
    kv = pool[::2, :, 8:8 + c.kv.shape[2]]  # every other block, each row 8 elements in
    kv[...] = c.kv
    wide = np.full((3, 8 * 128 + 10), 7.0, dtype=np.float32)
    out = wide[:, 3:3 + 8 * 128].reshape(3, 8, 128)
    assert out.base is not None and np.shares_memory(out, wide)
    lse = np.full((3, 8), np.nan, dtype=np.float32)
    got = pagedattn.mla_decode(q[..., :128], q[..., 128:], kv, c.block_table, c.context_lens,
                               out=out, lse=lse)
    assert got is out
    assert np.array_equal(out, dense_out) and np.array_equal(lse, dense_lse)
    untouched = np.full(wide.shape, True)
    untouched[:, 3:3 + 8 * 128] = False
    assert np.all(wide[untouched] == 7.0)
    # The two parts as views into the pool too.
    parts = (pool[::2, :, 8:136], pool[::2, :, 136:168])
    assert np.array_equal(pagedattn.mla_decode(*c.args(parts)), dense_out)


@pytest.mark.parametrize("block_size", [1, 16])
def test_query_tokens(block_size):
    counts = [3, 1, 0, 4, 2]
    c = make_mla_case(seeded("tokens", block_size), context_lens=[5, 1, 9, 2, 40],
                      block_size=block_size, q_counts=counts, num_heads=4, rank=64, rope=16)
    out, lse = pagedattn.mla_decode(*c.args(), return_lse=True, **c.kwargs())
    assert out.shape == (sum(counts), 4, 64)
    want_out, want_lse = c.reference()
    check_out(out, "f32", want_out)
    check_lse(lse, want_lse)
    given = pagedattn.mla_decode(*c.args(), max_q_len=4, **c.kwargs())
    assert np.array_equal(given, out)


def test_scale_empty_contexts_and_empty_batch():
    c = make_mla_case(seeded("scale"), context_lens=[0, 9, 0], num_heads=2, rank=32, rope=16)
    out, lse = pagedattn.mla_decode(*c.args(), scale=0.3, return_lse=True)
    want_out, want_lse = c.reference(scale=0.3)
    check_out(out, "f32", want_out)
    check_lse(lse, want_lse)
    assert np.all(out[[0, 2]] == 0) and np.all(lse[[0, 2]] == -np.inf)
    e = make_mla_case(seeded("empty"), context_lens=[], num_heads=2, rank=32, rope=16)
    assert pagedattn.mla_decode(*e.args()).shape == (0, 2, 32)


def test_batch_invariant():
    c = make_mla_case(seeded("invariant"), context_lens=[2000, 5, 700], num_heads=4, rank=64,
                      rope=16, block_size=8)
    whole = pagedattn.mla_decode(*c.args(), batch_invariant=True)
    for b in range(3):
        alone = pagedattn.mla_decode(c.q_nope[b:b + 1], c.q_pe[b:b + 1], c.kv,
                                     c.block_table[b:b + 1], c.context_lens[b:b + 1],
                                     batch_invariant=True)
        assert np.array_equal(alone[0], whole[b])


def refused(c: MlaCase, args=None, out=None, **kwargs) -> pagedattn.Error:
    """The pagedattn.Error of a bad call, with out and lse (NaN) untouched."""
    q_nope = (c.args() if args is None else args)[0]
    shape = getattr(q_nope, "tensor", q_nope).shape
    out = empty(shape, "f32") if out is None else out
    lse = np.full(shape[:2], np.nan, np.float32)
    before = out.tobytes(), lse.tobytes()
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.mla_decode(*(c.args() if args is None else args), out=out, lse=lse, **kwargs)
    assert (out.tobytes(), lse.tobytes()) == before  # nothing written
    return info.value


def test_errors_name_the_argument_and_write_nothing():
    c = make_mla_case(seeded("errors"), context_lens=[5, 20], num_heads=4, rank=32, rope=16,
                      block_size=4)
    qn, qp, kv, table, lens = c.args()
    c_part, kpe_part = c.parts()
    bad_table = table.copy()
    bad_table[1, 2] = kv.shape[0]
    e8 = pagedattn.fp8_e4m3(np.zeros(c.kv.shape, np.uint8))
    cases = [
        ((qn, qp, kv[..., :40], table, lens), {}, "kv_cache", "kv_lora_rank + rope_dim"),
        ((qn, qp, (c_part, kpe_part.astype(np.float16)), table, lens), {}, "kpe_cache", "dtype"),
        ((qn, qp, (c_part, kpe_part[:, :2]), table, lens), {}, "kpe_cache", "block_size"),
        ((qn, qp, (c_part,), table, lens), {}, "kv_cache", "pair"),
        ((qn, qp, "cache", table, lens), {}, "kv_cache", "expected a tensor"),
        ((qn, qp[:, :3], kv, table, lens), {}, "q_pe", "num_heads"),
        ((qn, qp.astype(np.float16), kv, table, lens), {}, "q_pe", "dtype"),
        ((qn, qp, kv.astype(np.float64), table, lens), {}, "kv_cache", "float64"),
        ((qn, qp, np.zeros(c.kv.shape, np.int8), table, lens), {}, "kv_dtype", "int8"),
        ((qn, qp, kv, bad_table, lens), {}, "block_table[1][2]", "out of range"),
        ((qn, qp, kv, table, np.array([5, 99], np.int32)), {}, "context_lens[1]", "99"),
        ((qn, qp, kv, table, lens[:1]), {}, "context_lens", "q_nope.shape[0]"),
        ((qn, qp, kv, table.astype(np.int64), lens), {}, "block_table", "int32"),
        ((qn, qp, kv, table, lens), dict(kv_scale=2.0), "kv_scale", "unquantized"),
        ((qn, qp, e8, table, lens), dict(kv_scale=0.0), "kv_scale", "0"),
        ((qn, qp, e8, table, lens), dict(kv_scale="1"), "kv_scale", "expected a number"),
        ((qn, qp, kv, table, lens), dict(max_q_len=2), "max_q_len", "without q_indptr"),
        ((qn, qp, kv, table, lens), dict(q_indptr=np.array([0, 1, 1], np.int32)), "q_indptr[2]",
         ""),
        ((qn, qp, kv, table, lens), dict(backend="tpu"), "backend", "tpu"),
        ((qn[..., :24], qp, kv[..., 8:], table, lens), {}, "kv_lora_rank", "multiple of 16"),
        ((qn, qp, kv, table, lens), dict(scale=float("nan")), "scale", "finite"),
    ]
    for args, kwargs, argument, text in cases:
        e = refused(c, args, **kwargs)
        assert e.argument == argument and text in str(e), (argument, str(e))
    # A cache whose rows overlap, and an out of another shape or with strided heads.
    overlapping = np.lib.stride_tricks.as_strided(c.kv, strides=(c.kv.strides[0], 64, 4))
    assert refused(c, (qn, qp, overlapping, table, lens)).argument == "c_strides.token"
    assert refused(c, out=empty((2, 4, 16), "f32")).argument == "out"
    assert refused(c, out=empty((2, 8, 32), "f32")[:, ::2]).argument == "out"
    heads = c.q_nope.shape[1]
    many = np.zeros((2, 257, 32), np.float32)
    assert refused(c, (many, np.zeros((2, 257, 16), np.float32), kv, table, lens),
                   out=empty(many.shape, "f32")).argument == "num_heads"
    assert heads == 4 and pagedattn.MAX_MLA_HEADS == 256


def test_fp8_q_and_out_are_unsupported():
    c = make_mla_case(seeded("fp8 q"), context_lens=[5], num_heads=2, rank=32, rope=16)
    codes = pagedattn.fp8_e4m3(np.zeros(c.q_nope.shape, np.uint8))
    e = refused(c, (codes, pagedattn.fp8_e4m3(np.zeros(c.q_pe.shape, np.uint8)), *c.args()[2:]))
    assert e.argument == "q_dtype" and e.code == "unsupported"
    out = pagedattn.fp8_e4m3(np.zeros(c.q_nope.shape, np.uint8))
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.mla_decode(*c.args(), out=out)
    assert info.value.argument == "out_dtype"


# ----------------------------------------------------------------------------------------------
# PyTorch


TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def numpy_of(t, dtype: str) -> np.ndarray:
    t = t.detach().cpu()
    return t.view(torch.int16).numpy().view(np.uint16) if dtype == "bf16" else t.numpy()


def torch_args(c: MlaCase, device="cpu"):
    return (torch_of(c.q_nope, c.q_dtype, device), torch_of(c.q_pe, c.q_dtype, device),
            torch_of(c.kv, c.kv_dtype, device), torch.from_numpy(c.block_table).to(device),
            torch.from_numpy(c.context_lens).to(device))


@needs_torch
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_torch_cpu(kv_dtype):
    c = make_mla_case(seeded("torch", kv_dtype), context_lens=LENS, q_dtype="bf16",
                      kv_dtype=kv_dtype, kv_scale=0.5 if kv_dtype != "bf16" else 1.0)
    qn, qp, kv, table, lens = torch_args(c)
    out, lse = pagedattn.mla_decode(qn, qp, kv, table, lens, return_lse=True, **c.kwargs())
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    want_out, want_lse = c.reference()
    check_out(numpy_of(out, "bf16"), "bf16", want_out)
    check_lse(lse.numpy(), want_lse)
    rank = c.rank
    parts = pagedattn.mla_decode(qn, qp, (kv[..., :rank], kv[..., rank:]), table, lens,
                                 **c.kwargs())
    assert torch.equal(parts, out)


@needs_cuda
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_cuda_matches_reference(kv_dtype):
    c = make_mla_case(seeded("cuda", kv_dtype), context_lens=LENS, q_dtype="bf16",
                      kv_dtype=kv_dtype, kv_scale=0.5 if kv_dtype != "bf16" else 1.0,
                      q_counts=[1, 2, 1, 3, 1, 1])
    args = torch_args(c, "cuda")
    out, lse = pagedattn.mla_decode(*args, return_lse=True, max_q_len=3, checked=True,
                                    **c.kwargs())
    assert out.is_cuda and out.dtype == torch.bfloat16
    want_out, want_lse = c.reference()
    check_out(numpy_of(out, "bf16"), "bf16", want_out)
    check_lse(lse.cpu().numpy(), want_lse)


@needs_cuda
def test_cuda_side_stream_and_the_two_layouts():
    c = make_mla_case(seeded("cuda stream"), context_lens=LENS, q_dtype="bf16", kv_dtype="bf16")
    qn, qp, kv, table, lens = torch_args(c, "cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = pagedattn.mla_decode(qn, qp, kv, table, lens)
    stream.synchronize()
    rank = c.rank
    parts = pagedattn.mla_decode(qn, qp, (kv[..., :rank], kv[..., rank:]), table, lens)
    assert torch.equal(parts, out)
    check_out(numpy_of(out, "bf16"), "bf16", c.reference()[0])


@needs_cuda
def test_cuda_refuses_host_tensors_mixed_in():
    c = make_mla_case(seeded("cuda mixed"), context_lens=[4, 9], num_heads=2, rank=32, rope=16)
    qn, qp, kv, table, lens = torch_args(c, "cuda")
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.mla_decode(qn, qp, kv, table.cpu(), lens)
    assert info.value.argument == "block_table"
