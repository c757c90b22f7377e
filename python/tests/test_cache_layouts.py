"""Caches in other layouts than dense HND: kv_layout="NHD" ([num_blocks, block_size,
num_kv_heads, head_dim]), K and V as two views into one combined tensor (vLLM's
[num_blocks, 2, ...]), K and V interleaved per kv head or per slot, and a slice of a larger,
padded pool. Whatever the layout, decode must give the bits of the dense HND call (and match the
float64 reference), read nothing but the cache rows (everything else holds NaN), and
write_cache and copy_blocks must leave every row as they leave it in a dense HND cache, touching
nothing between the rows. Layouts the library cannot take are refused naming the argument.
NumPy always; PyTorch on the CPU where it is installed, on CUDA where a GPU is present."""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import pytest

import pagedattn
from pagedattn import _ext
from _cases import (DTYPES, arg, check_lse, check_out, described, empty, load, make_case,
                    needs_cuda, needs_torch, store, to_torch, torch)

# (num_heads, num_kv_heads, head_dim, block_size)
SHAPES = [(8, 2, 64, 16), (4, 4, 128, 8), (16, 1, 80, 32), (8, 8, 64, 1)]
LENS = [0, 1, 15, 16, 17, 300, 33]


def bits(x) -> bytes:
    return np.ascontiguousarray(x).tobytes()


# ----------------------------------------------------------------------------------------------
# Storing a dense HND cache pair in another layout (NumPy). Each storage returns the K and V
# views to pass, in `layout`'s dimension order, and the buffers behind them, each with the views
# into it (everything else in a buffer holds NaN: all-ones bits).


def to_layout(x_hnd: np.ndarray, layout: str) -> np.ndarray:
    return x_hnd if layout == "HND" else np.ascontiguousarray(x_hnd.transpose(0, 2, 1, 3))


def as_hnd(x: np.ndarray, layout: str) -> np.ndarray:
    """A cache view in `layout` seen in HND order (a view, not a copy)."""
    return x if layout == "HND" else x.transpose(0, 2, 1, 3)


def _nan_buffer(shape, dtype) -> np.ndarray:
    buf = np.empty(shape, dtype=dtype)
    buf.view(np.uint8)[...] = 0xFF
    return buf


