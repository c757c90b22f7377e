"""q and out whose sequences lie further apart than num_heads * head_dim elements: q as the query
part of a fused QKV projection, out as a slice of a wider buffer. Each sequence's heads stay
contiguous (strides (S, head_dim, 1), S >= num_heads * head_dim). The strided call must give the
dense call's bits, read nothing of q's buffer but the query rows (the K and V parts hold NaN) and
write nothing of out's buffer but the out rows (the rest holds a sentinel). NumPy always;
PyTorch on the CPU where it is installed, on CUDA where a GPU is present."""

from __future__ import annotations

import numpy as np
import pytest

import pagedattn
from pagedattn import _ext
from _cases import DTYPES, arg, empty, make_case, needs_cuda, needs_torch, to_torch, torch

SENTINEL = 0xA5  # the byte out's buffer holds between the rows
# (num_heads, num_kv_heads, head_dim)
SHAPES = [(8, 2, 64), (4, 4, 128), (16, 1, 80)]
LENS = [0, 1, 17, 300, 33]


def fused_qkv(q: np.ndarray, num_kv_heads: int) -> np.ndarray:
    """A [batch, (H + 2 KV) * D] buffer whose first H * D elements of each row hold q; the K and
    V parts hold NaN (all-ones bits), which the call must never read."""
    batch, heads, dim = q.shape
    qkv = np.empty((batch, (heads + 2 * num_kv_heads) * dim), dtype=q.dtype)
    qkv.view(np.uint8)[...] = 0xFF
    qkv[:, : heads * dim] = q.reshape(batch, -1)
    return qkv


def query_view(qkv: np.ndarray, shape) -> np.ndarray:
    batch, heads, dim = shape
    q = qkv[:, : heads * dim].reshape(batch, heads, dim)
    assert np.shares_memory(q, qkv) and q.strides[0] == qkv.strides[0]  # a view, not a copy
    return q


def wide_out(shape, dtype: str, before: int, after: int):
    """out's buffer, [batch, before + H * D + after] of the sentinel byte, and the out view of
    its middle columns."""
    batch, heads, dim = shape
    buf = empty((batch, before + heads * dim + after), dtype)
    buf.view(np.uint8)[...] = SENTINEL
    view = buf[:, before: before + heads * dim].reshape(batch, heads, dim)
    assert np.shares_memory(view, buf)
    return buf, view


def assert_only_rows_written(buf: np.ndarray, before: int, row: int) -> None:
    outside = np.concatenate([buf[:, :before], buf[:, before + row:]], axis=1)
    assert (outside.view(np.uint8) == SENTINEL).all(), "out's buffer written between the rows"


def bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


# ----------------------------------------------------------------------------------------------
# NumPy


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "H%d-KV%d-D%d" % s)
def test_numpy_strided_q_and_out_give_the_dense_bits(dtype, shape):
    heads, kv_heads, dim = shape
    c = make_case(np.random.default_rng(heads * dim), context_lens=LENS, num_heads=heads,
                  num_kv_heads=kv_heads, head_dim=dim, q_dtype=dtype, kv_dtype=dtype)
    want_out, want_lse = pagedattn.decode(*c.args(), return_lse=True, backend="cpu")

    q = query_view(fused_qkv(c.q, kv_heads), c.q.shape)
    buf, out = wide_out(c.q.shape, dtype, before=24, after=40)
    lse = np.full(c.q.shape[:2], np.nan, np.float32)
    got = pagedattn.decode(arg(q, dtype), *c.args()[1:], out=arg(out, dtype), lse=lse)
    assert got is out
    assert bits(out) == bits(want_out)
    assert bits(lse) == bits(want_lse)
    assert_only_rows_written(buf, 24, heads * dim)


def test_numpy_strided_q_with_out_allocated():
    c = make_case(np.random.default_rng(1), context_lens=LENS, q_dtype="f16", kv_dtype="f16")
    want = pagedattn.decode(*c.args())
    q = query_view(fused_qkv(c.q, 2), c.q.shape)
    got = pagedattn.decode(q, *c.args()[1:])
    assert got.flags.c_contiguous and got.shape == c.q.shape  # allocated dense
    assert bits(got) == bits(want)


