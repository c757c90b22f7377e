"""Bad input: every error type, each naming its argument, raised before anything is written."""

import numpy as np
import pytest

import pagedattn
from _cases import arg, empty, make_case


@pytest.fixture
def case():
    return make_case(np.random.default_rng(0), context_lens=[5, 40, 0], num_heads=8,
                     num_kv_heads=2, head_dim=64, block_size=16, poison=False)


def run(case, out=None, lse=None, **overrides):
    """decode with one argument replaced; out and lse are NaN-filled buffers by default."""
    a = dict(q=case.q, k_cache=case.k, v_cache=case.v, block_table=case.block_table,
             context_lens=case.context_lens)
    kw = {k: overrides.pop(k) for k in list(overrides) if k not in a}
    a.update(overrides)
    out = empty(case.q.shape, "f32") if out is None else out
    lse = np.full(case.q.shape[:2], np.nan, np.float32) if lse is None else lse
    before = [(x, x.copy()) for x in (out, lse) if isinstance(x, np.ndarray)]
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(a["q"], a["k_cache"], a["v_cache"], a["block_table"],
                         a["context_lens"], out=out, lse=lse, **kw)
    for x, copy in before:  # nothing written
        assert x.tobytes() == copy.tobytes()
    return info.value


def test_error_is_a_value_error_with_argument_and_code(case):
    e = run(case, q=case.q.astype(np.float64))
    assert isinstance(e, ValueError)
    assert e.argument == "q" and e.code == "invalid_argument"
    assert str(e).startswith("pagedattn: q.dtype = float64:")


@pytest.mark.parametrize("name,make,argument", [
    ("q float64", lambda c: dict(q=c.q.astype(np.float64)), "q"),
    ("q uint16 unmarked", lambda c: dict(q=c.q.view(np.uint16)[..., :64]), "q"),
    ("q 2-d", lambda c: dict(q=c.q[0]), "q"),
    ("q not a tensor", lambda c: dict(q=c.q.tolist()), "q"),
    ("q not contiguous", lambda c: dict(q=np.ascontiguousarray(
        np.repeat(c.q, 2, axis=2))[:, :, ::2]), "q"),
    ("k_cache 3-d", lambda c: dict(k_cache=c.k[0]), "k_cache"),
    ("k_cache head_dim", lambda c: dict(k_cache=c.k[..., :32].copy(),
                                        v_cache=c.v[..., :32].copy()), "k_cache"),
    ("v_cache shape", lambda c: dict(v_cache=c.v[:-1].copy()), "v_cache"),
    ("v_cache dtype", lambda c: dict(v_cache=c.v.astype(np.float16)), "v_cache"),
    ("block_table int64", lambda c: dict(block_table=c.block_table.astype(np.int64)),
     "block_table"),
    ("block_table rows", lambda c: dict(block_table=c.block_table[:2]), "block_table"),
    ("block_table column stride", lambda c: dict(block_table=np.ascontiguousarray(
        np.repeat(c.block_table, 2, axis=1))[:, ::2]), "block_table"),
    ("context_lens length", lambda c: dict(context_lens=c.context_lens[:2]), "context_lens"),
    ("context_lens float", lambda c: dict(context_lens=c.context_lens.astype(np.float32)),
     "context_lens"),
    ("out shape", lambda c: dict(out=np.zeros((3, 8, 32), np.float32)), "out"),
    ("out dtype", lambda c: dict(out=np.zeros(c.q.shape, np.float64)), "out"),
    ("lse dtype", lambda c: dict(lse=np.zeros(c.q.shape[:2], np.float64)), "lse"),
    ("lse shape", lambda c: dict(lse=np.zeros((3, 4), np.float32)), "lse"),
    ("backend name", lambda c: dict(backend="gpu"), "backend"),
    ("backend type", lambda c: dict(backend=1), "backend"),
    ("stream", lambda c: dict(stream="fast"), "stream"),
])
def test_invalid_argument(case, name, make, argument):
    e = run(case, **make(case))
    assert e.code == "invalid_argument", str(e)
    assert e.argument == argument, str(e)


def test_read_only_out(case):
    out = empty(case.q.shape, "f32")
    out.setflags(write=False)
    e = run(case, out=out)
    assert e.argument == "out" and "writable" in str(e)


def test_heads_not_a_multiple_of_kv_heads(case):
    q = np.zeros((3, 6, 64), np.float32)
    k = np.zeros((4, 4, 16, 64), np.float32)
    e = run(case, q=q, k_cache=k, v_cache=k, out=np.zeros_like(q), lse=np.zeros((3, 6), np.float32))
    assert e.code == "invalid_argument" and e.argument == "num_heads"


def test_out_of_range_block_id(case):
    table = case.block_table.copy()
    table[1, 2] = case.k.shape[0]  # inside context_lens[1] = 40 (block 2 holds tokens 32-39)
    e = run(case, block_table=table)
    assert e.code == "out_of_range" and e.argument == "block_table[1][2]"
    assert f"= {case.k.shape[0]}:" in str(e)


@pytest.mark.parametrize("length", [-1, 10**6])
def test_out_of_range_context(case, length):
    lens = case.context_lens.copy()
    lens[2] = length
    e = run(case, context_lens=lens)
    assert e.code == "out_of_range" and e.argument == "context_lens[2]"


def test_unsupported_head_dim(case):
    q = np.zeros((3, 8, 48), np.float32)
    k = np.zeros((4, 2, 16, 48), np.float32)
    e = run(case, q=q, k_cache=k, v_cache=k, out=np.zeros_like(q))
    assert e.code == "unsupported" and e.argument == "head_dim"


