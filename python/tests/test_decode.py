"""decode() on the CPU against the float64 reference (NumPy only)."""

import zlib

import numpy as np
import pytest

import pagedattn
from _cases import (DTYPES, arg, check_lse, check_out, empty, f32_to_bf16_bits, lens_for, load,
                    make_case, reference_decode, store)

# (num_heads, num_kv_heads, head_dim, block_size): MHA, GQA groups 2-8, MQA, a 64-head group,
# head dim 512.
SHAPES = [
    (4, 4, 64, 16),
    (8, 2, 128, 7),
    (8, 1, 80, 1),
    (16, 2, 96, 32),
    (6, 3, 112, 5),
    (64, 1, 64, 16),
    (4, 2, 192, 3),
    (2, 1, 256, 64),
    (8, 2, 512, 16),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "H%d-KV%d-D%d-BS%d" % s)
def test_matches_reference(dtype, shape):
    num_heads, num_kv_heads, head_dim, block_size = shape
    rng = np.random.default_rng(zlib.crc32(repr((dtype,) + shape).encode()))
    c = make_case(rng, context_lens=lens_for(block_size), num_heads=num_heads,
                  num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
                  q_dtype=dtype, kv_dtype=dtype)
    out, lse = pagedattn.decode(*c.args(), return_lse=True)
    want_out, want_lse = c.reference()
    assert out.shape == c.q.shape and out.dtype == c.q.dtype  # allocated like q
    assert lse.shape == c.q.shape[:2] and lse.dtype == np.float32
    check_out(out, dtype, want_out)
    check_lse(lse, want_lse)


@pytest.mark.parametrize("q_dtype,kv_dtype,out_dtype",
                         [("f32", "bf16", "f16"), ("bf16", "f16", "f32"), ("f16", "f32", "bf16")])
def test_mixed_dtypes(q_dtype, kv_dtype, out_dtype):
    rng = np.random.default_rng(7)
    c = make_case(rng, context_lens=[5, 33, 0, 17], q_dtype=q_dtype, kv_dtype=kv_dtype)
    out = empty(c.q.shape, out_dtype)
    got = pagedattn.decode(*c.args(), out=arg(out, out_dtype))
    assert got is out
    check_out(out, out_dtype, c.reference()[0])


def test_writes_given_outputs_in_place():
    rng = np.random.default_rng(1)
    c = make_case(rng, context_lens=[3, 40])
    out = empty(c.q.shape, "f32")
    lse = np.full(c.q.shape[:2], np.nan, dtype=np.float32)
    got_out, got_lse = pagedattn.decode(*c.args(), out=out, lse=lse, return_lse=True)
    assert got_out is out and got_lse is lse
    want_out, want_lse = c.reference()
    check_out(out, "f32", want_out)
    check_lse(lse, want_lse)
    # lse without return_lse is still written; only out comes back.
    lse[...] = np.nan
    assert pagedattn.decode(*c.args(), out=out, lse=lse) is out
    check_lse(lse, want_lse)


def test_custom_scale():
    rng = np.random.default_rng(2)
    c = make_case(rng, context_lens=[20, 70])
    out, lse = pagedattn.decode(*c.args(), scale=0.3, return_lse=True)
    want_out, want_lse = c.reference(scale=0.3)
    check_out(out, "f32", want_out)
    check_lse(lse, want_lse)


def test_context_zero_gives_zero_and_minus_inf():
    rng = np.random.default_rng(3)
    c = make_case(rng, context_lens=[0, 0, 0])
    out = empty(c.q.shape, "f32")
    lse = np.zeros(c.q.shape[:2], dtype=np.float32)
    pagedattn.decode(*c.args(), out=out, lse=lse)
    assert np.all(out == 0)
    assert np.all(np.isneginf(lse))


def test_batch_zero_is_a_no_op():
    q = np.zeros((0, 4, 64), np.float32)
    k = np.zeros((3, 2, 16, 64), np.float32)
    out = pagedattn.decode(q, k, k, np.zeros((0, 1), np.int32), np.zeros((0,), np.int32))
    assert out.shape == (0, 4, 64)
    # A wider empty table (NumPy 2 gives it zero strides, which say nothing about its rows).
    out = pagedattn.decode(q, k, k, np.zeros((0, 5), np.int32), np.zeros((0,), np.int32))
    assert out.shape == (0, 4, 64)


