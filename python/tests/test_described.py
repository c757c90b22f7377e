"""The module's described-tensor path: the package hands PyTorch tensors to the compiled module
as plain tuples (data pointer, DLPack type code, bits, device type, device index, shape,
strides) instead of exporting them through DLPack, which costs more than the rest of a small
call. The module must read such a tuple exactly as the same tensor through DLPack: the same
results, the same errors. Checked here with NumPy arrays, so it runs without PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

import pagedattn
from pagedattn import _ext

from _cases import described, make_case


def test_described_tensors_give_the_dlpack_result():
    rng = np.random.default_rng(3)
    c = make_case(rng, context_lens=[5, 40, 0, 17], q_dtype="f32", kv_dtype="f16")
    q, k, v, table, lens = c.args()
    want = pagedattn.decode(q, k, v, table, lens, backend="cpu")
    out = np.full_like(want, np.nan)
    lse = np.full(want.shape[:2], np.nan, dtype=np.float32)
    _ext.decode(described(q), described(k), described(v), described(table), described(lens),
                described(out), described(lse), None, "cpu", 0, None, False, [])
    assert np.array_equal(out, want)
    _, want_lse = pagedattn.decode(q, k, v, table, lens, backend="cpu", return_lse=True)
    assert np.array_equal(lse, want_lse)


def test_described_tensors_are_checked_like_dlpack_ones():
    rng = np.random.default_rng(4)
    c = make_case(rng, context_lens=[5, 9], q_dtype="f32", kv_dtype="f32")
    q, k, v, table, lens = c.args()
    out = np.zeros_like(q)
    bad_lens = lens.astype(np.int64)
    errors = []
    for lens_arg in (bad_lens, described(bad_lens)):
        with pytest.raises(pagedattn.Error) as info:
            _ext.decode(described(q), described(k), described(v), described(table), lens_arg,
                        described(out), None, None, "cpu", 0, None, False, [])
        errors.append((info.value.argument, str(info.value)))
    assert errors[0] == errors[1]
    assert errors[0][0] == "context_lens" and "int32" in errors[0][1]
    assert not out.any()  # nothing written


def test_a_tuple_is_not_an_output():
    """Only the package builds descriptions: a tuple passed as out, lse or workspace is refused
    as what it is, never taken for a pointer."""
    rng = np.random.default_rng(5)
    c = make_case(rng, context_lens=[5, 9], q_dtype="f32", kv_dtype="f32")
    fake = (0, 2, 32, 1, 0, (2, 8, 64), (512, 64, 1))
    for name in ("out", "lse", "workspace"):
        with pytest.raises(pagedattn.Error) as info:
            pagedattn.decode(*c.args(), **{name: fake})
        assert info.value.argument == name
