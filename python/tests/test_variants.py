"""The attention variants of decode() (window_left, logits_soft_cap, alibi_slopes, sinks) against
the float64 reference of _cases.py: NumPy on the CPU always, PyTorch's paths where it is
installed, CUDA where a GPU is present; and the errors for bad variant arguments."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import pagedattn
from pagedattn import _ext

from _cases import (alibi_slopes, arg, case_tensors, check_lse, check_out, check_rejected,
                    described, empty, from_torch, load, make_case, needs_cuda, needs_torch,
                    random_sinks, reference_decode, refused_decode, rejection, rejection_case,
                    store, torch, variant_kwargs)


def first_attended(n: int, window_left: int) -> int:
    return max(n - 1 - window_left, 0) if window_left >= 0 else 0


def slide_out(c, window_left: int) -> None:
    """Makes everything before each sequence's window unreadable, as an engine that frees the
    blocks that slid out of the window would: their table entries become -1 or garbage and their
    keys and values NaN, and so do the slots of the first attended block before the window."""
    nan_row = store(np.full(c.k.shape[-1], np.nan, np.float32), c.kv_dtype)
    for b, n in enumerate(c.context_lens):
        first = first_attended(int(n), window_left)
        for t in range(first):
            blk = c.block_table[b, t // c.block_size]
            if blk >= 0:
                c.k[blk, :, t % c.block_size] = nan_row
                c.v[blk, :, t % c.block_size] = nan_row
        for i in range(first // c.block_size):
            c.block_table[b, i] = -1 if i % 2 == 0 else 10**6


def decode_and_check(c, out_dtype=None, **variants):
    out_dtype = out_dtype or c.q_dtype
    out, lse = pagedattn.decode(*c.args(), out=arg(empty(c.q.shape, out_dtype), out_dtype),
                                return_lse=True, **variants)
    want_out, want_lse = c.reference(**variants)
    check_out(out, out_dtype, want_out)
    check_lse(lse, want_lse)
    return out, lse


# ----------------------------------------------------------------------------------------------
# The oracle


def test_reference_variants_agree_with_dense_formulas():
    # The test oracle itself, against the definitions written out token by token.
    rng = np.random.default_rng(0)
    n, d, heads = 11, 64, 2
    q = rng.standard_normal((1, heads, d))
    keys = rng.standard_normal((n, d))
    vals = rng.standard_normal((n, d))
    k = keys.reshape(n, 1, 1, d)
    v = vals.reshape(n, 1, 1, d)
    table = np.arange(n, dtype=np.int32)[None]
    slopes, sinks, cap, window = [0.25, 0.5], [1.5, -0.5], 2.0, 4
    out, lse = reference_decode(q, k, v, table, [n], 1.0, window_left=window,
                                logits_soft_cap=cap, alibi_slopes=slopes, sinks=sinks)
    for h in range(heads):
        logits = {}
        for t in range(n - 1 - window, n):
            s = cap * math.tanh(float(keys[t] @ q[0, h]) / cap)
            logits[t] = s + slopes[h] * (t - (n - 1))
        denominator = math.exp(sinks[h]) + sum(math.exp(s) for s in logits.values())
        want = sum(math.exp(s) * vals[t] for t, s in logits.items()) / denominator
        np.testing.assert_allclose(out[0, h], want, rtol=1e-12)
        assert lse[0, h] == pytest.approx(math.log(denominator), rel=1e-12)
    # An empty context: out = 0, lse = the sink.
    out, lse = reference_decode(q, k, v, table, [0], sinks=sinks)
    assert not out.any() and lse[0].tolist() == sinks


# ----------------------------------------------------------------------------------------------
# NumPy on the CPU


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("window_left", [0, 1, 15, 16, 40, 10**6])
def test_window(dtype, window_left):
    rng = np.random.default_rng(zlib.crc32(repr((dtype, window_left)).encode()))
    c = make_case(rng, context_lens=[0, 1, 16, 17, 41, 300], block_size=16, q_dtype=dtype,
                  kv_dtype=dtype)
    slide_out(c, window_left)
    out, _ = decode_and_check(c, window_left=window_left)
    assert np.isfinite(load(out, dtype)).all()  # nothing before a window was read


def test_window_changes_the_result():
    c = make_case(np.random.default_rng(1), context_lens=[200])
    plain = pagedattn.decode(*c.args())
    windowed = pagedattn.decode(*c.args(), window_left=31)
    assert np.abs(plain - windowed).max() > 1e-3


@pytest.mark.parametrize("cap", [0.5, 4.0, 50.0])
def test_soft_cap(cap):
    # scale = 1 makes logits of several units, where the cap bites.
    c = make_case(np.random.default_rng(2), context_lens=[0, 1, 33, 250], num_heads=8,
                  num_kv_heads=8, block_size=8)
    out, lse = pagedattn.decode(*c.args(), scale=1.0, logits_soft_cap=cap, return_lse=True)
    want_out, want_lse = c.reference(scale=1.0, logits_soft_cap=cap)
    check_out(out, "f32", want_out)
    check_lse(lse, want_lse)
    if cap < 10:
        assert np.abs(want_out - c.reference(scale=1.0)[0]).max() > 1e-3


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_alibi(dtype):
    c = make_case(np.random.default_rng(3), context_lens=[0, 1, 7, 8, 9, 500], num_heads=8,
                  num_kv_heads=2, block_size=8, q_dtype=dtype, kv_dtype=dtype)
    decode_and_check(c, alibi_slopes=alibi_slopes(8))
    # Signed and larger slopes: any finite value is a slope.
    decode_and_check(c, alibi_slopes=np.linspace(-0.3, 0.9, 8, dtype=np.float32))


def test_sinks():
    rng = np.random.default_rng(4)
    c = make_case(rng, context_lens=[0, 1, 20, 300], num_heads=8, num_kv_heads=4)
    sinks = random_sinks(rng, 8)
    out, lse = decode_and_check(c, sinks=sinks)
    # The empty context: out = 0 and lse = the sink (-inf for the head without one).
    assert not out[0].any()
    assert np.array_equal(lse[0], sinks)
    # A sink far above the logits takes nearly all the weight.
    out = pagedattn.decode(*c.args(), sinks=np.full(8, 60.0, np.float32))
    assert np.abs(out).max() < 1e-20


def test_all_sinks_minus_inf_is_no_sink():
    c = make_case(np.random.default_rng(5), context_lens=[0, 30])
    plain_out, plain_lse = pagedattn.decode(*c.args(), return_lse=True)
    out, lse = pagedattn.decode(*c.args(), sinks=np.full(8, -np.inf, np.float32),
                                return_lse=True)
    assert np.array_equal(out, plain_out) and np.array_equal(lse, plain_lse)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [(8, 2, 64, 16), (16, 16, 128, 5), (32, 1, 96, 1)],
                         ids=lambda s: "H%d-KV%d-D%d-BS%d" % s)
def test_all_variants_together(dtype, shape):
    num_heads, num_kv_heads, head_dim, block_size = shape
    rng = np.random.default_rng(zlib.crc32(repr((dtype,) + shape).encode()))
    c = make_case(rng, context_lens=[0, 1, block_size, block_size + 1, 77, 1200],
                  num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                  block_size=block_size, q_dtype=dtype, kv_dtype=dtype)
    slide_out(c, 50)
    decode_and_check(c, window_left=50, logits_soft_cap=5.0,
                     alibi_slopes=alibi_slopes(num_heads), sinks=random_sinks(rng, num_heads))


def test_variants_with_a_long_context_and_many_splits():
    rng = np.random.default_rng(6)
    c = make_case(rng, context_lens=[5000, 3, 2000], num_heads=4, num_kv_heads=4,
                  q_dtype="bf16", kv_dtype="bf16")
    decode_and_check(c, window_left=3000, logits_soft_cap=30.0, alibi_slopes=alibi_slopes(4),
                     sinks=random_sinks(rng, 4))


def test_explicit_defaults_are_plain_attention():
    c = make_case(np.random.default_rng(7), context_lens=[0, 9, 60])
    plain_out, plain_lse = pagedattn.decode(*c.args(), return_lse=True)
    for variants in (dict(window_left=-1, logits_soft_cap=0.0, alibi_slopes=None, sinks=None),
                     dict(window_left=np.int64(-1), logits_soft_cap=0)):
        out, lse = pagedattn.decode(*c.args(), return_lse=True, **variants)
        assert np.array_equal(out, plain_out) and np.array_equal(lse, plain_lse)


def test_read_only_variant_tensors_and_numpy_scalars():
    c = make_case(np.random.default_rng(8), context_lens=[12, 50])
    slopes, sinks = alibi_slopes(8), random_sinks(np.random.default_rng(9), 8)
    slopes.setflags(write=False)
    sinks.setflags(write=False)
    out = pagedattn.decode(*c.args(), window_left=np.int32(20), logits_soft_cap=np.float32(8.0),
                           alibi_slopes=slopes, sinks=sinks)
    want, _ = c.reference(window_left=20, logits_soft_cap=8.0, alibi_slopes=slopes, sinks=sinks)
    check_out(out, "f32", want)


# ----------------------------------------------------------------------------------------------
# The described-tensor path (how PyTorch tensors reach the module), with NumPy arrays


def test_described_variant_tensors_give_the_dlpack_result():
    rng = np.random.default_rng(10)
    c = make_case(rng, context_lens=[5, 40, 0, 17])
    q, k, v, table, lens = c.args()
    slopes, sinks = alibi_slopes(8), random_sinks(rng, 8)
    want, want_lse = pagedattn.decode(q, k, v, table, lens, window_left=9, logits_soft_cap=3.0,
                                      alibi_slopes=slopes, sinks=sinks, return_lse=True)
    out = np.full_like(want, np.nan)
    lse = np.full(want.shape[:2], np.nan, dtype=np.float32)
    _ext.decode(*(described(x) for x in (q, k, v, table, lens, out, lse)), None, "cpu", 0, None,
                False, [], 9, 3.0, described(slopes), described(sinks))
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)
    # Described or through DLPack, a bad variant tensor is the same error.
    errors = []
    for bad in (slopes.astype(np.float64), described(slopes.astype(np.float64))):
        with pytest.raises(pagedattn.Error) as info:
            _ext.decode(*(described(x) for x in (q, k, v, table, lens, out)), None, None, "cpu",
                        0, None, False, [], -1, 0.0, bad, None)
        errors.append((info.value.argument, str(info.value)))
    assert errors[0] == errors[1] and errors[0][0] == "alibi_slopes"


# ----------------------------------------------------------------------------------------------
# Errors


@pytest.fixture
def case():
    return make_case(np.random.default_rng(11), context_lens=[5, 40, 0], num_heads=8,
                     num_kv_heads=2, head_dim=64, block_size=16, poison=False)


def refused(case, **variants) -> pagedattn.Error:
    """decode with bad variants: the error, and out and lse untouched."""
    return refused_decode(case.args(), case.q.shape, **variants)


H = 8
GOOD = np.full(H, 0.5, np.float32)


@pytest.mark.parametrize("name,variants,argument,text", [
    ("slopes float64", dict(alibi_slopes=GOOD.astype(np.float64)), "alibi_slopes", "float32"),
    ("slopes float16", dict(alibi_slopes=GOOD.astype(np.float16)), "alibi_slopes", "float32"),
    ("slopes too short", dict(alibi_slopes=GOOD[:4]), "alibi_slopes", "num_heads"),
    ("slopes too long", dict(alibi_slopes=np.zeros(H + 1, np.float32)), "alibi_slopes",
     "num_heads"),
    ("slopes 2-d", dict(alibi_slopes=GOOD.reshape(2, 4)), "alibi_slopes", "[num_heads]"),
    ("slopes strided", dict(alibi_slopes=np.zeros(2 * H, np.float32)[::2]), "alibi_slopes",
     "contiguous"),
    ("slopes a list", dict(alibi_slopes=GOOD.tolist()), "alibi_slopes", "tensor"),
    ("slopes a tuple", dict(alibi_slopes=(0, 2, 32, 1, 0, (H,), (1,))), "alibi_slopes",
     "tensor"),
    ("slopes bf16", dict(alibi_slopes=pagedattn.bf16(np.zeros(H, np.uint16))), "alibi_slopes",
     "float32"),
    ("slope NaN", dict(alibi_slopes=np.where(np.arange(H) == 2, np.nan, GOOD).astype(np.float32)),
     "alibi_slopes[2]", "finite"),
    ("slope inf", dict(alibi_slopes=np.where(np.arange(H) == 7, np.inf, GOOD).astype(np.float32)),
     "alibi_slopes[7]", "finite"),
    ("sinks int32", dict(sinks=np.zeros(H, np.int32)), "sinks", "float32"),
    ("sinks shape", dict(sinks=np.zeros((1, H), np.float32)), "sinks", "[num_heads]"),
    ("sinks length", dict(sinks=np.zeros(3, np.float32)), "sinks", "num_heads"),
    ("sinks a float", dict(sinks=1.0), "sinks", "tensor"),
    ("sink NaN", dict(sinks=np.where(np.arange(H) == 1, np.nan, GOOD).astype(np.float32)),
     "sinks[1]", "NaN"),
    ("sink +inf", dict(sinks=np.where(np.arange(H) == 0, np.inf, GOOD).astype(np.float32)),
     "sinks[0]", "+inf"),
    ("window -2", dict(window_left=-2), "window_left", "-1"),
    ("window a float", dict(window_left=3.0), "window_left", "int"),
    ("window a string", dict(window_left="3"), "window_left", "int"),
    ("window a bool", dict(window_left=True), "window_left", "int"),
    ("window past int32", dict(window_left=2**31), "window_left", "int32"),
    ("cap negative", dict(logits_soft_cap=-1.0), "logits_soft_cap", "at least 0"),
    ("cap NaN", dict(logits_soft_cap=float("nan")), "logits_soft_cap", "finite"),
    ("cap inf", dict(logits_soft_cap=float("inf")), "logits_soft_cap", "finite"),
    ("cap a string", dict(logits_soft_cap="30"), "logits_soft_cap", "number"),
    ("cap None", dict(logits_soft_cap=None), "logits_soft_cap", "number"),
    ("cap below float32", dict(logits_soft_cap=1e-50), "logits_soft_cap", "float32"),
    ("cap above float32", dict(logits_soft_cap=1e39), "logits_soft_cap", "float32"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_bad_variant_arguments(case, name, variants, argument, text):
    e = refused(case, **variants)
    assert e.code == "invalid_argument", str(e)
    assert e.argument == argument, str(e)
    assert text in str(e), str(e)
    assert str(e).startswith(f"pagedattn: {argument}"), str(e)


def test_variant_values_are_checked_with_an_empty_batch():
    q = np.zeros((0, 4, 64), np.float32)
    k = np.zeros((3, 2, 16, 64), np.float32)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, k, k, np.zeros((0, 1), np.int32), np.zeros((0,), np.int32),
                         window_left=-3)
    assert info.value.argument == "window_left"


def test_window_checks_only_the_table_entries_it_reads(case):
    # Entries before the window are never read, so garbage there is fine; inside it, an error.
    table = case.block_table.copy()
    table[1, 0] = 10**6  # tokens 0-15 of context_lens[1] = 40
    pagedattn.decode(case.q, case.k, case.v, table, case.context_lens, window_left=20)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(case.q, case.k, case.v, table, case.context_lens, window_left=30)
    assert info.value.code == "out_of_range" and info.value.argument == "block_table[1][0]"


# ----------------------------------------------------------------------------------------------
# PyTorch on the CPU: the all-PyTorch path, and PyTorch tensors among others


@needs_torch
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_torch_cpu_variants(dtype):
    rng = np.random.default_rng(12)
    c = make_case(rng, context_lens=[0, 1, 17, 300], q_dtype=dtype, kv_dtype=dtype)
    slide_out(c, 40)
    slopes, sinks = alibi_slopes(8), random_sinks(rng, 8)
    variants = dict(window_left=40, logits_soft_cap=6.0)
    want_out, want_lse = c.reference(alibi_slopes=slopes, sinks=sinks, **variants)
    tensors = case_tensors(c)
    # The all-PyTorch path, and a NumPy array among PyTorch tensors (the general path).
    for s, k in ((torch.from_numpy(slopes), torch.from_numpy(sinks)), (slopes, sinks)):
        out, lse = pagedattn.decode(*tensors, alibi_slopes=s, sinks=k, return_lse=True,
                                    **variants)
        check_out(from_torch(out, dtype), dtype, want_out)
        check_lse(lse.numpy(), want_lse)


@needs_torch
def test_torch_cpu_variant_errors():
    tensors, out = rejection_case(13, [5, 40])
    check_rejected(lambda **bad: pagedattn.decode(*tensors, out=out, **bad), out,
                   ((dict(alibi_slopes=torch.ones(8, dtype=torch.float64)), "alibi_slopes"),
                    (dict(sinks=torch.ones(7)), "sinks"),
                    (dict(sinks=torch.ones(16)[::2]), "sinks"),
                    (dict(alibi_slopes=[0.5] * 8), "alibi_slopes"),
                    (dict(window_left=-2), "window_left"),
                    (dict(logits_soft_cap=-1.0), "logits_soft_cap")))


# ----------------------------------------------------------------------------------------------
# CUDA


@needs_cuda
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("variants", ["window", "soft_cap", "alibi", "sinks", "all"])
def test_cuda_variants(dtype, variants):
    rng = np.random.default_rng(zlib.crc32(repr((dtype, variants)).encode()))
    c = make_case(rng, context_lens=[0, 1, 15, 16, 17, 300, 2000], num_heads=16,
                  num_kv_heads=2, head_dim=128, q_dtype=dtype, kv_dtype=dtype)
    chosen = variant_kwargs(variants, rng, 16, window_left=100, scale=0.5, all_window_left=100,
                            all_soft_cap=5.0)
    if "window_left" in chosen:
        slide_out(c, chosen["window_left"])
    q, k, v, table, lens = case_tensors(c, "cuda")
    given = {n: torch.from_numpy(x).cuda() if isinstance(x, np.ndarray) else x
             for n, x in chosen.items()}
    out, lse = pagedattn.decode(q, k, v, table, lens, return_lse=True, **given)
    torch.cuda.synchronize()
    want_out, want_lse = c.reference(**chosen)
    check_out(from_torch(out, dtype), dtype, want_out)
    check_lse(lse.cpu().numpy(), want_lse)


@needs_cuda
def test_cuda_variant_errors():
    (q, k, v, table, lens), out = rejection_case(14, [30, 70], "cuda")

    def err(**kw):
        return rejection(lambda **a: pagedattn.decode(q, k, v, table, lens, out=out, **a), out,
                         **kw)

    e = err(alibi_slopes=torch.ones(8))  # host memory with CUDA tensors
    assert e.argument == "alibi_slopes" and "device" in str(e)
    e = err(sinks=np.zeros(8, np.float32))
    assert e.argument == "sinks" and "device" in str(e)
    e = err(sinks=torch.ones(8, dtype=torch.float16, device="cuda"))
    assert e.argument == "sinks" and "float32" in str(e)
    # Values in device memory are checked with checked=True.
    bad = torch.ones(8, device="cuda")
    bad[3] = float("nan")
    e = err(alibi_slopes=bad, checked=True)
    assert e.argument == "alibi_slopes[3]"
    bad = torch.zeros(8, device="cuda")
    bad[5] = float("inf")
    e = err(sinks=bad, checked=True)
    assert e.argument == "sinks[5]"


@needs_cuda
def test_cuda_graph_replays_new_sinks_and_slopes():
    rng = np.random.default_rng(15)
    c = make_case(rng, context_lens=[50, 400, 3], num_heads=8, num_kv_heads=2, head_dim=128,
                  q_dtype="bf16", kv_dtype="bf16", poison=False)
    q, k, v, table, lens = case_tensors(c, "cuda")
    slopes = torch.from_numpy(alibi_slopes(8)).cuda()
    sinks = torch.from_numpy(random_sinks(rng, 8)).cuda()
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device="cuda")
    ws = torch.empty(pagedattn.workspace_size(q, k, table), dtype=torch.uint8, device="cuda")
    variants = dict(window_left=64, logits_soft_cap=10.0, alibi_slopes=slopes, sinks=sinks)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        pagedattn.decode(q, k, v, table, lens, out=out, lse=lse, workspace=ws, **variants)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pagedattn.decode(q, k, v, table, lens, out=out, lse=lse, workspace=ws, **variants)

    for _ in range(2):
        new_slopes = rng.uniform(0.0, 0.2, 8).astype(np.float32)
        new_sinks = random_sinks(rng, 8)
        slopes.copy_(torch.from_numpy(new_slopes))
        sinks.copy_(torch.from_numpy(new_sinks))
        graph.replay()
        torch.cuda.synchronize()
        want_out, want_lse = c.reference(window_left=64, logits_soft_cap=10.0,
                                         alibi_slopes=new_slopes, sinks=new_sinks)
        check_out(from_torch(out, "bf16"), "bf16", want_out)
        check_lse(lse.cpu().numpy(), want_lse)
