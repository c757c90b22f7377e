"""Multi-token queries (decode's q_indptr and max_q_len) against a float64 NumPy implementation
written here from the definition: query token i of a sequence of L tokens with n query tokens
sits at position P = L - n + i and attends causally to the tokens t <= P, with the window, ALiBi
and sinks taken from P. NumPy on the CPU always, PyTorch's paths where it is installed, CUDA
where a GPU is present; and the errors for bad arguments."""

from __future__ import annotations

import math
import zlib
from typing import Optional, Sequence

import numpy as np
import pytest

import pagedattn
from pagedattn import _ext

from _cases import (alibi_slopes, arg, case_tensors, check_lse, check_out, check_rejected,
                    described, empty, from_torch, indptr, load, make_case, needs_cuda, needs_torch,
                    random_sinks, reference_decode, refused_decode, store, torch,
                    variant_kwargs)

# ----------------------------------------------------------------------------------------------
# The oracle


# The f64 oracle of multi-token decode (q_indptr): an intentional independent oracle, written
# apart from _cases.reference_decode (token by token, from the definition) so that the two
# share no mistake.
def tokens_reference(q, k, v, block_table, context_lens, q_indptr, scale: Optional[float] = None,
                     *, window_left: int = -1, logits_soft_cap: float = 0.0,
                     alibi_slopes: Optional[Sequence[float]] = None,
                     sinks: Optional[Sequence[float]] = None):
    """(out [rows, H, D], lse [rows, H]) in float64, one query token at a time: row
    q_indptr[b] + i is token i of sequence b's n query tokens, at position P = L - n + i; it
    attends to the tokens t in [first, P], first = max(P - window_left, 0) with a window (0
    without), each logit scale * q . K_t, soft-capped, plus slope_h * (t - P); a sink adds
    exp(sink_h) to the softmax's denominator. P < 0 attends to nothing: out = 0 and lse = the
    sink (-inf without one)."""
    rows, num_heads, head_dim = q.shape
    _, num_kv_heads, block_size, _ = k.shape
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = np.zeros((rows, num_heads, head_dim))
    lse = np.full((rows, num_heads), -np.inf)
    for b in range(len(context_lens)):
        start, end = int(q_indptr[b]), int(q_indptr[b + 1])
        n = end - start
        for i in range(n):
            row = start + i
            pos = int(context_lens[b]) - n + i
            for h in range(num_heads):
                sink = -math.inf if sinks is None else float(sinks[h])
                if pos < 0:
                    lse[row, h] = sink
                    continue
                first = max(pos - window_left, 0) if window_left >= 0 else 0
                logits, values = [], []
                for t in range(first, pos + 1):
                    blk = int(block_table[b][t // block_size])
                    key = k[blk, h // group, t % block_size]
                    s = scale * float(np.dot(q[row, h], key))
                    if logits_soft_cap > 0:
                        s = logits_soft_cap * math.tanh(s / logits_soft_cap)
                    if alibi_slopes is not None:
                        s += float(alibi_slopes[h]) * (t - pos)
                    logits.append(s)
                    values.append(v[blk, h // group, t % block_size])
                m = max(logits + [sink])
                weights = np.exp(np.asarray(logits) - m)
                denominator = weights.sum() + math.exp(sink - m)
                out[row, h] = (weights @ np.asarray(values)) / denominator
                lse[row, h] = m + math.log(denominator)
    return out, lse


class TokensCase:
    """A fragmented paged case (_cases.make_case: NaN in every slot past the contexts, garbage
    past each table row) with q_lens[b] query tokens for sequence b."""

    def __init__(self, rng, context_lens, q_lens, **kw):
        self.c = make_case(rng, context_lens=context_lens, **kw)
        self.q_lens = list(q_lens)
        self.q_indptr = indptr(q_lens)
        _, heads, dim = self.c.q.shape
        rows = int(self.q_indptr[-1])
        self.q = store(rng.standard_normal((rows, heads, dim), dtype=np.float32), self.c.q_dtype)

    @property
    def dtype(self) -> str:
        return self.c.q_dtype

    def args(self, q=None):
        c = self.c
        return (arg(self.q if q is None else q, c.q_dtype), arg(c.k, c.kv_dtype),
                arg(c.v, c.kv_dtype), c.block_table, c.context_lens)

    def reference(self, scale=None, **variants):
        c = self.c
        return tokens_reference(load(self.q, c.q_dtype), load(c.k, c.kv_dtype),
                                load(c.v, c.kv_dtype), c.block_table, c.context_lens,
                                self.q_indptr, scale, **variants)

    def decode(self, out_dtype=None, **kw):
        out_dtype = out_dtype or self.dtype
        return pagedattn.decode(*self.args(), q_indptr=self.q_indptr,
                                out=arg(empty(self.q.shape, out_dtype), out_dtype),
                                return_lse=True, **kw)

    def check(self, out_dtype=None, **kw):
        out_dtype = out_dtype or self.dtype
        out, lse = self.decode(out_dtype, **kw)
        variants = {n: x for n, x in kw.items() if n != "max_q_len"}
        want_out, want_lse = self.reference(**variants)
        check_out(out, out_dtype, want_out)
        check_lse(lse, want_lse)
        return out, lse


def queries_first(L: int, n: int, window_left: int) -> int:
    """The first token any of a sequence's n >= 1 query tokens attends to (its earliest, at
    L - n)."""
    return max(L - n - window_left, 0) if window_left >= 0 else 0


def slide_out(t: TokensCase, window_left: int) -> None:
    """Makes unreadable what no query token of a sequence attends to, as an engine that frees
    the blocks that slid out of the window would: the tokens before its earliest query's window
    (their keys and values NaN, the table entries of the whole blocks among them -1 or
    garbage), and all of a sequence without query tokens."""
    c = t.c
    nan_row = store(np.full(c.k.shape[-1], np.nan, np.float32), c.kv_dtype)
    for b, L in enumerate(int(x) for x in c.context_lens):
        n = t.q_lens[b]
        first = L if n == 0 else queries_first(L, n, window_left)
        for tok in range(first):
            blk = c.block_table[b, tok // c.block_size]
            if 0 <= blk < c.k.shape[0]:
                c.k[blk, :, tok % c.block_size] = nan_row
                c.v[blk, :, tok % c.block_size] = nan_row
        whole = math.ceil(L / c.block_size) if n == 0 else first // c.block_size
        for i in range(whole):
            c.block_table[b, i] = -1 if i % 2 == 0 else 10**6


# Contexts and query counts with every edge: a sequence without query tokens, an empty context
# with query tokens (every one at P < 0), a context shorter than its query count, one token per
# sequence, block boundaries and a long context.
LENS = [0, 1, 3, 16, 17, 40, 300, 5]
Q_LENS = [2, 1, 5, 1, 4, 3, 8, 0]


def test_oracle_is_a_one_token_decode_per_position():
    # The oracle against _cases' one-token reference, token by token: a query at P is a decode
    # of a context of P + 1 tokens.
    rng = np.random.default_rng(0)
    t = TokensCase(rng, LENS, Q_LENS, block_size=4)
    variants = dict(window_left=6, logits_soft_cap=3.0, alibi_slopes=alibi_slopes(8),
                    sinks=random_sinks(rng, 8))
    out, lse = t.reference(**variants)
    c = t.c
    for b, L in enumerate(int(x) for x in c.context_lens):
        n = Q_LENS[b]
        for i in range(n):
            row = int(t.q_indptr[b]) + i
            one_out, one_lse = reference_decode(
                load(t.q, c.q_dtype)[row:row + 1], load(c.k, c.kv_dtype),
                load(c.v, c.kv_dtype), c.block_table[b:b + 1], [max(L - n + i + 1, 0)],
                **variants)
            np.testing.assert_allclose(out[row], one_out[0], rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(lse[row], one_lse[0], rtol=1e-12)


# ----------------------------------------------------------------------------------------------
# NumPy on the CPU


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_query_tokens(dtype, block_size):
    rng = np.random.default_rng(zlib.crc32(repr((dtype, block_size)).encode()))
    t = TokensCase(rng, LENS, Q_LENS, block_size=block_size, q_dtype=dtype, kv_dtype=dtype)
    out, lse = t.check()
    assert out.shape == t.q.shape and lse.shape == t.q.shape[:2]


@pytest.mark.parametrize("shape", [(8, 2, 64), (16, 16, 128), (32, 1, 96), (4, 4, 256)],
                         ids=lambda s: "H%d-KV%d-D%d" % s)
def test_query_tokens_head_shapes(shape):
    num_heads, num_kv_heads, head_dim = shape
    rng = np.random.default_rng(zlib.crc32(repr(shape).encode()))
    t = TokensCase(rng, [33, 2, 130], [6, 4, 2], num_heads=num_heads, num_kv_heads=num_kv_heads,
                   head_dim=head_dim, block_size=16, q_dtype="bf16", kv_dtype="bf16")
    t.check(out_dtype="f32")


def test_many_query_tokens_over_a_long_context():
    # Chunked prefill: a chunk of 64 tokens at the end of a 2000-token context, next to a
    # sequence decoding one token and one verifying 7 drafted tokens.
    rng = np.random.default_rng(1)
    t = TokensCase(rng, [2000, 500, 70], [64, 1, 7], num_heads=4, num_kv_heads=2,
                   q_dtype="bf16", kv_dtype="bf16")
    t.check()


def test_each_token_is_a_one_token_decode():
    # Row i of sequence b is the plain decode of a context of P + 1 tokens over b's table.
    rng = np.random.default_rng(2)
    t = TokensCase(rng, LENS, Q_LENS, block_size=8)
    out, lse = t.decode()
    c = t.c
    for b, L in enumerate(int(x) for x in c.context_lens):
        n = Q_LENS[b]
        for i in range(n):
            row = int(t.q_indptr[b]) + i
            one_out, one_lse = pagedattn.decode(
                t.q[row:row + 1], c.k, c.v, c.block_table[b:b + 1],
                np.array([max(L - n + i + 1, 0)], np.int32), return_lse=True)
            np.testing.assert_allclose(out[row], one_out[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(lse[row], one_lse[0], rtol=1e-6)


def test_causal_mask():
    # Changing the key and value of token T of a sequence changes exactly its query tokens at
    # P >= T; the earlier ones never see it, to the bit.
    rng = np.random.default_rng(3)
    t = TokensCase(rng, [40, 25], [6, 3], block_size=8, poison=False)
    before, before_lse = t.decode()
    L, n, T = 40, 6, 37  # positions 34..39; T between them
    c = t.c
    blk = c.block_table[0, T // 8]
    c.k[blk, :, T % 8] += 1.5
    c.v[blk, :, T % 8] -= 2.0
    after, after_lse = t.decode()
    for i in range(n):
        pos = L - n + i
        same = np.array_equal(after[i], before[i]) and np.array_equal(after_lse[i], before_lse[i])
        assert same == (pos < T), (i, pos)
    # The other sequence's rows are untouched.
    assert np.array_equal(after[n:], before[n:]) and np.array_equal(after_lse[n:], before_lse[n:])


def test_contexts_shorter_than_the_query_tokens():
    # Positions P < 0 attend to nothing: out = 0, lse = -inf, or the sink with sinks.
    rng = np.random.default_rng(4)
    t = TokensCase(rng, [2, 0, 3], [5, 3, 3], block_size=4)
    out, lse = t.check()
    assert not out[:3].any() and np.all(lse[:3] == -np.inf)  # P = -3, -2, -1
    assert np.isfinite(lse[3:5]).all()                        # P = 0, 1
    assert not out[5:8].any() and np.all(lse[5:8] == -np.inf)  # the empty context
    assert np.isfinite(lse[8:]).all()                         # P = 0, 1, 2: the whole context
    sinks = random_sinks(rng, 8)
    out, lse = t.check(sinks=sinks)
    for row in (0, 1, 2, 5, 6, 7):
        assert not out[row].any() and np.array_equal(lse[row], sinks)


def test_sequences_without_query_tokens():
    # n_b = 0: the sequence has no rows and nothing of it is read, its table entries included.
    rng = np.random.default_rng(5)
    t = TokensCase(rng, [30, 50, 12, 7], [0, 3, 0, 2], block_size=8)
    t.c.block_table[0, :] = 10**6
    t.c.block_table[2, :] = -1
    slide_out(t, -1)
    out, _ = t.check()
    assert np.isfinite(out).all()
    # Every sequence without query tokens: no rows at all.
    t = TokensCase(rng, [30, 0, 9], [0, 0, 0], block_size=8)
    out, lse = t.decode()
    assert out.shape == (0, 8, 64) and lse.shape == (0, 8)
    out = pagedattn.decode(*t.args(), q_indptr=t.q_indptr)
    assert out.shape == (0, 8, 64)


def test_one_token_each_is_plain_decode():
    # q_indptr = 0, 1, ..., batch is the plain call, bit for bit.
    rng = np.random.default_rng(6)
    c = make_case(rng, context_lens=[0, 1, 17, 300])
    plain, plain_lse = pagedattn.decode(*c.args(), return_lse=True)
    out, lse = pagedattn.decode(*c.args(), q_indptr=np.arange(5, dtype=np.int32),
                                return_lse=True)
    assert np.array_equal(out, plain) and np.array_equal(lse, plain_lse)


@pytest.mark.parametrize("variants", ["window", "soft_cap", "alibi", "sinks", "all"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_query_tokens_with_variants(variants, dtype):
    rng = np.random.default_rng(zlib.crc32(repr((variants, dtype)).encode()))
    t = TokensCase(rng, LENS + [120], Q_LENS + [30], block_size=8, q_dtype=dtype,
                   kv_dtype=dtype)
    chosen = variant_kwargs(variants, rng, 8, window_left=5, scale=1.0, all_window_left=11,
                            all_soft_cap=4.0)
    if "window_left" in chosen:
        slide_out(t, chosen["window_left"])
    out, _ = t.check(**chosen)
    assert np.isfinite(load(out, dtype)).all()  # nothing a query does not attend to was read


@pytest.mark.parametrize("window_left", [0, 1, 7, 8, 40, 10**6])
def test_window_per_query_token(window_left):
    # Each query token's window starts from its own position: later tokens see later windows.
    rng = np.random.default_rng(zlib.crc32(repr(window_left).encode()))
    t = TokensCase(rng, [0, 9, 16, 41, 300], [1, 4, 16, 6, 12], block_size=8)
    slide_out(t, window_left)
    t.check(window_left=window_left)


def test_window_checks_only_the_table_entries_read():
    # L = 40, 4 query tokens (P = 36..39), block 16: with window_left = 20 the earliest query
    # reads from token 16 on (block 1), so entry 0 is never read; with 21, from token 15.
    rng = np.random.default_rng(7)
    t = TokensCase(rng, [40, 10], [4, 2], block_size=16, poison=False)
    t.c.block_table[0, 0] = 10**6
    t.check(window_left=20)
    out = empty(t.q.shape, "f32")
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(*t.args(), q_indptr=t.q_indptr, window_left=21, out=out)
    assert info.value.code == "out_of_range"
    assert info.value.argument == "block_table[0][0]", str(info.value)
    # One query token (P = 39) reads less than four: with window_left = 21 from token 18 on.
    pagedattn.decode(*t.args(t.q[:3]), q_indptr=indptr([1, 2]), window_left=21)


@pytest.mark.parametrize("max_q_len", [6, 7, 1000, np.int64(6), np.int32(9)])
def test_max_q_len_given(max_q_len):
    # Any bound at least the largest count gives the computed call's result, bit for bit.
    rng = np.random.default_rng(8)
    t = TokensCase(rng, [20, 3, 50], [6, 2, 4], block_size=8)
    want, want_lse = t.decode()
    out, lse = t.decode(max_q_len=max_q_len)
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)


def test_query_tokens_with_row_strides():
    # q as a slice of a fused QKV buffer and out as a slice of a wider one, one row per token.
    rng = np.random.default_rng(9)
    t = TokensCase(rng, [25, 60, 4], [3, 5, 6], num_heads=8, num_kv_heads=2, block_size=16)
    want, want_lse = t.decode()
    rows, heads, dim = t.q.shape
    qkv = np.full((rows, (heads + 4) * dim), np.nan, np.float32)
    qkv[:, : heads * dim] = t.q.reshape(rows, -1)
    q = qkv[:, : heads * dim].reshape(rows, heads, dim)
    wide = np.full((rows, heads * dim + 32), 7.0, np.float32)
    out = wide[:, : heads * dim].reshape(rows, heads, dim)
    _, lse = pagedattn.decode(*t.args(q), q_indptr=t.q_indptr, out=out, return_lse=True)
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)
    assert np.all(wide[:, heads * dim:] == 7.0)


def test_allocated_outputs_and_bf16():
    rng = np.random.default_rng(10)
    t = TokensCase(rng, [18, 5], [3, 4], q_dtype="bf16", kv_dtype="bf16")
    out, lse = pagedattn.decode(*t.args(), q_indptr=t.q_indptr, return_lse=True)
    assert out.dtype == np.uint16 and out.shape == t.q.shape and lse.shape == (7, 8)
    want, want_lse = t.reference()
    check_out(out, "bf16", want)
    check_lse(lse, want_lse)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q = t.q.view(ml_dtypes.bfloat16)
    k, v = t.c.k.view(ml_dtypes.bfloat16), t.c.v.view(ml_dtypes.bfloat16)
    out2 = pagedattn.decode(q, k, v, t.c.block_table, t.c.context_lens, q_indptr=t.q_indptr)
    assert out2.dtype == ml_dtypes.bfloat16
    assert np.array_equal(out2.view(np.uint16), out)


def test_read_only_q_indptr():
    rng = np.random.default_rng(11)
    t = TokensCase(rng, [9, 30], [2, 3])
    t.q_indptr.setflags(write=False)
    t.check()


def test_described_q_indptr_gives_the_dlpack_result():
    rng = np.random.default_rng(12)
    t = TokensCase(rng, [5, 40, 0, 17], [2, 3, 1, 4])
    q, k, v, table, lens = t.args()
    want, want_lse = pagedattn.decode(q, k, v, table, lens, q_indptr=t.q_indptr,
                                      return_lse=True)
    for max_q_len in (None, 4):
        out = np.full_like(want, np.nan)
        lse = np.full(want.shape[:2], np.nan, dtype=np.float32)
        _ext.decode(*(described(x) for x in (q, k, v, table, lens, out, lse)), None, "cpu", 0,
                    None, False, [], -1, 0.0, None, None, described(t.q_indptr), max_q_len)
        assert np.array_equal(out, want) and np.array_equal(lse, want_lse)
    # Described or through DLPack, a bad q_indptr is the same error.
    errors = []
    for bad in (t.q_indptr.astype(np.int64), described(t.q_indptr.astype(np.int64))):
        out = np.full_like(want, np.nan)
        with pytest.raises(pagedattn.Error) as info:
            _ext.decode(*(described(x) for x in (q, k, v, table, lens, out)), None, None, "cpu",
                        0, None, False, [], -1, 0.0, None, None, bad, None)
        errors.append((info.value.argument, str(info.value)))
    assert errors[0] == errors[1] and errors[0][0] == "q_indptr"


def test_workspace_size_with_max_q_len():
    rng = np.random.default_rng(13)
    t = TokensCase(rng, [5, 40], [3, 4])
    q, k, _, table, _ = t.args()
    assert pagedattn.workspace_size(q, k, table, max_q_len=4) == 0  # CPU tensors
    with pytest.raises(pagedattn.Error) as info:  # q's 7 rows are not the batch without it
        pagedattn.workspace_size(q, k, table)
    assert info.value.argument == "block_table"
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.workspace_size(q, k, table, max_q_len=2.5)
    assert info.value.argument == "max_q_len"


# ----------------------------------------------------------------------------------------------
# Errors


@pytest.fixture
def case():
    return TokensCase(np.random.default_rng(14), [5, 40, 0], [2, 3, 1], poison=False)


def refused(t: TokensCase, q_indptr, q=None, out=None, lse=None, **kw) -> pagedattn.Error:
    """decode with a bad argument: the error, and out and lse untouched."""
    return refused_decode(t.args(q), (t.q if q is None else q).shape, out=out, lse=lse,
                          q_indptr=q_indptr, **kw)


GOOD = indptr([2, 3, 1])  # 0, 2, 5, 6


@pytest.mark.parametrize("name,q_indptr,kw,code,argument,text", [
    ("too short", GOOD[:3], {}, "invalid_argument", "q_indptr", "batch + 1"),
    ("too long", np.append(GOOD, 6).astype(np.int32), {}, "invalid_argument", "q_indptr",
     "batch + 1"),
    ("int64", GOOD.astype(np.int64), {}, "invalid_argument", "q_indptr", "int32"),
    ("float32", GOOD.astype(np.float32), {}, "invalid_argument", "q_indptr", "int32"),
    ("uint32", GOOD.astype(np.uint32), {}, "invalid_argument", "q_indptr", "int32"),
    ("2-d", GOOD.reshape(1, 4), {}, "invalid_argument", "q_indptr", "[batch + 1]"),
    ("strided", np.repeat(GOOD, 2)[::2], {}, "invalid_argument", "q_indptr", "contiguous"),
    ("a list", GOOD.tolist(), {}, "invalid_argument", "q_indptr", "tensor"),
    ("a tuple", (0, 2, 5, 6), {}, "invalid_argument", "q_indptr", "tensor"),
    ("first not 0", np.array([1, 2, 5, 6], np.int32), {}, "invalid_argument", "q_indptr[0]",
     "must be 0"),
    ("decreasing", np.array([0, 4, 3, 6], np.int32), {}, "out_of_range", "q_indptr[2]",
     "query tokens"),
    ("last not the rows", np.array([0, 2, 5, 5], np.int32), {}, "invalid_argument",
     "q_indptr[3]", "num_q_tokens = 6"),
    ("last past the rows", np.array([0, 2, 5, 9], np.int32), {}, "invalid_argument",
     "q_indptr[3]", "num_q_tokens = 6"),
    ("max_q_len too small", GOOD, dict(max_q_len=2), "out_of_range", "q_indptr[2]",
     "max_q_len = 2"),
    ("max_q_len 0", GOOD, dict(max_q_len=0), "invalid_argument", "max_q_len", "positive"),
    ("max_q_len negative", GOOD, dict(max_q_len=-3), "invalid_argument", "max_q_len",
     "positive"),
    ("max_q_len a float", GOOD, dict(max_q_len=3.0), "invalid_argument", "max_q_len", "int"),
    ("max_q_len a bool", GOOD, dict(max_q_len=True), "invalid_argument", "max_q_len", "int"),
    ("max_q_len a string", GOOD, dict(max_q_len="3"), "invalid_argument", "max_q_len", "int"),
    ("max_q_len past int32", GOOD, dict(max_q_len=2**31), "invalid_argument", "max_q_len",
     "int32"),
    ("max_q_len without q_indptr", None, dict(max_q_len=3), "invalid_argument", "max_q_len",
     "without q_indptr"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_query_token_arguments(case, name, q_indptr, kw, code, argument, text):
    q = case.q if q_indptr is not None else case.q[:3]  # without q_indptr: a row per sequence
    e = refused(case, q_indptr, q=q, **kw)
    assert e.code == code, str(e)
    assert e.argument == argument, str(e)
    assert text in str(e), str(e)
    assert str(e).startswith(f"pagedattn: {argument}"), str(e)


def test_shapes_with_query_tokens(case):
    t = case
    # The batch is context_lens' length: the table must have as many rows.
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(*t.args()[:3], t.c.block_table[:2], t.c.context_lens, q_indptr=GOOD)
    assert info.value.argument == "block_table" and "context_lens.shape[0]" in str(info.value)
    # out and lse have q's rows.
    e = refused(t, GOOD, out=empty((3, 8, 64), "f32"))
    assert e.argument == "out" and "q.shape" in str(e)
    e = refused(t, GOOD, lse=np.zeros((3, 8), np.float32))
    assert e.argument == "lse" and "num_q_tokens" in str(e)
    # q of rows other than q_indptr[batch] (the library's check).
    e = refused(t, GOOD, q=t.q[:5])
    assert e.argument == "q_indptr[3]" and "num_q_tokens = 5" in str(e)
    # q_indptr on another device than q is checked like every tensor (see the CUDA tests);
    # an empty batch has no query tokens.
    q = np.zeros((2, 8, 64), np.float32)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, t.c.k, t.c.v, np.zeros((0, 3), np.int32), np.zeros(0, np.int32),
                         q_indptr=np.zeros(1, np.int32))
    assert info.value.argument == "q" and "num_q_tokens" in str(info.value)
    out = pagedattn.decode(q[:0], t.c.k, t.c.v, np.zeros((0, 3), np.int32),
                           np.zeros(0, np.int32), q_indptr=np.zeros(1, np.int32))
    assert out.shape == (0, 8, 64)


def test_table_entries_of_query_tokens_are_checked(case):
    # Inside the attended tokens a bad block id is an error naming the entry.
    t = case
    t.c.block_table[1, 1] = 10**6  # tokens 16-31 of context_lens[1] = 40
    e = refused(t, GOOD)
    assert e.code == "out_of_range" and e.argument == "block_table[1][1]", str(e)


# ----------------------------------------------------------------------------------------------
# PyTorch on the CPU: the all-PyTorch path, and PyTorch tensors among others


@needs_torch
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_torch_cpu_query_tokens(dtype):
    rng = np.random.default_rng(15)
    t = TokensCase(rng, LENS, Q_LENS, q_dtype=dtype, kv_dtype=dtype)
    slide_out(t, 9)
    sinks = random_sinks(rng, 8)
    want_out, want_lse = t.reference(window_left=9, sinks=sinks)
    args = case_tensors(t.c, q=t.q)
    # The all-PyTorch path (with and without max_q_len), and a NumPy q_indptr among PyTorch
    # tensors (the general path).
    for q_indptr, kw in ((torch.from_numpy(t.q_indptr), {}),
                         (torch.from_numpy(t.q_indptr), dict(max_q_len=8)),
                         (t.q_indptr, {})):
        out, lse = pagedattn.decode(*args, q_indptr=q_indptr, window_left=9,
                                    sinks=torch.from_numpy(sinks), return_lse=True, **kw)
        assert out.shape == args[0].shape
        check_out(from_torch(out, dtype), dtype, want_out)
        check_lse(lse.numpy(), want_lse)
    # Without a variant, the all-PyTorch path passes q_indptr alone (on a case whose blocks
    # before the window are still there: without a window every token is read).
    whole = TokensCase(np.random.default_rng(15), LENS, Q_LENS, q_dtype=dtype, kv_dtype=dtype)
    out = pagedattn.decode(*case_tensors(whole.c, q=whole.q), q_indptr=torch.from_numpy(whole.q_indptr))
    check_out(from_torch(out, dtype), dtype, whole.reference()[0])


@needs_torch
def test_torch_cpu_query_token_errors():
    t = TokensCase(np.random.default_rng(16), [5, 40], [2, 3])
    args = case_tensors(t.c, q=t.q)
    out = torch.full(args[0].shape, float("nan"))
    good = torch.from_numpy(t.q_indptr)
    check_rejected(lambda **bad: pagedattn.decode(*args, out=out, **bad), out,
                   ((dict(q_indptr=good.long()), "q_indptr"),
                    (dict(q_indptr=good[:2]), "q_indptr"),
                    (dict(q_indptr=[0, 2, 5]), "q_indptr"),
                    (dict(q_indptr=good, max_q_len=1), "q_indptr[1]"),
                    (dict(q_indptr=good, max_q_len=1.0), "max_q_len"),
                    (dict(max_q_len=3), "max_q_len")))


# ----------------------------------------------------------------------------------------------
# CUDA


@needs_cuda
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("given", [False, True])
def test_cuda_query_tokens(dtype, given):
    rng = np.random.default_rng(zlib.crc32(repr((dtype, given)).encode()))
    t = TokensCase(rng, LENS + [2000], Q_LENS + [16], num_heads=16, num_kv_heads=2,
                   head_dim=128, q_dtype=dtype, kv_dtype=dtype)
    slide_out(t, 100)
    sinks = random_sinks(rng, 16)
    q, k, v, table, lens = case_tensors(t.c, "cuda", q=t.q)
    kw = dict(max_q_len=16) if given else {}
    out, lse = pagedattn.decode(q, k, v, table, lens, q_indptr=torch.from_numpy(t.q_indptr).cuda(),
                                window_left=100, alibi_slopes=torch.from_numpy(alibi_slopes(16))
                                .cuda(), sinks=torch.from_numpy(sinks).cuda(), return_lse=True,
                                **kw)
    torch.cuda.synchronize()
    want_out, want_lse = t.reference(window_left=100, alibi_slopes=alibi_slopes(16), sinks=sinks)
    check_out(from_torch(out, dtype), dtype, want_out)
    check_lse(lse.cpu().numpy(), want_lse)


@needs_cuda
def test_cuda_query_token_errors():
    t = TokensCase(np.random.default_rng(17), [30, 70], [3, 2])
    q, k, v, table, lens = case_tensors(t.c, "cuda", q=t.q)
    out = torch.full_like(q, float("nan"))

    def err(**kw):
        with pytest.raises(pagedattn.Error) as info:
            pagedattn.decode(q, k, v, table, lens, out=out, **kw)
        torch.cuda.synchronize()
        assert torch.isnan(out).all()  # nothing written
        return info.value

    e = err(q_indptr=torch.from_numpy(t.q_indptr))  # host memory with CUDA tensors
    assert e.argument == "q_indptr" and "device" in str(e)
    e = err(q_indptr=torch.from_numpy(t.q_indptr).cuda().long())
    assert e.argument == "q_indptr" and "int32" in str(e)
    # Values in device memory are checked with checked=True.
    bad = torch.tensor([0, 4, 3], dtype=torch.int32, device="cuda")
    e = err(q_indptr=bad, checked=True, max_q_len=4)
    assert e.argument == "q_indptr[2]", str(e)
