"""merge_states() on the CPU: segments of every context decoded apart and merged give the
decode of the whole contexts (float64 reference); empty segments and rows; bad arguments."""

import numpy as np
import pytest

import pagedattn
from _cases import DTYPES, OUT_TOL, arg, check_lse, empty, load, make_case


def segment_decodes(c, cuts, part_dtype):
    """Decodes each segment [cuts[b][s], cuts[b][s+1]) of every sequence's blocks apart:
    (parts [S, B, H, D] raw, part_lse [S, B, H])."""
    segments = len(cuts[0]) - 1
    parts, lses = [], []
    for s in range(segments):
        table = np.full_like(c.block_table, -1)
        lens = np.zeros_like(c.context_lens)
        for b in range(c.batch):
            lo, hi = cuts[b][s], cuts[b][s + 1]
            table[b, : hi - lo] = c.block_table[b, lo:hi]
            lens[b] = max(0, min(int(c.context_lens[b]), hi * c.block_size) - lo * c.block_size)
        out = empty(c.q.shape, part_dtype)
        q, k, v, _, _ = c.args()
        _, lse = pagedattn.decode(q, k, v, table, lens, out=arg(out, part_dtype),
                                  return_lse=True)
        parts.append(out)
        lses.append(lse)
    return np.stack(parts), np.stack(lses)


@pytest.mark.parametrize("part_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_segments_merge_to_the_whole_context(part_dtype, out_dtype):
    rng = np.random.default_rng(11 + DTYPES.index(out_dtype) + 7 * (part_dtype == "bf16"))
    c = make_case(rng, context_lens=[300, 37, 0, 16, 1], q_dtype="bf16", kv_dtype="bf16")
    cuts = []
    for n in c.context_lens:
        nb = -(-int(n) // c.block_size)
        a, b = sorted(rng.integers(0, nb + 1, size=2))
        cuts.append([0, int(a), int(b), nb])
    parts, part_lse = segment_decodes(c, cuts, part_dtype)
    out = empty(c.q.shape, out_dtype)
    got, lse = pagedattn.merge_states(arg(parts, part_dtype), part_lse, out=arg(out, out_dtype),
                                      return_lse=True)
    assert got is out and lse.shape == c.q.shape[:2] and lse.dtype == np.float32
    want_out, want_lse = c.reference()
    # Held to the looser of the two dtypes' tolerances (bf16 parts carry bf16 rounding).
    loose = "bf16" if "bf16" in (part_dtype, out_dtype) else out_dtype
    got_f = load(out, out_dtype).astype(np.float64)
    assert np.all(np.isfinite(got_f))
    scale = max(float(np.abs(want_out).max()), 1.0)
    assert float(np.abs(got_f - want_out).max()) <= OUT_TOL[loose] * scale
    check_lse(lse, want_lse)


def test_allocates_like_parts_and_handles_empty_rows():
    parts = np.ones((2, 3, 4, 8), dtype=np.float32)
    part_lse = np.full((2, 3, 4), -np.inf, dtype=np.float32)
    part_lse[1, 0, 0] = 0.5
    parts[1, 0, 0] = 3.0
    out, lse = pagedattn.merge_states(parts, part_lse, return_lse=True)
    assert out.shape == (3, 4, 8) and out.dtype == np.float32
    assert np.all(out[0, 0] == 3.0) and lse[0, 0] == np.float32(0.5)
    assert np.all(out.reshape(-1, 8)[1:] == 0.0) and np.all(np.isneginf(lse.reshape(-1)[1:]))
    part_lse[0, 2, 1] = np.nan
    part_lse[1, 2, 1] = 1.0
    out = pagedattn.merge_states(parts, part_lse)
    assert np.all(np.isnan(out[2, 1]))


@pytest.mark.parametrize("change,argument", [
    (dict(parts=np.ones((2, 3), np.float32), part_lse=np.zeros((2, 2), np.float32)), "part_lse"),
    (dict(part_lse=np.zeros((2, 3, 5), np.float32)), "part_lse"),
    (dict(part_lse=np.zeros((2, 3, 4), np.float64)), "part_lse"),
    (dict(out=np.zeros((3, 4, 7), np.float32)), "out"),
    (dict(lse=np.zeros((3, 5), np.float32)), "lse"),
    (dict(parts=np.ones(4, np.float32)), "parts"),
    (dict(backend="gpu"), "backend"),
])
def test_bad_arguments_are_named(change, argument):
    a = dict(parts=np.ones((2, 3, 4, 8), np.float32), part_lse=np.zeros((2, 3, 4), np.float32),
             out=np.full((3, 4, 8), 7.0, np.float32))
    a.update(change)
    parts, part_lse = a.pop("parts"), a.pop("part_lse")
    with pytest.raises(pagedattn.Error) as e:
        pagedattn.merge_states(parts, part_lse, **a)
    assert e.value.argument == argument, str(e.value)
    if "out" in a and a["out"].shape == (3, 4, 8):
        assert np.all(a["out"] == 7.0)
