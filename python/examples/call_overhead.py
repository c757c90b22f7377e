#!/usr/bin/env python3
"""What one pagedattn.decode call costs from Python: the time per call of the package function,
of the compiled module's entry point it wraps (pagedattn._ext.decode), and the decode's work
itself as the C++ benchmark reports it (pagedattn-bench, run separately on the same shape).

On CUDA (PyTorch tensors) the calls are plain launches on the current stream, timed over many
calls with one synchronization at the end, as `pagedattn-bench --backend cuda --plain` times
the C++ call; on the CPU (NumPy arrays) each call runs the decode to completion.

    python python/examples/call_overhead.py                      # CUDA when there is a GPU
    python python/examples/call_overhead.py --device cpu --context 1
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

import pagedattn
from pagedattn import _ext

try:
    import torch
except ImportError:  # NumPy-only machine
    torch = None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--shape", default="1,32,8,128,4096",
                   help="B,H,KV,D,CTX (default 1,32,8,128,4096), block size 16")
    p.add_argument("--context", type=int, default=None, help="override CTX")
    p.add_argument("--calls", type=int, default=2000, help="calls per timing (default 2000)")
    p.add_argument("--repeats", type=int, default=5, help="timings; the minimum is reported")
    return p.parse_args()


def main():
    a = parse_args()
    B, H, KV, D, ctx = (int(x) for x in a.shape.split(","))
    if a.context is not None:
        ctx = a.context
    cuda = a.device == "cuda" or (a.device == "auto" and torch is not None
                                  and torch.cuda.is_available())
    if cuda and (torch is None or not torch.cuda.is_available()):
        raise SystemExit("call_overhead: --device cuda needs PyTorch with a CUDA device")
    bs = 16
    nb = B * ((ctx + bs - 1) // bs)
    rng = np.random.default_rng(0)
    table = np.arange(nb, dtype=np.int32).reshape(B, -1)
    lens = np.full(B, ctx, dtype=np.int32)
    if cuda:
        dev = torch.device("cuda")
        # As many input sets as pagedattn-bench rotates through (together over 4x a 60 MB L2, at
        # most 16), so the GPU reads the cache from memory here too.
        kv_bytes = 2 * nb * KV * bs * D * 2
        n_sets = max(1, min(16, -(-240_000_000 // kv_bytes)))
        sets = [(torch.randn(B, H, D, device=dev, dtype=torch.bfloat16),
                 torch.randn(nb, KV, bs, D, device=dev, dtype=torch.bfloat16),
                 torch.randn(nb, KV, bs, D, device=dev, dtype=torch.bfloat16))
                for _ in range(n_sets)]
        q, k, v = sets[0]
        table, lens = torch.from_numpy(table).to(dev), torch.from_numpy(lens).to(dev)
        out = torch.empty_like(q)
        # A caller workspace, as pagedattn-bench passes one: no pool allocation per call.
        ws = torch.empty(pagedattn.workspace_size(q, k, table), dtype=torch.uint8, device=dev)
        stream = torch.cuda.current_stream().cuda_stream
        sync = torch.cuda.synchronize
        kind = "CUDA, bf16, plain launches"
    else:
        q = rng.standard_normal((B, H, D), dtype=np.float32)
        k = rng.standard_normal((nb, KV, bs, D), dtype=np.float32)
        v = rng.standard_normal((nb, KV, bs, D), dtype=np.float32)
        out = np.empty_like(q)
        sets = [(q, k, v)]
        ws = None
        stream = 0
        sync = lambda: None  # noqa: E731
        kind = "CPU, f32, NumPy"
    backend = "cuda" if cuda else "cpu"

    rotation = itertools.cycle(sets)

    def package():
        sq, sk, sv = next(rotation)
        pagedattn.decode(sq, sk, sv, table, lens, out=out, backend=backend, workspace=ws)

    def module():
        sq, sk, sv = next(rotation)
        _ext.decode(sq, sk, sv, table, lens, out, None, None, backend, stream, ws, False, [])

    # The module over tensors described as tuples, as the package hands PyTorch tensors to it
    # (pagedattn._ref): the module's own cost without any tensor import.
    rest = [pagedattn._ref(x) for x in (table, lens, out, ws)]
    described = itertools.cycle([[pagedattn._ref(x) for x in st] + rest for st in sets])

    def module_described():
        dq, dk, dv, dt, dl, do, dw = next(described)
        _ext.decode(dq, dk, dv, dt, dl, do, None, None, backend, stream, dw, False, [])

    def per_call(f):
        best = float("inf")
        for _ in range(a.repeats):
            for _ in range(50):
                f()
            sync()
            t = time.perf_counter()
            for _ in range(a.calls):
                f()
            sync()
            best = min(best, (time.perf_counter() - t) / a.calls * 1e6)
        return best

    print(f"shape B={B} H={H} KV={KV} D={D} ctx={ctx} block 16, {kind}, "
          f"{len(sets)} input set(s) in rotation")
    kv_bytes_per_call = 2 * B * ctx * KV * D * (2 if cuda else 4)
    us = per_call(package)
    print(f"pagedattn.decode      {us:9.2f} us per call (min of {a.repeats}), "
          f"{kv_bytes_per_call / (us * 1e-6) / 1e9:.1f} GB/s of K/V")
    print(f"pagedattn._ext.decode {per_call(module):9.2f} us per call (min of {a.repeats}),"
          " tensors through DLPack")
    if cuda:
        print(f"pagedattn._ext.decode {per_call(module_described):9.2f} us per call"
              f" (min of {a.repeats}), tensors described (what the package passes)")
    print(f"compare with: pagedattn-bench --backend {backend}"
          f"{' --plain' if cuda else ''} --dtype {'bf16' if cuda else 'f32'} "
          f"--shape {B},{H},{KV},{D},{ctx} (it passes a workspace too)")


if __name__ == "__main__":
    main()