def _covered(buf: np.ndarray, views) -> np.ndarray:
    """Which elements of the dense buffer buf the views cover, from their offsets and strides."""
    mask = np.zeros(buf.size, dtype=bool)
    base = buf.__array_interface__["data"][0]
    for v in views:
        start = (v.__array_interface__["data"][0] - base) // buf.itemsize
        grids = np.meshgrid(*[np.arange(n) for n in v.shape], indexing="ij")
        flat = start + sum(g * (s // buf.itemsize) for g, s in zip(grids, v.strides))
        mask[flat.ravel()] = True
    return mask.reshape(buf.shape)


def dense(k, v, layout):
    k2, v2 = to_layout(k, layout).copy(), to_layout(v, layout).copy()
    return k2, v2, [(k2, [k2]), (v2, [v2])]


def combined(k, v, layout):
    """vLLM's combined tensor: [num_blocks, 2, ...], K = kv[:, 0], V = kv[:, 1]."""
    kl, vl = to_layout(k, layout), to_layout(v, layout)
    kv = _nan_buffer((kl.shape[0], 2) + kl.shape[1:], kl.dtype)
    kv[:, 0], kv[:, 1] = kl, vl
    return kv[:, 0], kv[:, 1], [(kv, [kv[:, 0], kv[:, 1]])]


def interleaved(k, v, layout):
    """K and V alternating under the second dimension: [num_blocks, d1, 2, d2, head_dim]."""
    kl, vl = to_layout(k, layout), to_layout(v, layout)
    n, d1, d2, d = kl.shape
    kv = _nan_buffer((n, d1, 2, d2, d), kl.dtype)
    kv[:, :, 0], kv[:, :, 1] = kl, vl
    return kv[:, :, 0], kv[:, :, 1], [(kv, [kv[:, :, 0], kv[:, :, 1]])]


def padded(k, v, layout):
    """Each cache a slice of a larger pool: spare blocks, kv heads and slots around it, and
    rows 16 elements wider than head_dim (the cache 8 elements into each)."""
    views, bufs = [], []
    for x in (k, v):
        xl = to_layout(x, layout)
        n, d1, d2, d = xl.shape
        pool = _nan_buffer((n + 3, d1 + 1, d2 + 2, d + 16), xl.dtype)
        view = pool[2: 2 + n, 1: 1 + d1, 1: 1 + d2, 8: 8 + d]
        view[...] = xl
        views.append(view)
        bufs.append((pool, [view]))
    return views[0], views[1], bufs


STORAGES: Dict[str, Callable] = {"dense": dense, "combined": combined,
                                 "interleaved": interleaved, "padded": padded}
LAYOUTS = ("HND", "NHD")
STORED = [(layout, storage) for layout in LAYOUTS for storage in STORAGES
          if (layout, storage) != ("HND", "dense")]
STORED_IDS = ["%s-%s" % s for s in STORED]


def store_caches(c, layout: str, storage: str):
    """(k view, v view, [(buffer behind them, mask of the elements the views cover)])."""
    k, v, bufs = STORAGES[storage](c.k, c.v, layout)
    assert k.shape == v.shape == to_layout(c.k, layout).shape
    assert k.strides == v.strides
    if storage != "dense":
        assert not k.flags.c_contiguous
    return k, v, [(buf, _covered(buf, views)) for buf, views in bufs]


def assert_only_rows_changed(covered, before) -> None:
    for (buf, mask), old in zip(covered, before):
        changed = buf.view(np.uint8).reshape(buf.shape + (-1,)) != \
            old.view(np.uint8).reshape(old.shape + (-1,))
        assert not changed[~mask].any(), "written outside the cache rows"


# ----------------------------------------------------------------------------------------------
# decode (NumPy)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,storage", STORED, ids=STORED_IDS)
def test_decode_gives_the_dense_hnd_bits(dtype, layout, storage):
    c = make_case(np.random.default_rng(len(storage) * 7 + len(dtype)), context_lens=LENS,
                  q_dtype=dtype, kv_dtype=dtype)
    want_out, want_lse = pagedattn.decode(*c.args(), return_lse=True)
    k, v, covered = store_caches(c, layout, storage)
    before = [buf.copy() for buf, _ in covered]
    out, lse = pagedattn.decode(arg(c.q, dtype), arg(k, dtype), arg(v, dtype), c.block_table,
                                c.context_lens, return_lse=True, kv_layout=layout)
    assert bits(out) == bits(want_out)
    assert bits(lse) == bits(want_lse)
    ref_out, ref_lse = c.reference()
    check_out(out, dtype, ref_out)
    check_lse(lse, ref_lse)
    for (buf, _), old in zip(covered, before):
        assert buf.tobytes() == old.tobytes()  # inputs are only read


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "H%d-KV%d-D%d-BS%d" % s)
@pytest.mark.parametrize("layout,storage", STORED, ids=STORED_IDS)
def test_decode_shapes(shape, layout, storage):
    heads, kv_heads, dim, bs = shape
    c = make_case(np.random.default_rng(heads * dim + bs), context_lens=LENS, num_heads=heads,
                  num_kv_heads=kv_heads, head_dim=dim, block_size=bs, q_dtype="f16",
                  kv_dtype="bf16")
    want_out, want_lse = pagedattn.decode(*c.args(), return_lse=True)
    k, v, _ = store_caches(c, layout, storage)
    out, lse = pagedattn.decode(c.q, arg(k, "bf16"), arg(v, "bf16"), c.block_table,
                                c.context_lens, return_lse=True, kv_layout=layout)
    assert bits(out) == bits(want_out) and bits(lse) == bits(want_lse)
    check_out(out, "f16", c.reference()[0])


@pytest.mark.parametrize("kv_layout", ["nhd", "Nhd", "hnd", "HND"])
def test_kv_layout_is_case_insensitive(kv_layout):
    c = make_case(np.random.default_rng(11), context_lens=[3, 40])
    want = pagedattn.decode(*c.args())
    k, v = to_layout(c.k, kv_layout.upper()), to_layout(c.v, kv_layout.upper())
    got = pagedattn.decode(c.q, k, v, c.block_table, c.context_lens, kv_layout=kv_layout)
    assert bits(got) == bits(want)


def test_decode_nhd_with_variants_and_query_tokens():
    # The trailing module arguments (variants, q_indptr) and the layout together.
    rng = np.random.default_rng(12)
    c = make_case(rng, context_lens=[40, 0, 17, 300], num_heads=8, num_kv_heads=2)
    counts = [3, 0, 1, 4]
    q_indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    q = rng.standard_normal((int(q_indptr[-1]), 8, 64), dtype=np.float32)
    slopes = (2.0 ** (-np.arange(1, 9))).astype(np.float32)
    sinks = rng.standard_normal(8).astype(np.float32)
    kw = dict(window_left=20, logits_soft_cap=30.0, alibi_slopes=slopes, sinks=sinks,
              q_indptr=q_indptr, return_lse=True)
    want_out, want_lse = pagedattn.decode(q, c.k, c.v, c.block_table, c.context_lens, **kw)
    for storage in ("dense", "combined", "padded"):
        k, v, _ = store_caches(c, "NHD", storage)
        out, lse = pagedattn.decode(q, k, v, c.block_table, c.context_lens, kv_layout="NHD", **kw)
        assert bits(out) == bits(want_out) and bits(lse) == bits(want_lse), storage


def test_size_one_dimensions_take_any_stride():
    # A dimension of size 1 is never stepped over, so its stride means nothing (PyTorch leaves it
    # arbitrary); K and V may differ there.
    c = make_case(np.random.default_rng(13), context_lens=[5, 30], num_heads=4, num_kv_heads=1)
    want = pagedattn.decode(*c.args())
    for layout in LAYOUTS:
        k, v = to_layout(c.k, layout), to_layout(c.v, layout)
        dim = 1 if layout == "HND" else 2  # the kv head dimension, of size 1
        ks, vs = list(k.strides), list(v.strides)
        ks[dim], vs[dim] = 0, 12345 * v.itemsize
        k2 = np.lib.stride_tricks.as_strided(k, k.shape, ks)
        v2 = np.lib.stride_tricks.as_strided(v, v.shape, vs)
        got = pagedattn.decode(c.q, k2, v2, c.block_table, c.context_lens, kv_layout=layout)
        assert bits(got) == bits(want), layout


def test_nhd_with_one_kv_head_is_the_hnd_memory():
    # With one kv head both layouts put the same element at the same address.
    c = make_case(np.random.default_rng(14), context_lens=[5, 30, 64], num_heads=8,
                  num_kv_heads=1)
    want = pagedattn.decode(*c.args())
    k = c.k.reshape(c.k.shape[0], c.k.shape[2], 1, c.k.shape[3])
    v = c.v.reshape(k.shape)
    got = pagedattn.decode(c.q, k, v, c.block_table, c.context_lens, kv_layout="NHD")
    assert bits(got) == bits(want)


@pytest.mark.parametrize("layout,storage", STORED, ids=STORED_IDS)
def test_described_strided_caches_give_the_dlpack_result(layout, storage):
    # PyTorch tensors reach the module as (pointer, dtype, device, shape, strides) tuples: their
    # strides must be read as the DLPack ones are.
    c = make_case(np.random.default_rng(15), context_lens=LENS, q_dtype="f16", kv_dtype="f16")
    want_out, want_lse = pagedattn.decode(*c.args(), return_lse=True)
    k, v, _ = store_caches(c, layout, storage)
    out = empty(c.q.shape, "f16")
    lse = np.full(c.q.shape[:2], np.nan, np.float32)
    _ext.decode(*(described(x) for x in (c.q, k, v, c.block_table, c.context_lens)),
                described(out), described(lse), None, "cpu", 0, None, False, [],
                kv_layout=layout)
    assert bits(out) == bits(want_out) and bits(lse) == bits(want_lse)


def test_workspace_size_takes_the_layout():
    c = make_case(np.random.default_rng(16), context_lens=[5])
    assert pagedattn.workspace_size(c.q, to_layout(c.k, "NHD"), c.block_table,
                                    kv_layout="nhd") == 0
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.workspace_size(c.q, c.k, c.block_table, kv_layout="NDH")
    assert info.value.argument == "kv_layout"


# ----------------------------------------------------------------------------------------------
# write_cache and copy_blocks (NumPy)


def _cache_pair(rng, dtype, num_blocks=7, kv=2, bs=8, d=64):
    shape = (num_blocks, kv, bs, d)
    return (store(rng.standard_normal(shape, dtype=np.float32), dtype),
            store(rng.standard_normal(shape, dtype=np.float32), dtype))


class _Pair:
    """A cache pair as make_case's Case holds one, for store_caches."""

    def __init__(self, k, v):
        self.k, self.v = k, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,storage", STORED, ids=STORED_IDS)
def test_write_cache_agrees_with_hnd_row_by_row(dtype, layout, storage):
    rng = np.random.default_rng(21)
    k0, v0 = _cache_pair(rng, dtype)
    key = rng.standard_normal((6, 2, 64), dtype=np.float32)
    value = rng.standard_normal((6, 2, 64), dtype=np.float32)
    slots = np.array([3, -1, 8 * 5 + 7, 17, 55, 8 * 6], np.int32)  # -1: skipped
    want_k, want_v = k0.copy(), v0.copy()
    pagedattn.write_cache(key, value, slots, arg(want_k, dtype), arg(want_v, dtype))

    k, v, covered = store_caches(_Pair(k0, v0), layout, storage)
    before = [buf.copy() for buf, _ in covered]
    pagedattn.write_cache(key, value, slots, arg(k, dtype), arg(v, dtype), kv_layout=layout)
    assert bits(as_hnd(k, layout)) == bits(want_k)
    assert bits(as_hnd(v, layout)) == bits(want_v)
    assert_only_rows_changed(covered, before)
    # Row by row, the values the slots name.
    for i, s in enumerate(slots):
        if s >= 0:
            np.testing.assert_array_equal(load(as_hnd(k, layout)[s // 8, :, s % 8], dtype),
                                          load(store(key[i], dtype), dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,storage", STORED, ids=STORED_IDS)
def test_copy_blocks_agrees_with_hnd_row_by_row(dtype, layout, storage):
    rng = np.random.default_rng(22)
    k0, v0 = _cache_pair(rng, dtype)
    pairs = [(0, 3), (1, 5), (4, 2)]
    want_k, want_v = k0.copy(), v0.copy()
    pagedattn.copy_blocks(arg(want_k, dtype), arg(want_v, dtype), pairs)
    for src, dst in pairs:
        assert bits(want_k[dst]) == bits(k0[src]) and bits(want_v[dst]) == bits(v0[src])

    k, v, covered = store_caches(_Pair(k0, v0), layout, storage)
    before = [buf.copy() for buf, _ in covered]
    pagedattn.copy_blocks(arg(k, dtype), arg(v, dtype), np.array(pairs, np.int64),
                          kv_layout=layout)
    assert bits(as_hnd(k, layout)) == bits(want_k)
    assert bits(as_hnd(v, layout)) == bits(want_v)
    assert_only_rows_changed(covered, before)


def test_serving_round_in_a_combined_nhd_cache():
    # vLLM's cache: one [num_blocks, 2, block_size, num_kv_heads, head_dim] tensor. Write a
    # prompt, copy a block, decode: every step agrees with the same steps on a dense HND pair.
    rng = np.random.default_rng(23)
    num_blocks, bs, kv, d = 9, 4, 2, 64
    kv_cache = np.zeros((num_blocks, 2, bs, kv, d), np.float32)
    k_hnd = np.zeros((num_blocks, kv, bs, d), np.float32)
    v_hnd = np.zeros_like(k_hnd)
    bm = pagedattn.BlockManager(num_blocks, bs)
    slots = bm.add_sequence(0, 10)
    key = rng.standard_normal((10, kv, d), dtype=np.float32)
    value = rng.standard_normal((10, kv, d), dtype=np.float32)
    pagedattn.write_cache(key, value, slots, kv_cache[:, 0], kv_cache[:, 1], kv_layout="NHD")
    pagedattn.write_cache(key, value, slots, k_hnd, v_hnd)
    bm.fork(0, 1)
    slot, copy = bm.append_token(1)
    assert copy is not None
    pagedattn.copy_blocks(kv_cache[:, 0], kv_cache[:, 1], [copy], kv_layout="NHD")
    pagedattn.copy_blocks(k_hnd, v_hnd, [copy])
    new_k = rng.standard_normal((1, kv, d), dtype=np.float32)
    new_v = rng.standard_normal((1, kv, d), dtype=np.float32)
    one = np.array([slot], np.int32)
    pagedattn.write_cache(new_k, new_v, one, kv_cache[:, 0], kv_cache[:, 1], kv_layout="NHD")
    pagedattn.write_cache(new_k, new_v, one, k_hnd, v_hnd)
    assert bits(kv_cache[:, 0].transpose(0, 2, 1, 3)) == bits(k_hnd)
    assert bits(kv_cache[:, 1].transpose(0, 2, 1, 3)) == bits(v_hnd)
    table, lens = bm.tables([0, 1])
    q = rng.standard_normal((2, 8, d), dtype=np.float32)
    want_out, want_lse = pagedattn.decode(q, k_hnd, v_hnd, table, lens, return_lse=True)
    out, lse = pagedattn.decode(q, kv_cache[:, 0], kv_cache[:, 1], table, lens, return_lse=True,
                                kv_layout="NHD")
    assert bits(out) == bits(want_out) and bits(lse) == bits(want_lse)


# ----------------------------------------------------------------------------------------------
# Errors: named, and nothing written


@pytest.fixture
def case():
    return make_case(np.random.default_rng(31), context_lens=[5, 40, 0], poison=False)


def _refused(c, k, v, argument, **kw):
    out = np.full(c.q.shape, np.nan, np.float32)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(c.q, k, v, c.block_table, c.context_lens, out=out, **kw)
    assert info.value.argument == argument, str(info.value)
    assert info.value.code == "invalid_argument"
    assert isinstance(info.value, ValueError)
    assert np.isnan(out).all()  # nothing written
    return info.value


@pytest.mark.parametrize("bad", ["XYZ", "", "HN D", "nhd ", "BHND", None, 1, b"NHD", ("NHD",)])
def test_bad_kv_layout(case, bad):
    e = _refused(case, case.k, case.v, "kv_layout", kv_layout=bad)
    assert str(e).startswith("pagedattn: kv_layout = ") and "'HND'" in str(e)
    key = np.ones((1, 2, 64), np.float32)
    k, v = case.k.copy(), case.v.copy()
    for call in (lambda: pagedattn.write_cache(key, key, np.zeros(1, np.int32), k, v,
                                               kv_layout=bad),
                 lambda: pagedattn.copy_blocks(k, v, [(0, 1)], kv_layout=bad),
                 lambda: pagedattn.workspace_size(case.q, k, case.block_table, kv_layout=bad)):
        with pytest.raises(pagedattn.Error) as info:
            call()
        assert info.value.argument == "kv_layout"
    assert bits(k) == bits(case.k) and bits(v) == bits(case.v)


def test_the_module_checks_kv_layout_too(case):
    out = np.zeros_like(case.q)
    with pytest.raises(pagedattn.Error) as info:
        _ext.decode(case.q, case.k, case.v, case.block_table, case.context_lens, out, None, None,
                    "cpu", 0, None, False, [], kv_layout="HDN")
    assert info.value.argument == "kv_layout" and not out.any()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mismatched_kv_strides(case, layout):
    k = to_layout(case.k, layout)
    v_k, v_v, _ = padded(case.k, case.v, layout)  # the right shape, other strides
    e = _refused(case, k, v_v, "v_cache", kv_layout=layout)
    assert "must equal k_cache.strides" in str(e)
    _refused(case, v_k, to_layout(case.v, layout), "v_cache", kv_layout=layout)
    # The caches of write_cache and copy_blocks are refused alike, before anything is written.
    k2, v2 = k.copy(), v_v
    v_before = v_v.copy()
    key = np.ones((1, 2, 64), np.float32)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.write_cache(key, key, np.zeros(1, np.int32), k2, v2, kv_layout=layout)
    assert info.value.argument == "v_cache"
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.copy_blocks(k2, v2, [(0, 1)], kv_layout=layout)
    assert info.value.argument == "v_cache"
    assert bits(k2) == bits(k) and bits(v2) == bits(v_before)


@pytest.mark.parametrize("which", ["k_cache", "v_cache"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_unit_last_stride(case, which, layout):
    def spread(x):  # the same values, every other element of a twice-as-wide buffer
        return np.repeat(to_layout(x, layout), 2, axis=3)[..., ::2]
    k = spread(case.k) if which == "k_cache" else to_layout(case.k, layout)
    v = spread(case.v) if which == "v_cache" else to_layout(case.v, layout)
    e = _refused(case, k, v, which, kv_layout=layout)
    assert "head_dim" in str(e) and "stride 1" in str(e)
    k2, v2 = k.copy() if which == "v_cache" else k, v.copy() if which == "k_cache" else v
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.copy_blocks(k2, v2, [(0, 1)], kv_layout=layout)
    assert info.value.argument == which


@pytest.mark.parametrize("name,make", [
    ("blocks reversed", lambda x: x[::-1]),
    ("broadcast blocks", lambda x: np.broadcast_to(x[:1], x.shape)),
    ("slots overlap", lambda x: np.lib.stride_tricks.as_strided(
        x, x.shape, (x.strides[0], x.strides[1], x.strides[3] * 32, x.strides[3]))),
    ("heads on top of blocks", lambda x: np.lib.stride_tricks.as_strided(
        x, x.shape, (x.strides[0], x.strides[0], x.strides[2], x.strides[3]))),
])
def test_overlapping_or_negative_strides(case, name, make):
    k, v = make(case.k), make(case.v)
    e = _refused(case, k, v, "k_cache")
    assert "k_cache.strides" in str(e), name


def test_nhd_shape_errors_name_the_layout(case):
    # An HND tensor passed as NHD: block_size and num_kv_heads trade places, so the shapes of the
    # other tensors no longer fit, and the message says what was expected.
    key = np.ones((1, 2, 64), np.float32)
    k, v = np.zeros((4, 2, 8, 64), np.float32), np.zeros((4, 2, 8, 64), np.float32)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.write_cache(key, key, np.zeros(1, np.int32), k, v, kv_layout="NHD")
    assert info.value.argument == "key" and "k_cache.shape[2]" in str(info.value)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(case.q, case.k[0], case.v[0], case.block_table, case.context_lens,
                         kv_layout="NHD")
    assert info.value.argument == "k_cache" and "NHD" in str(info.value)


# ----------------------------------------------------------------------------------------------
# PyTorch


def _torch_bits(t) -> bytes:
    return t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()


def _torch_layouts(k, v):
    """(name, kv_layout, k view, v view) of the same cache pair in the layouts of the engines:
    dense NHD, vLLM's combined [num_blocks, 2, block_size, kv_heads, D], FlashInfer's
    [num_blocks, 2, kv_heads, block_size, D] HND, and a slice of a padded pool."""
    n, kv, bs, d = k.shape
    nhd_k, nhd_v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    vllm = torch.full((n, 2, bs, kv, d), float("nan"), dtype=k.dtype, device=k.device)
    vllm[:, 0], vllm[:, 1] = nhd_k, nhd_v
    fi = torch.full((n, 2, kv, bs, d), float("nan"), dtype=k.dtype, device=k.device)
    fi[:, 0], fi[:, 1] = k, v
    pool = torch.full((2, n + 2, bs, kv + 1, d + 16), float("nan"), dtype=k.dtype,
                      device=k.device)
    pk, pv = pool[0, 1: 1 + n, :, 1:, 8: 8 + d], pool[1, 1: 1 + n, :, 1:, 8: 8 + d]
    pk.copy_(nhd_k)
    pv.copy_(nhd_v)
    return [("NHD", "NHD", nhd_k, nhd_v), ("vllm", "NHD", vllm[:, 0], vllm[:, 1]),
            ("flashinfer", "HND", fi[:, 0], fi[:, 1]), ("padded", "NHD", pk, pv)]


def _check_torch_decode(dtype: str, device: str):
    c = make_case(np.random.default_rng(41), context_lens=LENS + [1000], num_heads=16,
                  num_kv_heads=4, head_dim=128, q_dtype=dtype, kv_dtype=dtype)
    q, k, v = (to_torch(x, dtype, device) for x in (c.q, c.k, c.v))
    table = torch.from_numpy(c.block_table).to(device)
    lens = torch.from_numpy(c.context_lens).to(device)
    want_out, want_lse = pagedattn.decode(q, k, v, table, lens, return_lse=True)
    for name, layout, kk, vv in _torch_layouts(k, v):
        out, lse = pagedattn.decode(q, kk, vv, table, lens, return_lse=True, kv_layout=layout)
        if q.is_cuda:
            torch.cuda.synchronize()
        assert _torch_bits(out) == _torch_bits(want_out), name
        assert _torch_bits(lse) == _torch_bits(want_lse), name
    ref_out, ref_lse = c.reference()
    out_np = want_out.cpu()
    out_np = (out_np.view(torch.int16).numpy().view(np.uint16) if dtype == "bf16"
              else out_np.numpy())
    check_out(out_np, dtype, ref_out)
    check_lse(want_lse.cpu().numpy(), ref_lse)


def _check_torch_cache_ops(device: str):
    rng = np.random.default_rng(42)
    k0 = torch.from_numpy(rng.standard_normal((6, 2, 8, 64), dtype=np.float32)).to(device)
    v0 = torch.from_numpy(rng.standard_normal((6, 2, 8, 64), dtype=np.float32)).to(device)
    k0, v0 = k0.to(torch.bfloat16), v0.to(torch.bfloat16)
    key = torch.from_numpy(rng.standard_normal((4, 2, 64), dtype=np.float32)).to(device)
    value = torch.from_numpy(rng.standard_normal((4, 2, 64), dtype=np.float32)).to(device)
    slots = torch.tensor([3, -1, 45, 17], dtype=torch.int32, device=device)
    pairs = [(0, 4), (2, 5)]
    want_k, want_v = k0.clone(), v0.clone()
    pagedattn.write_cache(key, value, slots, want_k, want_v)
    pagedattn.copy_blocks(want_k, want_v, pairs)
    for name, layout, kk, vv in _torch_layouts(k0.clone(), v0.clone()):
        pagedattn.write_cache(key, value, slots, kk, vv, kv_layout=layout)
        pagedattn.copy_blocks(kk, vv, pairs, kv_layout=layout)
        back_k = kk.transpose(1, 2) if layout == "NHD" else kk
        back_v = vv.transpose(1, 2) if layout == "NHD" else vv
        assert _torch_bits(back_k) == _torch_bits(want_k), name
        assert _torch_bits(back_v) == _torch_bits(want_v), name


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_cpu_layouts_give_the_dense_bits(dtype):
    _check_torch_decode(dtype, "cpu")


@needs_torch
def test_torch_cpu_cache_ops_in_every_layout():
    _check_torch_cache_ops("cpu")


@needs_torch
def test_torch_cpu_errors():
    k = torch.zeros(4, 8, 2, 64)
    q = torch.zeros(2, 8, 64)
    table = torch.zeros(2, 1, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    kv = torch.zeros(4, 2, 8, 2, 64)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, k, kv[:, 1], table, lens, kv_layout="NHD")
    assert info.value.argument == "v_cache"
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, torch.zeros(4, 8, 2, 128)[..., ::2], k, table, lens, kv_layout="NHD")
    assert info.value.argument == "k_cache"
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, k, k, table, lens, kv_layout="vllm")
    assert info.value.argument == "kv_layout"


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_layouts_give_the_dense_bits(dtype):
    _check_torch_decode(dtype, "cuda")


@needs_cuda
def test_cuda_cache_ops_in_every_layout():
    _check_torch_cache_ops("cuda")


@needs_cuda
def test_cuda_refuses_strides_off_16_bytes():
    # A pool whose rows are head_dim + 4 bf16 elements apart: 8 bytes past a 16-byte multiple.
    q = torch.zeros(2, 8, 64, dtype=torch.bfloat16, device="cuda")
    pool = torch.zeros(4, 8, 2, 68, dtype=torch.bfloat16, device="cuda")
    k = pool[..., :64]
    table = torch.zeros(2, 1, dtype=torch.int32, device="cuda")
    lens = torch.ones(2, dtype=torch.int32, device="cuda")
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, k, k, table, lens, kv_layout="NHD")
    assert info.value.argument.startswith("kv_strides."), str(info.value)
    assert "16 bytes" in str(info.value)
