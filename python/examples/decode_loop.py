#!/usr/bin/env python3
"""A toy serving loop: the same decode steps run with PyTorch (gather + scaled_dot_product_attention),
with pagedattn.decode, and with FlashInfer where it is installed on a GPU machine.

The loop: a batch of sequences with random prompt lengths, some of them forks of others
(parallel sampling, sharing their parent's blocks). A pagedattn.BlockManager plans every step
up front (one new token per sequence; a copy-on-write block copy when a shared, partly filled
block is first appended to; the block table and context lengths). Each variant then replays the
same steps on its own copy of the cache: block copies, the new tokens' K/V written into their
slots, then attention for every sequence's new query. It prints each variant's time per step
and the largest difference of its outputs from pagedattn's.

    python python/examples/decode_loop.py                 # CUDA when there is a GPU, else CPU
    python python/examples/decode_loop.py --device cpu --steps 8

Without PyTorch (NumPy only) the baseline is a NumPy gather + softmax on the CPU.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import pagedattn

try:
    import torch
except ImportError:  # NumPy-only machine
    torch = None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["auto", "f32", "f16", "bf16"], default="auto",
                   help="storage dtype of q, the cache and out (auto: bf16 on CUDA, f32 on CPU)")
    p.add_argument("--batch", type=int, default=None, help="sequences (default 32 CUDA, 4 CPU)")
    p.add_argument("--forks", type=int, default=None,
                   help="sequences that are forks of others (default batch / 4)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prompt", type=int, default=None,
                   help="longest prompt; prompts are uniform in [1, this] (default 4096 CUDA, "
                        "1024 CPU)")
    p.add_argument("--steps", type=int, default=None, help="decode steps (default 64 CUDA, 8 CPU)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


# ----------------------------------------------------------------------------------------------
# The plan: every step's slots, block copies and tables, from one BlockManager.


class Plan:
    def __init__(self, a, rng):
        self.batch, self.forks = a.batch, a.forks
        self.block_size = a.block_size
        prompts = rng.integers(1, a.prompt + 1, size=a.batch - a.forks)
        parents = rng.integers(0, a.batch - a.forks, size=a.forks)
        blocks = sum(math.ceil((int(n) + a.steps) / a.block_size) for n in prompts)
        blocks += a.forks * (math.ceil(a.steps / a.block_size) + 1)
        self.num_blocks = blocks + 8
        bm = pagedattn.BlockManager(self.num_blocks, a.block_size)
        self.prompt_slots = [bm.add_sequence(s, int(n)) for s, n in enumerate(prompts)]
        for i, parent in enumerate(parents):
            bm.fork(int(parent), a.batch - a.forks + i)
        self.seqs = bm.sequences()
        # One table width for every step (the widest sequence at the end), so that the
        # baselines can gather with fixed shapes.
        width = max(math.ceil((bm.length(s) + a.steps) / a.block_size) for s in self.seqs)
        self.steps = []  # (slots int32 [B], copies [(src, dst)], block_table, context_lens)
        for _ in range(a.steps):
            slots, copies = [], []
            for s in self.seqs:
                slot, copy = bm.append_token(s)
                slots.append(slot)
                if copy is not None:
                    copies.append(copy)
            table, lens = bm.tables(self.seqs, min_width=width)
            self.steps.append((np.array(slots, np.int32), copies, table, lens))
        self.tokens = int(sum(bm.length(s) for s in self.seqs))


# ----------------------------------------------------------------------------------------------
# Variants. Each gets (cache k, cache v) of its own and runs the plan's steps.


def torch_write(k_cache, v_cache, slots, copies, key, value, block_size):
    """The step's cache updates in PyTorch: the block copies, then each new token's key and value
    written at its slot."""
    if copies:
        src = torch.tensor([c[0] for c in copies], device=k_cache.device)
        dst = torch.tensor([c[1] for c in copies], device=k_cache.device)
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]
    k_cache[slots // block_size, :, slots % block_size] = key
    v_cache[slots // block_size, :, slots % block_size] = value


def torch_step(k_cache, v_cache, slots, copies, key, value, q, table, lens, block_size, max_len):
    """PyTorch: index writes, block copies, a gather of every sequence's tokens into a padded
    [B, KV, L, D] tensor, and scaled_dot_product_attention with a length mask."""
    torch_write(k_cache, v_cache, slots, copies, key, value, block_size)
    t = torch.arange(max_len, device=q.device)
    blocks = table[:, t // block_size].clamp_min(0)          # [B, L]
    k = k_cache[blocks, :, t % block_size].transpose(1, 2)    # [B, KV, L, D]
    v = v_cache[blocks, :, t % block_size].transpose(1, 2)
    mask = (t[None, :] < lens[:, None])[:, None, None, :]     # [B, 1, 1, L]
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q[:, :, None, :], k, v,
                                                           attn_mask=mask)
    return out[:, :, 0, :]


def numpy_step(k_cache, v_cache, slots, copies, key, value, q, table, lens, block_size, max_len):
    """NumPy: the same gather, then a masked softmax, in float32."""
    for src, dst in copies:
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]
    k_cache[slots // block_size, :, slots % block_size] = key
    v_cache[slots // block_size, :, slots % block_size] = value
    t = np.arange(max_len)
    blocks = np.maximum(table[:, t // block_size], 0)
    k = k_cache[blocks, :, t % block_size].astype(np.float32)   # [B, L, KV, D]
    v = v_cache[blocks, :, t % block_size].astype(np.float32)
    b, h, d = q.shape
    group = h // k.shape[2]
    qg = q.astype(np.float32).reshape(b, k.shape[2], group, d)
    s = np.einsum("bkgd,blkd->bkgl", qg, k) / math.sqrt(d)
    s = np.where((t[None, :] < lens[:, None])[:, None, None, :], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bkgl,blkd->bkgd", p, v).reshape(b, h, d)


def pagedattn_step(k_cache, v_cache, slots, copies, key, value, q, table, lens, block_size,
                   max_len):
    """pagedattn: copy_blocks, write_cache, decode, all in place on the paged cache."""
    if copies:
        pagedattn.copy_blocks(k_cache, v_cache, copies)
    # The slots come from the BlockManager: unchecked (the default, no synchronization).
    pagedattn.write_cache(key, value, slots, k_cache, v_cache)
    return pagedattn.decode(q, k_cache, v_cache, table, lens)


class FlashInferStep:
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper over the same HND cache: plan + run per
    step (its page indices come from the same table), with PyTorch index writes."""

    def __init__(self, flashinfer, device, heads, kv_heads, head_dim, block_size, dtype):
        ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND")
        self.shape = (heads, kv_heads, head_dim, block_size)
        self.dtype = dtype

    def __call__(self, k_cache, v_cache, slots, copies, key, value, q, table, lens, block_size,
                 max_len):
        torch_write(k_cache, v_cache, slots, copies, key, value, block_size)
        pages = (lens + block_size - 1) // block_size
        indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device=q.device)
        indptr[1:] = torch.cumsum(pages, 0)
        cols = torch.arange(table.shape[1], device=q.device)
        indices = table[cols[None, :] < pages[:, None]].to(torch.int32)
        last = (lens - 1) % block_size + 1
        heads, kv_heads, head_dim, bs = self.shape
        self.wrapper.plan(indptr, indices, last.to(torch.int32), heads, kv_heads, head_dim, bs,
                          pos_encoding_mode="NONE", q_data_type=self.dtype,
                          kv_data_type=self.dtype)
        return self.wrapper.run(q, (k_cache, v_cache))