def test_head_dim_512_has_no_cuda_kernel_yet():
    assert 512 in pagedattn.SUPPORTED_HEAD_DIMS and 512 not in pagedattn.CUDA_HEAD_DIMS
    assert set(pagedattn.CUDA_HEAD_DIMS) < set(pagedattn.SUPPORTED_HEAD_DIMS)


def test_unsupported_group_size(case):
    q = np.zeros((3, 128, 64), np.float32)
    k = np.zeros((4, 1, 16, 64), np.float32)
    e = run(case, q=q, k_cache=k, v_cache=k, out=np.zeros_like(q),
            lse=np.zeros((3, 128), np.float32))
    assert e.code == "unsupported" and e.argument == "group_size"


def test_unsupported_block_size(case):
    k = np.zeros((2, 2, 300, 64), np.float32)
    e = run(case, k_cache=k, v_cache=k)
    assert e.code == "unsupported" and e.argument == "block_size"


def test_cuda_backend_on_cpu_tensors(case):
    e = run(case, backend="cuda")
    available, _ = pagedattn.cuda_available()
    if available:
        assert e.code == "invalid_argument" and e.argument == "backend"
    else:
        assert e.code == "backend_unavailable" and e.argument == "backend"


def test_bf16_marking_on_a_float_tensor(case):
    e = run(case, q=pagedattn.bf16(case.q))
    assert e.code == "invalid_argument" and e.argument == "q"
    assert "pagedattn.bf16()" in str(e)


def test_write_cache_slot_out_of_range():
    k = np.full((4, 2, 8, 64), 7.0, np.float32)
    v = k.copy()
    key = np.ones((3, 2, 64), np.float32)
    slots = np.array([0, 5, 4 * 8], np.int32)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.write_cache(key, key, slots, k, v)
    assert info.value.code == "out_of_range" and info.value.argument == "slot_mapping[2]"
    assert np.all(k == 7.0) and np.all(v == 7.0)


@pytest.mark.parametrize("overrides,argument", [
    (dict(key=np.ones((3, 2, 32), np.float32)), "key"),
    (dict(value=np.ones((3, 2, 64), np.float16)), "value"),
    (dict(slot_mapping=np.zeros(3, np.int64)), "slot_mapping"),
    (dict(slot_mapping=np.zeros(2, np.int32)), "slot_mapping"),
    (dict(k_cache=np.zeros((4, 2, 8, 64), np.float32)[:, :, :, :]), None),
    (dict(v_cache=np.full((4, 2, 8, 64), 7.0, np.float16)), "v_cache"),
    (dict(key=np.ones((3, 4, 64), np.float32)[:, ::2]), "key"),
])
def test_write_cache_invalid(overrides, argument):
    a = dict(key=np.ones((3, 2, 64), np.float32), value=np.ones((3, 2, 64), np.float32),
             slot_mapping=np.array([0, 1, 2], np.int32),
             k_cache=np.full((4, 2, 8, 64), 7.0, np.float32),
             v_cache=np.full((4, 2, 8, 64), 7.0, np.float32))
    a.update(overrides)
    if argument is None:  # a valid call, as the control
        pagedattn.write_cache(**a)
        return
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.write_cache(**a)
    assert info.value.argument == argument, str(info.value)
    for name in ("k_cache", "v_cache"):
        assert np.all(a[name] == 7.0)


def test_write_cache_read_only_cache():
    k = np.zeros((4, 2, 8, 64), np.float32)
    k.setflags(write=False)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.write_cache(np.ones((1, 2, 64), np.float32), np.ones((1, 2, 64), np.float32),
                              np.zeros(1, np.int32), k, np.zeros_like(k))
    assert info.value.argument == "k_cache"


@pytest.mark.parametrize("pairs,argument,code", [
    ([(0, 9)], "pairs", "invalid_argument"),      # dst outside the pool (the library names it)
    ([(0, 1, 2)], "pairs", "invalid_argument"),
    ("01", "pairs", "invalid_argument"),
    (np.zeros((2, 3), np.int32), "pairs", "invalid_argument"),
    (np.zeros((2, 2), np.float32), "pairs", "invalid_argument"),
])
def test_copy_blocks_invalid(pairs, argument, code):
    k = np.full((4, 2, 8, 64), 7.0, np.float32)
    v = k.copy()
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.copy_blocks(k, v, pairs)
    assert info.value.argument.startswith(argument), str(info.value)
    assert np.all(k == 7.0) and np.all(v == 7.0)


def test_block_manager_errors_leave_it_unchanged():
    bm = pagedattn.BlockManager(4, 8)
    bm.add_sequence(1, 20)
    with pytest.raises(pagedattn.Error) as info:
        bm.add_sequence(2, 20)  # needs 3 blocks, 1 free
    assert info.value.code == "out_of_range"
    with pytest.raises(pagedattn.Error):
        bm.add_sequence(1, 1)  # id exists
    with pytest.raises(pagedattn.Error):
        bm.append_token(99)  # no such sequence
    assert bm.num_free_blocks == 1 and bm.length(1) == 20 and 2 not in bm
    bm.check_invariants()


def test_workspace_size_errors(case):
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.workspace_size(case.q, case.k[0], case.block_table)
    assert info.value.argument == "k_cache"


def test_device_error_code_exists():
    # Device errors come from the CUDA runtime (tests/test_cuda.py covers the CUDA paths); here
    # only the shape of the exception.
    e = pagedattn.Error("pagedattn: device = x: y", "device", "device_error")
    assert e.code == "device_error" and isinstance(e, ValueError)
