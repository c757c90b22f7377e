"""decode(..., share_prefixes=...): samples of one prompt, whose tables begin with the same block
ids, read those blocks once for all of them (docs/shared_prefix.md). On and off give the f64
reference's result, and each other's within the dtype's tolerance."""

import numpy as np
import pytest

import pagedattn
from _cases import OUT_TOL, alibi_slopes, arg, check_lse, check_out, load, make_case


def _forked_case(rng, dtype, samples=4, prompts=3):
    """`prompts` groups of `samples` sequences: each group's members hold its first member's block
    ids for the blocks wholly before its fork, then blocks of their own; two unforked sequences
    after them."""
    bs = 16
    lens, forks = [], []
    for _ in range(prompts):
        fork = int(rng.integers(40, 200))
        forks.append(fork)
        lens += [fork + int(rng.integers(1, 60)) for _ in range(samples)]
    lens += [int(rng.integers(1, 200)) for _ in range(2)]
    c = make_case(rng, context_lens=lens, q_dtype=dtype, kv_dtype=dtype, block_size=bs)
    for g, fork in enumerate(forks):
        first = g * samples
        for b in range(first + 1, first + samples):
            c.block_table[b, : fork // bs] = c.block_table[first, : fork // bs]
    return c


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("alibi", [False, True])
def test_shared_and_plain_decodes_agree_with_the_reference(dtype, alibi):
    rng = np.random.default_rng(71 + alibi)
    c = _forked_case(rng, dtype)
    kwargs = {"alibi_slopes": alibi_slopes(8)} if alibi else {}
    want_out, want_lse = c.reference(**kwargs)
    shared, shared_lse = pagedattn.decode(*c.args(), return_lse=True, **kwargs)
    plain, plain_lse = pagedattn.decode(*c.args(), return_lse=True, share_prefixes=False,
                                        **kwargs)
    for out, lse in ((shared, shared_lse), (plain, plain_lse)):
        check_out(out, dtype, want_out)
        check_lse(lse, want_lse)
    scale = max(float(np.abs(want_out).max()), 1.0)
    assert np.abs(load(shared, dtype) - load(plain, dtype)).max() <= OUT_TOL[dtype] * scale


def test_batch_invariant_decodes_share_nothing():
    """A batch-invariant call never shares: a forked sequence keeps its bits alone."""
    rng = np.random.default_rng(73)
    c = _forked_case(rng, "bf16")
    out, lse = pagedattn.decode(*c.args(), return_lse=True, batch_invariant=True)
    _, k, v, table, lens = c.args()
    for b in (0, 1, 5):
        one, one_lse = pagedattn.decode(arg(c.q[b:b + 1], c.q_dtype), k, v,
                                        np.ascontiguousarray(table[b:b + 1]), lens[b:b + 1],
                                        return_lse=True, batch_invariant=True)
        assert (np.ascontiguousarray(one[0]).view(np.uint8)
                == np.ascontiguousarray(out[b]).view(np.uint8)).all()
        assert (one_lse[0] == lse[b]).all()
