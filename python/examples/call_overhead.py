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
        q = torch.randn(B, H, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(nb, KV, bs, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        table, lens = torch.from_numpy(table).to(dev), torch.from_numpy(lens).to(dev)
        out = torch.empty_like(q)
        stream = torch.cuda.current_stream().cuda_stream
        sync = torch.cuda.synchronize
        kind = "CUDA, bf16, plain launches"
    else:
        q = rng.standard_normal((B, H, D), dtype=np.float32)
        k = rng.standard_normal((nb, KV, bs, D), dtype=np.float32)
        v = rng.standard_normal((nb, KV, bs, D), dtype=np.float32)
        out = np.empty_like(q)
        stream = 0
        sync = lambda: None  # noqa: E731
        kind = "CPU, f32, NumPy"
    backend = "cuda" if cuda else "cpu"

    def package():
        pagedattn.decode(q, k, v, table, lens, out=out, backend=backend)

    def module():
        _ext.decode(q, k, v, table, lens, out, None, None, backend, stream, None, False, [])

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

    print(f"shape B={B} H={H} KV={KV} D={D} ctx={ctx} block 16, {kind}")
    print(f"pagedattn.decode      {per_call(package):9.2f} us per call (min of {a.repeats})")
    print(f"pagedattn._ext.decode {per_call(module):9.2f} us per call (min of {a.repeats})")
    print(f"compare with: pagedattn-bench --backend {backend}"
          f"{' --plain' if cuda else ''} --dtype {'bf16' if cuda else 'f32'} "
          f"--shape {B},{H},{KV},{D},{ctx}")


if __name__ == "__main__":
    main()