def test_table_rows_any_stride_apart():
    # A table that is a column slice of a wider array: rows are not adjacent, used in place.
    rng = np.random.default_rng(4)
    c = make_case(rng, context_lens=[40, 9, 100])
    wide = np.full((c.batch, c.block_table.shape[1] + 5), 77777, dtype=np.int32)
    wide[:, : c.block_table.shape[1]] = c.block_table
    table = wide[:, : c.block_table.shape[1]]
    assert not table.flags.c_contiguous
    out = pagedattn.decode(arg(c.q, "f32"), c.k, c.v, table, c.context_lens)
    check_out(out, "f32", c.reference()[0])


def test_read_only_inputs():
    rng = np.random.default_rng(5)
    c = make_case(rng, context_lens=[12, 50])
    for a in (c.q, c.k, c.v, c.block_table, c.context_lens):
        a.setflags(write=False)
    check_out(pagedattn.decode(*c.args()), "f32", c.reference()[0])


def test_long_context_with_many_splits():
    rng = np.random.default_rng(6)
    c = make_case(rng, context_lens=[4000, 3, 1500], num_heads=4, num_kv_heads=4,
                  block_size=16, q_dtype="bf16", kv_dtype="bf16")
    out, lse = pagedattn.decode(*c.args(), return_lse=True)
    want_out, want_lse = c.reference()
    check_out(out, "bf16", want_out)
    check_lse(lse, want_lse)


def test_ml_dtypes_bfloat16_arrays():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(8)
    c = make_case(rng, context_lens=[9, 31], q_dtype="bf16", kv_dtype="bf16")
    q = c.q.view(ml_dtypes.bfloat16)
    k = c.k.view(ml_dtypes.bfloat16)
    v = c.v.view(ml_dtypes.bfloat16)
    out = pagedattn.decode(q, k, v, c.block_table, c.context_lens)
    assert out.dtype == ml_dtypes.bfloat16
    check_out(out.view(np.uint16), "bf16", c.reference()[0])


def test_bf16_conversion_helper_matches_round_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5e-3, np.inf, -np.inf], np.float32)
    bits = f32_to_bf16_bits(x)
    assert bits.tolist() == [0x3F80, 0x3F80, 0x3F82, 0xBB24, 0x7F80, 0xFF80]
    assert np.isnan(load(f32_to_bf16_bits(np.array([np.nan], np.float32)), "bf16")).all()


def test_reference_agrees_with_dense_attention():
    # The test oracle itself: a dense softmax over a contiguous cache.
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 2, 64))
    keys = rng.standard_normal((10, 64))
    vals = rng.standard_normal((10, 64))
    k = keys.reshape(5, 1, 2, 64)
    v = vals.reshape(5, 1, 2, 64)
    out, lse = reference_decode(q, k, v, np.arange(5, dtype=np.int32)[None], [10])
    s = keys @ q[0].T / 8.0
    p = np.exp(s - s.max(0))
    np.testing.assert_allclose(out[0], (p / p.sum(0)).T @ vals, rtol=1e-12)
    np.testing.assert_allclose(lse[0], np.log(np.exp(s).sum(0)), rtol=1e-12)


def test_workspace_size_is_zero_on_cpu():
    rng = np.random.default_rng(10)
    c = make_case(rng, context_lens=[5])
    assert pagedattn.workspace_size(c.q, c.k, c.block_table) == 0


def test_gil_is_released():
    # Two threads decoding at once both finish with correct results.
    import threading

    rng = np.random.default_rng(11)
    cases = [make_case(rng, context_lens=[2000, 1000]) for _ in range(2)]
    outs = [None, None]

    def run(i):
        outs[i] = pagedattn.decode(*cases[i].args())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c, out in zip(cases, outs):
        check_out(out, "f32", c.reference()[0])


def test_store_round_trip():
    x = np.linspace(-3, 3, 11, dtype=np.float32)
    for d in DTYPES:
        np.testing.assert_allclose(load(store(x, d), d), x, rtol=1e-2)