def test_numpy_ml_dtypes_bfloat16_strided():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    c = make_case(np.random.default_rng(2), context_lens=LENS, q_dtype="bf16", kv_dtype="bf16")
    want = pagedattn.decode(*c.args())
    q = query_view(fused_qkv(c.q, 2), c.q.shape).view(ml_dtypes.bfloat16)
    buf, out = wide_out(c.q.shape, "bf16", before=0, after=8)
    pagedattn.decode(q, *c.args()[1:], out=out.view(ml_dtypes.bfloat16))
    assert bits(out) == bits(want)
    assert_only_rows_written(buf, 0, c.q.shape[1] * c.q.shape[2])


def test_numpy_one_sequence_ignores_its_stride():
    # With one sequence the stride between sequences means nothing, whatever it says.
    c = make_case(np.random.default_rng(3), context_lens=[70])
    want = pagedattn.decode(*c.args())
    q = np.lib.stride_tricks.as_strided(c.q, shape=c.q.shape,
                                        strides=(4, c.q.strides[1], c.q.strides[2]))
    assert bits(pagedattn.decode(q, *c.args()[1:])) == bits(want)


def _described(a: np.ndarray):
    code, size = {np.dtype(np.float32): (2, 32), np.dtype(np.float16): (2, 16),
                  np.dtype(np.int32): (0, 32)}[a.dtype]
    return (a.ctypes.data, code, size, 1, 0, tuple(a.shape),
            tuple(s // a.itemsize for s in a.strides))


def test_described_strided_tensors_give_the_dlpack_result():
    # PyTorch tensors reach the module as (pointer, dtype, device, shape, strides) tuples; the
    # strides in them must be read as the DLPack ones are.
    c = make_case(np.random.default_rng(4), context_lens=LENS)
    want_out, want_lse = pagedattn.decode(*c.args(), return_lse=True)
    q = query_view(fused_qkv(c.q, 2), c.q.shape)
    buf, out = wide_out(c.q.shape, "f32", before=8, after=0)
    lse = np.full(c.q.shape[:2], np.nan, np.float32)
    _ext.decode(*(_described(x) for x in (q, c.k, c.v, c.block_table, c.context_lens)),
                _described(out), _described(lse), None, "cpu", 0, None, False, [])
    assert bits(out) == bits(want_out) and bits(lse) == bits(want_lse)
    assert_only_rows_written(buf, 8, c.q.shape[1] * c.q.shape[2])


# ----------------------------------------------------------------------------------------------
# NumPy errors: every other layout is refused, naming the argument, with nothing written.


def _refused(c, q=None, out=None):
    q = c.q if q is None else q
    out = empty(c.q.shape, "f32") if out is None else out
    lse = np.full(c.q.shape[:2], np.nan, np.float32)
    before = bits(out), bits(lse)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, *c.args()[1:], out=out, lse=lse)
    assert (bits(out), bits(lse)) == before  # nothing written
    assert info.value.code == "invalid_argument"
    return info.value


def _overlapping(a: np.ndarray, rows_apart: int) -> np.ndarray:
    """a's elements viewed with sequences rows_apart elements apart (heads contiguous)."""
    return np.lib.stride_tricks.as_strided(
        a, shape=a.shape, strides=(rows_apart * a.itemsize,) + a.strides[1:])


@pytest.fixture
def case():
    return make_case(np.random.default_rng(5), context_lens=[5, 40, 0], poison=False)


@pytest.mark.parametrize("name,layout", [
    ("heads apart", lambda q: np.repeat(q, 2, axis=2)[:, :, :64]),
    ("heads first", lambda q: np.ascontiguousarray(q.transpose(1, 0, 2)).transpose(1, 0, 2)),
    ("element stride 2", lambda q: np.repeat(q, 2, axis=2)[:, :, ::2]),
    ("rows overlap", lambda q: _overlapping(q, 8 * 64 - 64)),
    ("rows one element apart", lambda q: _overlapping(q, 1)),
    ("rows backwards", lambda q: q[::-1]),
    ("broadcast rows", lambda q: np.broadcast_to(q[:1], q.shape)),
])
def test_other_q_layouts_are_refused(case, name, layout):
    q = layout(case.q)
    assert q.shape == case.q.shape
    e = _refused(case, q=q)
    assert e.argument == "q", str(e)
    assert str(e).startswith("pagedattn: q"), str(e)


@pytest.mark.parametrize("name,layout", [
    ("heads apart", lambda o: np.repeat(o, 2, axis=2)[:, :, :64]),
    ("element stride 2", lambda o: np.repeat(o, 2, axis=2)[:, :, ::2]),
    ("rows overlap", lambda o: _overlapping(o, 8 * 64 - 1)),
    ("rows backwards", lambda o: o[::-1]),
])
def test_other_out_layouts_are_refused(case, name, layout):
    out = layout(empty(case.q.shape, "f32"))
    assert out.shape == case.q.shape and out.flags.writeable
    e = _refused(case, out=out)
    assert e.argument == "out", str(e)


def test_overlap_message_says_how_far_apart(case):
    e = _refused(case, q=_overlapping(case.q, 100))
    assert "q.strides = (100, 64, 1)" in str(e) and "at least num_heads * head_dim = 512" in str(e)


def test_lse_stays_dense(case):
    wide = np.full((case.batch, 16), np.nan, np.float32)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(*case.args(), lse=wide[:, :8])
    assert info.value.argument == "lse"


# ----------------------------------------------------------------------------------------------
# PyTorch


def _torch_bits(t) -> bytes:
    t = t.detach().contiguous().cpu()
    return t.view(torch.uint8).numpy().tobytes()


TORCH_SENTINEL = -7.25  # exact in every float dtype


def _torch_case(dtype: str, device: str, shape=(8, 2, 128)):
    heads, kv_heads, dim = shape
    c = make_case(np.random.default_rng(heads + dim), context_lens=LENS + [2000],
                  num_heads=heads, num_kv_heads=kv_heads, head_dim=dim, q_dtype=dtype,
                  kv_dtype=dtype)
    q = to_torch(c.q, dtype, device)
    k = to_torch(c.k, dtype, device)
    v = to_torch(c.v, dtype, device)
    table = torch.from_numpy(c.block_table).to(device)
    lens = torch.from_numpy(c.context_lens).to(device)
    return c, q, k, v, table, lens


def _torch_strided(q, kv_heads: int, before: int, after: int):
    """For q [batch, heads, dim]: (q copied into a fused QKV buffer whose K and V parts hold
    NaN, as a view of it; out's buffer of the sentinel; the out view of its middle columns)."""
    batch, heads, dim = q.shape
    row = heads * dim
    qkv = torch.full((batch, row + 2 * kv_heads * dim), float("nan"), dtype=q.dtype,
                     device=q.device)
    qkv[:, :row] = q.reshape(batch, row)
    q_view = qkv[:, :row].view(batch, heads, dim)
    buf = torch.full((batch, before + row + after), TORCH_SENTINEL, dtype=q.dtype,
                     device=q.device)
    out_view = buf[:, before: before + row].view(batch, heads, dim)
    assert q_view.stride() == (qkv.shape[1], dim, 1)
    assert out_view.stride() == (before + row + after, dim, 1)
    return q_view, buf, out_view


def _check_torch_strided(q, k, v, table, lens, kv_heads: int, before: int, after: int):
    want_out, want_lse = pagedattn.decode(q, k, v, table, lens, return_lse=True)
    q_view, buf, out = _torch_strided(q, kv_heads, before, after)
    lse = torch.full(q.shape[:2], float("nan"), device=q.device)
    got = pagedattn.decode(q_view, k, v, table, lens, out=out, lse=lse)
    assert got is out
    if q.is_cuda:
        torch.cuda.synchronize()
    assert _torch_bits(out) == _torch_bits(want_out)
    assert _torch_bits(lse) == _torch_bits(want_lse)
    row = q.shape[1] * q.shape[2]
    outside = torch.cat([buf[:, :before], buf[:, before + row:]], dim=1)
    assert bool((outside == TORCH_SENTINEL).all()), "out's buffer written between the rows"


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_cpu_strided_q_and_out_give_the_dense_bits(dtype):
    _, q, k, v, table, lens = _torch_case(dtype, "cpu")
    _check_torch_strided(q, k, v, table, lens, 2, before=8, after=56)


@needs_torch
def test_torch_cpu_strided_q_with_out_allocated():
    _, q, k, v, table, lens = _torch_case("bf16", "cpu")
    want = pagedattn.decode(q, k, v, table, lens)
    q_view, _, _ = _torch_strided(q, 2, 0, 0)
    got = pagedattn.decode(q_view, k, v, table, lens)
    assert got.is_contiguous() and _torch_bits(got) == _torch_bits(want)


@needs_torch
def test_torch_cpu_other_layouts_are_refused():
    _, q, k, v, table, lens = _torch_case("f32", "cpu", shape=(8, 2, 64))
    batch, heads, dim = q.shape
    out = torch.full_like(q, float("nan"))
    bad_q = {
        "heads first": q.transpose(0, 1).contiguous().transpose(0, 1),
        "rows overlap": torch.as_strided(q, q.shape, (heads * dim - dim, dim, 1)),
        "broadcast rows": q[:1].expand(batch, heads, dim),
    }
    for name, x in bad_q.items():
        with pytest.raises(pagedattn.Error) as info:
            pagedattn.decode(x, k, v, table, lens, out=out)
        assert info.value.argument == "q", name
    wide = torch.full((batch * heads * dim,), float("nan"))
    for name, x in {"rows overlap": torch.as_strided(wide, q.shape, (heads * dim - 1, dim, 1)),
                    "heads apart": torch.full((batch, heads, 2 * dim), 0.0)[:, :, :dim]}.items():
        with pytest.raises(pagedattn.Error) as info:
            pagedattn.decode(q, k, v, table, lens, out=x)
        assert info.value.argument == "out", name
    assert bool(torch.isnan(out).all()) and bool(torch.isnan(wide).all())  # nothing written


# ----------------------------------------------------------------------------------------------
# CUDA


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8, 2, 128), (16, 1, 80), (4, 4, 64)],
                         ids=lambda s: "H%d-KV%d-D%d" % s)