# ----------------------------------------------------------------------------------------------


def main():
    a = parse_args()
    use_torch = torch is not None
    if a.device == "auto":
        a.device = "cuda" if use_torch and torch.cuda.is_available() and \
            pagedattn.cuda_available()[0] else "cpu"
    if a.device == "cuda" and not (use_torch and torch.cuda.is_available()):
        raise SystemExit("--device cuda needs PyTorch with a CUDA GPU")
    cuda = a.device == "cuda"
    if a.dtype == "auto":
        a.dtype = "bf16" if cuda else "f32"
    if not use_torch and a.dtype == "bf16":
        raise SystemExit("bf16 without PyTorch is not part of this example; use --dtype f32/f16")
    a.batch = a.batch or (32 if cuda else 4)
    a.forks = a.batch // 4 if a.forks is None else min(a.forks, a.batch - 1)
    a.prompt = a.prompt or (4096 if cuda else 1024)
    a.steps = a.steps or (64 if cuda else 8)

    rng = np.random.default_rng(a.seed)
    plan = Plan(a, rng)
    kv, d, bs = a.kv_heads, a.head_dim, a.block_size
    max_len = int(plan.steps[-1][3].max())

    # Framework plumbing: the same random data as tensors of the chosen framework.
    if use_torch:
        tdtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
        gen = torch.Generator().manual_seed(a.seed)

        def randn(*shape):
            return torch.randn(*shape, generator=gen).to(device=a.device, dtype=tdtype)

        def ints(x):
            return torch.from_numpy(np.ascontiguousarray(x)).to(a.device)

        def sync():
            if cuda:
                torch.cuda.synchronize()

        def to_f32(x):
            return x.float().cpu().numpy()

        clone = torch.clone
    else:
        ndtype = {"f32": np.float32, "f16": np.float16}[a.dtype]

        def randn(*shape):
            return rng.standard_normal(shape, dtype=np.float32).astype(ndtype)

        def ints(x):
            return np.ascontiguousarray(x)

        def sync():
            pass

        def to_f32(x):
            return np.asarray(x, np.float32)

        clone = np.copy

    k0 = randn(plan.num_blocks, kv, bs, d)
    v0 = randn(plan.num_blocks, kv, bs, d)
    steps = []
    for slots, copies, table, lens in plan.steps:
        steps.append((ints(slots), copies, randn(a.batch, kv, d), randn(a.batch, kv, d),
                      randn(a.batch, a.heads, d), ints(table), ints(lens)))

    variants = [("pagedattn.decode", pagedattn_step)]
    if use_torch:
        variants.append(("torch gather + sdpa", torch_step))
    else:
        variants.append(("numpy gather + softmax", numpy_step))
    if cuda:
        try:
            import flashinfer

            variants.append(("flashinfer", FlashInferStep(flashinfer, a.device, a.heads, kv, d,
                                                          bs, tdtype)))
        except ImportError:
            print("flashinfer: not installed, skipped")

    print(f"device {a.device}, dtype {a.dtype}: {a.batch} sequences ({a.forks} forks), "
          f"{a.heads} heads / {kv} kv heads, head_dim {d}, block_size {bs}, {a.steps} steps, "
          f"contexts up to {max_len} tokens, {plan.num_blocks} cache blocks")
    results = {}
    for name, step in variants:
        try:
            for warm in (True, False):
                k_cache, v_cache = clone(k0), clone(v0)
                outs = []
                sync()
                start = time.perf_counter()
                for i, (slots, copies, key, value, q, table, lens) in enumerate(steps):
                    if warm and i == 2:
                        break
                    outs.append(step(k_cache, v_cache, slots, copies, key, value, q, table, lens,
                                     bs, max_len))
                sync()
                elapsed = time.perf_counter() - start
        except Exception as e:  # noqa: BLE001 - report a variant that cannot run, go on
            print(f"{name}: failed ({type(e).__name__}: {e})")
            continue
        results[name] = (elapsed, [to_f32(o) for o in outs])

    ref = results.get("pagedattn.decode")
    for name, (elapsed, outs) in results.items():
        line = f"{name:24s} {elapsed / len(steps) * 1e3:9.3f} ms/step"
        if ref is not None and name != "pagedattn.decode":
            diff = max(float(np.abs(o - r).max()) for o, r in zip(outs, ref[1]))
            line += f"   max |out - pagedattn| = {diff:.3e}"
        print(line)


if __name__ == "__main__":
    main()
