"""write_cache, copy_blocks and BlockManager on the CPU, and a small serving loop through them."""

import numpy as np
import pytest

import pagedattn
from _cases import DTYPES, arg, check_out, load, reference_decode, serve_steps, store


def new_cache(dtype, num_blocks=6, kv=2, bs=8, d=64, fill=0.0):
    raw = store(np.full((num_blocks, kv, bs, d), fill, np.float32), dtype)
    return raw, raw.copy()


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_write_cache_converts_and_places(src, dst):
    rng = np.random.default_rng(0)
    k_cache, v_cache = new_cache(dst, fill=5.0)
    key32 = rng.standard_normal((4, 2, 64), dtype=np.float32)
    value32 = rng.standard_normal((4, 2, 64), dtype=np.float32)
    slots = np.array([3, -1, 8 * 5 + 7, 17], np.int32)  # -1: skipped
    pagedattn.write_cache(arg(store(key32, src), src), arg(store(value32, src), src), slots,
                          arg(k_cache, dst), arg(v_cache, dst))
    want_k = np.full((6, 2, 8, 64), 5.0)
    want_v = want_k.copy()
    for i, s in enumerate(slots):
        if s >= 0:
            want_k[s // 8, :, s % 8] = load(store(load(store(key32[i], src), src), dst), dst)
            want_v[s // 8, :, s % 8] = load(store(load(store(value32[i], src), src), dst), dst)
    np.testing.assert_array_equal(load(k_cache, dst), want_k)
    np.testing.assert_array_equal(load(v_cache, dst), want_v)


def test_write_cache_from_a_packed_qkv_buffer():
    # key and value are views into one [tokens, 3, kv, d] buffer: tokens 3 rows apart.
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((5, 3, 2, 64), dtype=np.float32)
    k_cache, v_cache = new_cache("f32")
    slots = np.array([0, 9, 10, 30, 47], np.int32)
    pagedattn.write_cache(qkv[:, 1], qkv[:, 2], slots, k_cache, v_cache)
    for i, s in enumerate(slots):
        np.testing.assert_array_equal(k_cache[s // 8, :, s % 8], qkv[i, 1])
        np.testing.assert_array_equal(v_cache[s // 8, :, s % 8], qkv[i, 2])


def test_copy_blocks_list_and_array():
    rng = np.random.default_rng(2)
    k = rng.standard_normal((6, 2, 8, 64), dtype=np.float32)
    v = rng.standard_normal((6, 2, 8, 64), dtype=np.float32)
    k0, v0 = k.copy(), v.copy()
    pagedattn.copy_blocks(k, v, [(0, 3), (1, 5)])
    np.testing.assert_array_equal(k[3], k0[0])
    np.testing.assert_array_equal(v[5], v0[1])
    np.testing.assert_array_equal(k[[0, 1, 2, 4]], k0[[0, 1, 2, 4]])
    pagedattn.copy_blocks(k, v, np.array([[2, 4]], np.int64))
    np.testing.assert_array_equal(v[4], v0[2])
    pagedattn.copy_blocks(k, v, [])  # nothing to do


def test_copy_blocks_bf16():
    k = np.arange(4 * 1 * 2 * 64, dtype=np.uint16).reshape(4, 1, 2, 64)
    v = k + 1
    pagedattn.copy_blocks(pagedattn.bf16(k), pagedattn.bf16(v), [(1, 2)])
    assert np.array_equal(k[2], k[1]) and np.array_equal(v[2], v[1])


def test_block_manager_basics():
    bm = pagedattn.BlockManager(8, 4)
    assert (bm.num_blocks, bm.block_size, bm.num_free_blocks) == (8, 4, 8)
    slots = bm.add_sequence(1, 6)
    assert slots.dtype == np.int32 and slots.shape == (6,)
    assert bm.length(1) == 6 and bm.num_used_blocks == 2 and 1 in bm and len(bm) == 1
    assert [bm.slot(1, p) for p in range(6)] == slots.tolist()
    assert bm.blocks_to_append(1) == 0
    slot, copy = bm.append_token(1)
    assert copy is None and slot == bm.slot(1, 6)
    bm.fork(1, 2)
    assert bm.ref_count(bm.blocks(1)[0]) == 2
    slot, copy = bm.append_token(2)  # shared, partly filled last block: copy-on-write
    assert copy is not None and copy[0] == bm.blocks(1)[-1] and copy[1] == bm.blocks(2)[-1]
    table, lens = bm.tables([2, 1], min_width=3)
    assert table.dtype == np.int32 and table.shape == (2, 3)
    assert lens.tolist() == [8, 7] and table[0, 2] == -1
    # seq 1: 7 tokens; seq 2 shares block 0 and owns a copy of block 1 (3 copied + 1 new).
    assert bm.sequences() == [1, 2] and bm.stored_tokens() == 7 + 4
    assert 0 < bm.fragmentation() < 1
    bm.free_sequence(1)
    bm.free_sequence(2)
    assert bm.num_free_blocks == 8
    bm.check_invariants()


@pytest.mark.parametrize("dtype", DTYPES)
def test_serving_loop_against_reference(dtype):
    """Prompts, forks with copy-on-write, decode steps: every step against the f64 reference
    over each sequence's tokens, kept aside in token order."""
    rng = np.random.default_rng(3)
    kv, heads, d, bs, pool = 2, 4, 64, 4, 64
    bm = pagedattn.BlockManager(pool, bs)
    k_cache = store(np.full((pool, kv, bs, d), np.nan, np.float32), dtype)
    v_cache = k_cache.copy()
    history = {}  # seq -> (keys [n, kv, d], values), stored values as f64

    def write(seq_tokens_slots):
        key = rng.standard_normal((len(seq_tokens_slots), kv, d), dtype=np.float32)
        value = rng.standard_normal((len(seq_tokens_slots), kv, d), dtype=np.float32)
        slots = np.array([s for _, s in seq_tokens_slots], np.int32)
        pagedattn.write_cache(key, value, slots, arg(k_cache, dtype), arg(v_cache, dtype))
        for i, (seq, _) in enumerate(seq_tokens_slots):
            ks, vs = history[seq]
            history[seq] = (np.concatenate([ks, load(store(key[i:i + 1], dtype), dtype)]),
                            np.concatenate([vs, load(store(value[i:i + 1], dtype), dtype)]))

    def copy_blocks(copies):
        pagedattn.copy_blocks(arg(k_cache, dtype), arg(v_cache, dtype), copies)

    empty = (np.zeros((0, kv, d)), np.zeros((0, kv, d)))
    for _, seqs, table, lens, _ in serve_steps(bm, history, empty, write, copy_blocks):
        q = store(rng.standard_normal((len(seqs), heads, d), dtype=np.float32), dtype)
        out = pagedattn.decode(arg(q, dtype), arg(k_cache, dtype), arg(v_cache, dtype), table,
                               lens)
        for b, seq in enumerate(seqs):
            ks, vs = history[seq]
            assert len(ks) == lens[b]
            # The sequence's own tokens as a one-block-per-token contiguous cache.
            want, _ = reference_decode(load(q[b:b + 1], dtype), ks[:, :, None, :],
                                       vs[:, :, None, :], np.arange(len(ks))[None], [len(ks)])
            check_out(out[b:b + 1], dtype, want)
    bm.check_invariants()