def test_cuda_strided_q_and_out_give_the_dense_bits(dtype, shape):
    # Out rows num_heads * head_dim + 64 elements apart, starting 8 elements into the buffer,
    # keep every row 16-byte aligned for every dtype, as the CUDA backend requires.
    _, q, k, v, table, lens = _torch_case(dtype, "cuda", shape)
    _check_torch_strided(q, k, v, table, lens, shape[1], before=8, after=56)


@needs_cuda
@pytest.mark.parametrize("field", ["q_row_stride", "out_row_stride"])
def test_cuda_refuses_misaligned_rows(field):
    # q rows must start 16-byte aligned (8 bytes past here), out rows at even elements (one
    # element past here).
    _, q, k, v, table, lens = _torch_case("bf16", "cuda")
    batch, heads, dim = q.shape
    row = heads * dim
    pad = 4 if field == "q_row_stride" else 1
    wider = torch.zeros((batch, row + pad), dtype=q.dtype, device="cuda")
    misaligned = wider[:, :row].view(batch, heads, dim)
    if field == "q_row_stride":
        misaligned.copy_(q)
        q, out = misaligned, torch.full_like(q, float("nan"))
    else:
        wider.fill_(float("nan"))
        out = misaligned
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, k, v, table, lens, out=out)
    torch.cuda.synchronize()
    assert info.value.argument == field
    assert ("16-byte" if field == "q_row_stride" else "even") in str(info.value)
    assert bool(torch.isnan(out).all())  # nothing written
