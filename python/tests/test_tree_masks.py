"""Tree masks (decode's tree_mask and tree_mask_indptr, and pack_tree_masks) against a float64
NumPy implementation written here from the definition: among sequence b's n new tokens (at
positions L - n .. L - 1, the last n of its context of L), query token i attends every token
before the new ones and new token j where its mask's bit (i, j) is set. NumPy on the CPU always,
PyTorch's paths where it is installed, the CUDA backend where a GPU is present; and the errors
for bad arguments."""

from __future__ import annotations

import math
import zlib
from typing import List, Optional, Sequence

import numpy as np
import pytest

import pagedattn

from _cases import (alibi_slopes, arg, case_tensors, check_lse, check_out, empty, from_torch,
                    indptr, load, make_case, needs_cuda, needs_torch, random_sinks, refused_decode,
                    store, torch)

# ----------------------------------------------------------------------------------------------
# The oracle


def tree_reference(q, k, v, block_table, context_lens, q_indptr, masks: Sequence[np.ndarray],
                   scale: Optional[float] = None):
    """(out [rows, H, D], lse [rows, H]) in float64, one query token at a time: row
    q_indptr[b] + i is token i of sequence b's n query tokens; with first = L - n it attends the
    tokens t in [0, first) and the new tokens first + j (j <= i) where masks[b][i, j] is set,
    each position that exists (>= 0); softmax of scale * q . K_t over them. Nothing attended:
    out = 0, lse = -inf."""
    rows, num_heads, head_dim = q.shape
    _, num_kv_heads, block_size, _ = k.shape
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = np.zeros((rows, num_heads, head_dim))
    lse = np.full((rows, num_heads), -np.inf)
    for b in range(len(context_lens)):
        start, end = int(q_indptr[b]), int(q_indptr[b + 1])
        n = end - start
        first = int(context_lens[b]) - n
        for i in range(n):
            kept = [first + j for j in range(i + 1) if masks[b][i, j]]
            attended = [t for t in list(range(first)) + kept if t >= 0]
            if not attended:
                continue
            blocks = np.array([block_table[b][t // block_size] for t in attended])
            slots = np.array([t % block_size for t in attended])
            for h in range(num_heads):
                keys = k[blocks, h // group, slots]  # [tokens, D]
                s = scale * (keys @ q[start + i, h])
                m = s.max()
                weights = np.exp(s - m)
                out[start + i, h] = (weights @ v[blocks, h // group, slots]) / weights.sum()
                lse[start + i, h] = m + math.log(weights.sum())
    return out, lse


def random_tree(rng: np.random.Generator, n: int) -> np.ndarray:
    """A token tree's mask: token j's parent is a random earlier token (or none: a root, right
    after the tokens before the new ones); each token attends itself and its ancestors."""
    mask = np.zeros((n, n), dtype=bool)
    for j in range(n):
        mask[j, j] = True
        parent = int(rng.integers(-1, j)) if j > 0 else -1
        if parent >= 0:
            mask[j] |= mask[parent]
    return mask


def random_lower(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random bits on and below the diagonal: any mask the library takes, rows that attend none
    of the new tokens (nor themselves) included."""
    return np.tril(rng.random((n, n)) < 0.5)


class TreeCase:
    """A fragmented paged case (_cases.make_case: NaN in every slot past the contexts, garbage
    past each table row) with q_lens[b] query tokens for sequence b and their masks."""

    def __init__(self, rng, context_lens, q_lens, masks: str = "tree", **kw):
        self.c = make_case(rng, context_lens=context_lens, **kw)
        self.q_indptr = indptr(q_lens)
        _, heads, dim = self.c.q.shape
        rows = int(self.q_indptr[-1])
        self.q = store(rng.standard_normal((rows, heads, dim), dtype=np.float32), self.c.q_dtype)
        make = random_tree if masks == "tree" else random_lower
        self.masks: List[np.ndarray] = [make(rng, n) for n in q_lens]
        self.tree_mask, self.tree_mask_indptr = pagedattn.pack_tree_masks(self.masks)

    @property
    def dtype(self) -> str:
        return self.c.q_dtype

    def args(self):
        c = self.c
        return (arg(self.q, c.q_dtype), arg(c.k, c.kv_dtype), arg(c.v, c.kv_dtype),
                c.block_table, c.context_lens)

    def reference(self, scale=None, masks=None):
        c = self.c
        return tree_reference(load(self.q, c.q_dtype), *c.kv_values(), c.block_table,
                              c.context_lens, self.q_indptr,
                              self.masks if masks is None else masks, scale)

    def decode(self, **kw):
        kw.setdefault("tree_mask", self.tree_mask)
        kw.setdefault("tree_mask_indptr", self.tree_mask_indptr)
        return pagedattn.decode(*self.args(), q_indptr=self.q_indptr,
                                out=arg(empty(self.q.shape, self.dtype), self.dtype),
                                return_lse=True, **kw)

    def check(self, scale=None, **kw):
        out, lse = self.decode(scale=scale, **kw)
        want_out, want_lse = self.reference(scale)
        check_out(out, self.dtype, want_out)
        check_lse(lse, want_lse)
        return out, lse


# Contexts and query counts with every edge: a sequence without query tokens, an empty context
# with query tokens, contexts shorter than their query count (new tokens at positions < 0),
# one token, block boundaries, a long context and a wide tree.
LENS = [0, 1, 3, 16, 17, 40, 300, 5, 90]
Q_LENS = [2, 1, 5, 1, 4, 3, 8, 0, 23]

# ----------------------------------------------------------------------------------------------
# pack_tree_masks


def test_pack_tree_masks_is_packbits_little():
    rng = np.random.default_rng(0)
    masks = [random_lower(rng, n) for n in (3, 0, 1, 8, 5, 12)]
    data, offsets = pagedattn.pack_tree_masks(masks)
    assert data.dtype == np.uint8 and offsets.dtype == np.int32
    assert offsets.tolist() == [0, 2, 2, 3, 11, 15, 33]  # ceil(n * n / 8) bytes each
    for b, m in enumerate(masks):
        span = data[offsets[b]:offsets[b + 1]]
        assert np.array_equal(span, np.packbits(m.reshape(-1), bitorder="little"))
        # Bit (i, j) at bit (i * n + j) % 8 of byte (i * n + j) // 8 of the span.
        n = len(m)
        for i in range(n):
            for j in range(n):
                bit = i * n + j
                assert bool((span[bit // 8] >> (bit % 8)) & 1) == m[i, j]
    # Lists of lists, no masks at all.
    data, offsets = pagedattn.pack_tree_masks([[[True, False], [True, True]]])
    assert data.tolist() == [0b1101] and offsets.tolist() == [0, 1]
    data, offsets = pagedattn.pack_tree_masks([])
    assert data.dtype == np.uint8 and data.shape == (0,) and offsets.tolist() == [0]


@pytest.mark.parametrize("masks,argument,text", [
    ([np.ones((2, 2), np.uint8)], "masks[0]", "expected bool"),
    ([np.eye(2, dtype=bool), np.ones((2, 3), bool)], "masks[1]", "square"),
    ([np.ones(4, bool)], "masks[0]", "square"),
    ([np.eye(3, dtype=bool) | np.eye(3, k=1, dtype=bool)], "masks[0]", "[0, 1] = True"),
], ids=["uint8", "not square", "1-d", "above the diagonal"])
def test_pack_tree_masks_errors(masks, argument, text):
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.pack_tree_masks(masks)
    assert info.value.argument == argument and text in str(info.value), str(info.value)


# ----------------------------------------------------------------------------------------------
# NumPy on the CPU


def test_oracle_with_causal_masks_is_the_causal_call():
    # A full lower triangle is the causal rule: the oracle gives what a call without a tree
    # mask computes.
    rng = np.random.default_rng(1)
    t = TreeCase(rng, LENS, Q_LENS, block_size=8)
    causal = [np.tril(np.ones((n, n), bool)) for n in Q_LENS]
    want, want_lse = t.reference(masks=causal)
    out, lse = pagedattn.decode(*t.args(), q_indptr=t.q_indptr, return_lse=True)
    check_out(out, "f32", want)
    check_lse(lse, want_lse)


@pytest.mark.parametrize("masks", ["tree", "lower"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_tree_masks(masks, dtype, block_size):
    rng = np.random.default_rng(zlib.crc32(repr((masks, dtype, block_size)).encode()))
    t = TreeCase(rng, LENS, Q_LENS, masks, block_size=block_size, q_dtype=dtype,
                 kv_dtype=dtype)
    out, lse = t.check()
    assert out.shape == t.q.shape and lse.shape == t.q.shape[:2]


@pytest.mark.parametrize("shape", [(8, 2, 64), (16, 16, 128), (32, 1, 96), (12, 4, 256)],
                         ids=lambda s: "H%d-KV%d-D%d" % s)
@pytest.mark.parametrize("masks", ["tree", "lower"])
def test_tree_masks_head_shapes(shape, masks):
    num_heads, num_kv_heads, head_dim = shape
    rng = np.random.default_rng(zlib.crc32(repr((shape, masks)).encode()))
    t = TreeCase(rng, [33, 2, 130], [6, 4, 11], masks, num_heads=num_heads,
                 num_kv_heads=num_kv_heads, head_dim=head_dim, q_dtype="bf16", kv_dtype="bf16")
    t.check(scale=0.3)


def test_unattended_new_tokens_are_never_read():
    # A new token no mask row keeps: NaN in its key and value changes nothing.
    rng = np.random.default_rng(2)
    t = TreeCase(rng, [40, 12], [6, 4], "lower", block_size=8)
    t.masks[0][:, 2] = False  # token 2 of sequence 0, at position 36
    t.masks[1][:, 0] = False  # token 0 of sequence 1, at position 8
    t.tree_mask, t.tree_mask_indptr = pagedattn.pack_tree_masks(t.masks)
    c = t.c
    for b, pos in ((0, 36), (1, 8)):
        blk = c.block_table[b, pos // 8]
        c.k[blk, :, pos % 8] = np.nan
        c.v[blk, :, pos % 8] = np.nan
    out, _ = t.check()
    assert np.isfinite(out).all()


def test_causal_tree_mask_is_the_causal_call():
    # The full lower triangle as a tree mask gives the causal call's results, with every
    # attention variant on.
    rng = np.random.default_rng(3)
    t = TreeCase(rng, LENS, Q_LENS, block_size=8, poison=False)
    causal = [np.tril(np.ones((n, n), bool)) for n in Q_LENS]
    mask, offsets = pagedattn.pack_tree_masks(causal)
    variants = dict(window_left=20, logits_soft_cap=5.0, alibi_slopes=alibi_slopes(8),
                    sinks=random_sinks(rng, 8))
    want, want_lse = pagedattn.decode(*t.args(), q_indptr=t.q_indptr, return_lse=True,
                                      **variants)
    out, lse = t.decode(tree_mask=mask, tree_mask_indptr=offsets, **variants)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6)


def test_spans_with_gaps_and_read_only_inputs():
    # Spans may be longer than a mask (padding between them), the bits past a mask's n * n are
    # ignored, and the inputs may be read-only.
    rng = np.random.default_rng(4)
    t = TreeCase(rng, [20, 9, 31], [5, 0, 3])
    padded = np.full(64, 0xAA, np.uint8)  # padding bits set above every diagonal
    offsets = np.array([3, 10, 10, 40], np.int32)
    for b, m in enumerate(t.masks):
        bits = np.packbits(m.reshape(-1), bitorder="little")
        if m.size % 8:  # the last byte's bits past the mask's are no part of it
            bits[-1] |= (0xFF << (m.size % 8)) & 0xFF
        padded[offsets[b]:offsets[b] + len(bits)] = bits
    padded.setflags(write=False)
    offsets.setflags(write=False)
    want, want_lse = t.decode()
    out, lse = t.decode(tree_mask=padded, tree_mask_indptr=offsets)
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)


def test_empty_batch_and_no_query_tokens():
    rng = np.random.default_rng(5)
    t = TreeCase(rng, [30, 0, 9], [0, 0, 0])
    assert t.tree_mask.shape == (0,)
    out, lse = t.decode()
    assert out.shape == (0, 8, 64) and lse.shape == (0, 8)
    q = np.zeros((0, 8, 64), np.float32)
    out = pagedattn.decode(q, t.c.k, t.c.v, np.zeros((0, 3), np.int32), np.zeros(0, np.int32),
                           q_indptr=np.zeros(1, np.int32), tree_mask=np.zeros(0, np.uint8),
                           tree_mask_indptr=np.zeros(1, np.int32))
    assert out.shape == (0, 8, 64)


# ----------------------------------------------------------------------------------------------
# Errors


@pytest.fixture
def case():
    # Sequences of 3, 2 and 4 query tokens: masks of 2, 1 and 2 bytes at 0, 2, 3 (5 bytes).
    return TreeCase(np.random.default_rng(6), [5, 40, 7], [3, 2, 4], poison=False)


def refused(t: TreeCase, **kw) -> pagedattn.Error:
    """decode with a bad argument: the error, and out and lse untouched."""
    kw.setdefault("q_indptr", t.q_indptr)
    return refused_decode(t.args(), t.q.shape, **kw)


MASK = "mask"        # stands for the case's tree_mask
OFFSETS = "offsets"  # and its tree_mask_indptr (0, 2, 3, 5)


def above_diagonal(t: TreeCase) -> np.ndarray:
    """The case's mask with bit (1, 2) of sequence 2 set: bit 6 of byte 3 + 6 // 8."""
    bad = t.tree_mask.copy()
    bad[3] |= 1 << 6
    return bad


@pytest.mark.parametrize("name,kw,code,argument,text", [
    ("mask without indptr", dict(tree_mask=MASK), "invalid_argument", "tree_mask_indptr",
     "together"),
    ("indptr without mask", dict(tree_mask_indptr=OFFSETS), "invalid_argument", "tree_mask",
     "together"),
    ("no q_indptr", dict(tree_mask=MASK, tree_mask_indptr=OFFSETS, q_indptr=None),
     "invalid_argument", "tree_mask", "without q_indptr"),
    ("bit above the diagonal", dict(tree_mask=above_diagonal, tree_mask_indptr=OFFSETS),
     "invalid_argument", "tree_mask bit (1, 2) of sequence 2", "above the diagonal"),
    ("span too short", dict(tree_mask=MASK, tree_mask_indptr=np.array([0, 1, 3, 5], np.int32)),
     "invalid_argument", "tree_mask_indptr[1]", "needs 2"),
    ("decreasing", dict(tree_mask=MASK, tree_mask_indptr=np.array([0, 2, 1, 5], np.int32)),
     "invalid_argument", "tree_mask_indptr[2]", "needs 1"),
    ("first negative", dict(tree_mask=MASK, tree_mask_indptr=np.array([-1, 2, 3, 5], np.int32)),
     "invalid_argument", "tree_mask_indptr[0]", "negative"),
    ("tensor too short", dict(tree_mask=lambda t: t.tree_mask[:4], tree_mask_indptr=OFFSETS),
     "invalid_argument", "tree_mask", "bytes [3, 5)"),
    ("span past the tensor", dict(tree_mask=MASK,
                                  tree_mask_indptr=np.array([0, 2, 4, 6], np.int32)),
     "invalid_argument", "tree_mask", "bytes [4, 6)"),
    ("mask int8", dict(tree_mask=lambda t: t.tree_mask.view(np.int8), tree_mask_indptr=OFFSETS),
     "invalid_argument", "tree_mask", "uint8"),
    ("mask bool", dict(tree_mask=lambda t: t.tree_mask.astype(bool), tree_mask_indptr=OFFSETS),
     "invalid_argument", "tree_mask", "uint8"),
    ("mask int32", dict(tree_mask=lambda t: t.tree_mask.astype(np.int32),
                        tree_mask_indptr=OFFSETS), "invalid_argument", "tree_mask", "uint8"),
    ("mask 2-d", dict(tree_mask=lambda t: t.tree_mask.reshape(1, 5), tree_mask_indptr=OFFSETS),
     "invalid_argument", "tree_mask", "[bytes]"),
    ("mask strided", dict(tree_mask=lambda t: np.repeat(t.tree_mask, 2)[::2],
                          tree_mask_indptr=OFFSETS), "invalid_argument", "tree_mask",
     "contiguous"),
    ("mask a list", dict(tree_mask=lambda t: t.tree_mask.tolist(), tree_mask_indptr=OFFSETS),
     "invalid_argument", "tree_mask", "tensor"),
    ("indptr int64", dict(tree_mask=MASK, tree_mask_indptr=lambda t: t.tree_mask_indptr
                          .astype(np.int64)), "invalid_argument", "tree_mask_indptr", "int32"),
    ("indptr too short", dict(tree_mask=MASK, tree_mask_indptr=lambda t: t.tree_mask_indptr[:3]),
     "invalid_argument", "tree_mask_indptr", "batch + 1"),
    ("indptr 2-d", dict(tree_mask=MASK, tree_mask_indptr=lambda t: t.tree_mask_indptr
                        .reshape(2, 2)), "invalid_argument", "tree_mask_indptr", "[batch + 1]"),
    ("indptr strided", dict(tree_mask=MASK, tree_mask_indptr=lambda t: np.repeat(
        t.tree_mask_indptr, 2)[::2]), "invalid_argument", "tree_mask_indptr", "contiguous"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_tree_mask_arguments(case, name, kw, code, argument, text):
    def value(x):
        if isinstance(x, str):
            return {MASK: case.tree_mask, OFFSETS: case.tree_mask_indptr}[x]
        return x(case) if callable(x) else x

    kw = {n: value(x) for n, x in kw.items()}
    if kw.get("q_indptr", 0) is None:
        case.q = case.q[:3]  # without q_indptr: a row per sequence
    e = refused(case, **kw)
    assert e.code == code, str(e)
    assert e.argument == argument, str(e)
    assert text in str(e), str(e)
    assert str(e).startswith(f"pagedattn: {argument}"), str(e)


def test_the_case_of_the_errors_is_good(case):
    assert case.tree_mask_indptr.tolist() == [0, 2, 3, 5]
    case.check()
    # Only the bytes the masks take must lie within tree_mask: a last span reaching past its
    # end is no error.
    case.check(tree_mask_indptr=np.array([0, 2, 3, 100], np.int32))


# ----------------------------------------------------------------------------------------------
# PyTorch on the CPU and on CUDA


@needs_torch
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_torch_cpu_tree_masks(dtype):
    rng = np.random.default_rng(7)
    t = TreeCase(rng, LENS, Q_LENS, q_dtype=dtype, kv_dtype=dtype)
    want_out, want_lse = t.reference()
    args = case_tensors(t.c, q=t.q)
    # The all-PyTorch path, and NumPy masks among PyTorch tensors (the general path).
    for mask, offsets in ((torch.from_numpy(t.tree_mask), torch.from_numpy(t.tree_mask_indptr)),
                          (t.tree_mask, t.tree_mask_indptr)):
        out, lse = pagedattn.decode(*args, q_indptr=torch.from_numpy(t.q_indptr),
                                    tree_mask=mask, tree_mask_indptr=offsets, return_lse=True)
        check_out(from_torch(out, dtype), dtype, want_out)
        check_lse(lse.numpy(), want_lse)
    out = torch.full(args[0].shape, float("nan"))
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(*args, out=out, q_indptr=torch.from_numpy(t.q_indptr),
                         tree_mask=torch.from_numpy(t.tree_mask).to(torch.int8),
                         tree_mask_indptr=torch.from_numpy(t.tree_mask_indptr))
    assert info.value.argument == "tree_mask" and torch.isnan(out).all()


@needs_cuda
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("masks", ["tree", "lower"])
def test_cuda_tree_masks(dtype, masks):
    t = TreeCase(np.random.default_rng(8), LENS, Q_LENS, masks=masks, q_dtype=dtype,
                 kv_dtype=dtype)
    want_out, want_lse = t.reference()
    args = case_tensors(t.c, "cuda", q=t.q)
    out, lse = pagedattn.decode(*args, q_indptr=torch.from_numpy(t.q_indptr).cuda(),
                                tree_mask=torch.from_numpy(t.tree_mask).cuda(),
                                tree_mask_indptr=torch.from_numpy(t.tree_mask_indptr).cuda(),
                                return_lse=True)
    torch.cuda.synchronize()
    check_out(from_torch(out, dtype), dtype, want_out)
    check_lse(lse.cpu().numpy(), want_lse)
    # Masks in host memory with CUDA tensors are refused like any tensor on another device.
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(*args, out=out, q_indptr=q_indptr,
                         tree_mask=torch.from_numpy(t.tree_mask),
                         tree_mask_indptr=torch.from_numpy(t.tree_mask_indptr).cuda())
    assert info.value.argument == "tree_mask" and "device" in str(info.value)
