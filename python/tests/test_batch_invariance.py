"""decode(..., batch_invariant=True): a sequence's out and lse bits depend on its own inputs only,
whatever else is in the batch (docs/batch_invariance.md). The same sequences, on one pool, are
decoded alone and inside batches of other sizes, positions and lengths, and their bits compared;
the results also match the f64 reference."""

import numpy as np
import pytest

import pagedattn
from _cases import arg, case_tensors, check_lse, check_out, make_case, needs_cuda, torch


def _decode_rows(c, rows, **kwargs):
    """decode() of the case's sequences `rows` (in that order), on the case's whole pool."""
    rows = np.asarray(rows)
    return pagedattn.decode(arg(c.q[rows], c.q_dtype), arg(c.k, c.kv_dtype),
                            arg(c.v, c.kv_dtype), np.ascontiguousarray(c.block_table[rows]),
                            np.ascontiguousarray(c.context_lens[rows]), return_lse=True,
                            **kwargs)


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint8)


# Long sequences, so that the default plan splits them by the batch's load: alone, one is cut
# over every thread; among many, each is read whole.
LENS = [3000, 4096, 17, 2500, 1, 0, 3333, 640, 4000, 1200]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_sequences_keep_their_bits_in_every_batch(dtype):
    rng = np.random.default_rng(61)
    c = make_case(rng, context_lens=LENS, num_heads=8, num_kv_heads=2, head_dim=64,
                  q_dtype=dtype, kv_dtype=dtype)
    out_all, lse_all = _decode_rows(c, range(len(LENS)), batch_invariant=True)
    want_out, want_lse = c.reference()
    check_out(out_all, dtype, want_out)
    check_lse(lse_all, want_lse)
    batches = [[0], [1], [6, 0], [3, 1, 8, 0], list(reversed(range(len(LENS)))),
               [8] + [0] * 7 + [1]]
    for rows in batches:
        out, lse = _decode_rows(c, rows, batch_invariant=True)
        for i, row in enumerate(rows):
            assert (_bits(out[i]) == _bits(out_all[row])).all(), (rows, row)
            assert (_bits(lse[i]) == _bits(lse_all[row])).all(), (rows, row)


def test_workspace_size_takes_batch_invariant():
    rng = np.random.default_rng(62)
    c = make_case(rng, context_lens=[5, 9])
    assert pagedattn.workspace_size(c.q, c.k, c.block_table, batch_invariant=True) == 0


@needs_cuda
def test_cuda_sequences_keep_their_bits_in_every_batch():
    c = make_case(np.random.default_rng(63), context_lens=LENS, num_heads=32, num_kv_heads=8,
                  head_dim=128, q_dtype="bf16", kv_dtype="bf16")
    q, k, v, table, lens = case_tensors(c, "cuda")

    def run(rows):
        idx = torch.tensor(rows, device=q.device)
        qb, tb = q[idx].contiguous(), table[idx].contiguous()
        ws = torch.empty(pagedattn.workspace_size(qb, k, tb, batch_invariant=True),
                         dtype=torch.uint8, device=q.device)
        assert ws.numel() >= pagedattn.workspace_size(qb, k, tb)
        return pagedattn.decode(qb, k, v, tb, lens[idx].contiguous(), workspace=ws,
                                return_lse=True, batch_invariant=True)

    out_all, lse_all = run(list(range(len(LENS))))
    for rows in ([0], [6, 0], [3, 1, 8, 0], [8] + [0] * 40 + [1]):
        out, lse = run(rows)
        for i, row in enumerate(rows):
            assert torch.equal(out[i].view(torch.int16), out_all[row].view(torch.int16))
            assert torch.equal(lse[i].view(torch.int32), lse_all[row].view(torch.int32))
