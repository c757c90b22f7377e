"""Anchor measurements on one GPU: HBM ceilings, the seed's two Triton kernels,
and what a PyTorch user would write instead (gather the pages, then SDPA).

Prints one CSV row per (shape, implementation): median ms, KV GB/s, % of the
measured read ceiling, and the max abs error against an fp32 reference.

Run on the GPU machine (it needs torch and triton):
    python3 gpu_anchors.py [--shape B,H,KV,D,CTX]...   (default: the 13 anchor shapes)
READ_CEILING_GBPS=<readbw.cu figure> makes pct_ceiling comparable with a kernel's own report.
GRAPH=0 times plain launches instead of CUDA-graph replays. ROTATE=0 uses one input set.
Writes gpu_anchors*.csv into $OUT when set. Fragmented block tables (a random permutation of
the pool), block size 16, bf16.
"""
import argparse, math, os, sys
import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seed_kernels as seed  # noqa: E402

dev = "cuda"
OUT = os.environ.get("OUT", ".")
GRAPH = os.environ.get("GRAPH", "1") == "1"  # time CUDA-graph replays: no Python launch cost
ROTATE = os.environ.get("ROTATE", "1") == "1"  # cycle independent input sets (cold L2)


def ceilings():
    n = 4 << 30  # 4 GiB
    a = torch.empty(n // 2, dtype=torch.bfloat16, device=dev).normal_()
    b = torch.empty_like(a)
    t_copy = do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    copy_bw = 2 * n / (t_copy * 1e-3) / 1e9
    # read-mostly: a reduction over a large buffer
    t_sum = do_bench(lambda: a.sum(dtype=torch.float32), warmup=50, rep=300, return_mode="median")
    read_bw = n / (t_sum * 1e-3) / 1e9
    del a, b
    torch.cuda.empty_cache()
    return copy_bw, read_bw


def make_case(B, H, KV, D, ctx, BS, dtype, seed_=0, frag=True):
    g = torch.Generator(device=dev).manual_seed(seed_)
    max_blocks = (ctx + BS - 1) // BS
    num_blocks = B * max_blocks + 7
    q = torch.randn(B, H, 1, D, device=dev, dtype=dtype, generator=g)
    k = torch.randn(num_blocks, KV, BS, D, device=dev, dtype=dtype, generator=g)
    v = torch.randn(num_blocks, KV, BS, D, device=dev, dtype=dtype, generator=g)
    perm = torch.randperm(num_blocks, device=dev, generator=g)[: B * max_blocks] if frag else \
        torch.arange(B * max_blocks, device=dev)
    bt = perm.view(B, max_blocks).to(torch.int32).contiguous()
    lens = torch.full((B,), ctx, dtype=torch.int32, device=dev)
    return q, k, v, bt, lens, max_blocks


def torch_gather_sdpa(q, k, v, bt, lens, BS):
    # contiguous gather of every sequence's pages, then SDPA (all sequences full length here)
    B, H, _, D = q.shape
    KV = k.shape[1]
    kk = k[bt.long()]  # (B, MB, KV, BS, D)
    vv = v[bt.long()]
    kk = kk.permute(0, 2, 1, 3, 4).reshape(B, KV, -1, D)
    vv = vv.permute(0, 2, 1, 3, 4).reshape(B, KV, -1, D)
    return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)


def reference(q, k, v, bt, lens, BS):
    B, H, _, D = q.shape
    KV = k.shape[1]
    G = H // KV
    out = torch.empty(B, H, 1, D, device=dev, dtype=torch.float32)
    for b in range(B):
        L = int(lens[b])
        nb = (L + BS - 1) // BS
        blocks = bt[b, :nb].long()
        kk = k[blocks].float().permute(1, 0, 2, 3).reshape(KV, -1, D)[:, :L]
        vv = v[blocks].float().permute(1, 0, 2, 3).reshape(KV, -1, D)[:, :L]
        qq = q[b, :, 0].float().view(KV, G, D)
        s = torch.einsum("kgd,kld->kgl", qq, kk) / math.sqrt(D)
        p = torch.softmax(s, dim=-1)
        out[b, :, 0] = torch.einsum("kgl,kld->kgd", p, vv).reshape(H, D)
    return out


def seed_split(q, k, v, bt, lens, max_blocks, BS, num_splits):
    B, H, _, D = q.shape
    KV = k.shape[1]
    G = H // KV
    PG = max(16, triton.next_power_of_2(G))
    pacc = torch.empty(B, H, num_splits, D, device=dev, dtype=torch.float32)
    pm = torch.empty(B, H, num_splits, device=dev, dtype=torch.float32)
    pl = torch.empty(B, H, num_splits, device=dev, dtype=torch.float32)
    out = torch.empty(B, H, D, device=dev, dtype=q.dtype)
    qq = q.view(B, H, D)
    seed._flash_decode_partial_kernel[(B, KV, num_splits)](
        qq, k, v, bt, lens, 1.0 / math.sqrt(D), pacc, pm, pl,
        MAX_BLOCKS_PER_SEQ=max_blocks, BLOCK_SIZE=BS, HEAD_DIM=D, N_KV_HEAD=KV, N_HEAD=H,
        GROUP_SIZE=G, PADDED_GROUP=PG, NUM_SPLITS=num_splits)
    seed._flash_decode_combine_kernel[(B, H)](pacc, pm, pl, lens, out, HEAD_DIM=D, N_HEAD=H,
                                              NUM_SPLITS=num_splits)
    return out.view(B, H, 1, D)


ANCHOR_SHAPES = [
    # (B, H, KV, D, ctx)
    (1, 32, 8, 128, 4096), (1, 32, 8, 128, 32768), (1, 32, 8, 128, 131072),
    (8, 32, 8, 128, 4096), (8, 32, 8, 128, 32768),
    (32, 32, 8, 128, 1024), (32, 32, 8, 128, 4096), (32, 32, 8, 128, 16384),
    (128, 32, 8, 128, 1024), (128, 32, 8, 128, 4096),
    (64, 64, 8, 128, 4096), (32, 32, 32, 128, 4096), (32, 32, 4, 64, 4096),
]


def parse_shape(text):
    parts = text.split(",")
    if len(parts) != 5 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"--shape {text}: expected B,H,KV,D,CTX, 5 positive integers")
    B, H, KV, D, ctx = map(int, parts)
    if H % KV:
        raise argparse.ArgumentTypeError(f"--shape {text}: H must be a multiple of KV")
    return (B, H, KV, D, ctx)


def main():
    ap = argparse.ArgumentParser(description="The seed kernels and torch gather+SDPA on one GPU.")
    ap.add_argument("--shape", type=parse_shape, action="append",
                    help="B,H,KV,D,CTX (block 16); repeatable (default: the 13 anchor shapes)")
    shapes = ap.parse_args().shape or ANCHOR_SHAPES
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    print(f"# device {props.name} SMs={props.multi_processor_count} torch={torch.__version__} triton={triton.__version__}")
    copy_bw, read_bw = ceilings()
    print(f"# ceilings: copy {copy_bw:.0f} GB/s (read+write counted), read-reduce {read_bw:.0f} GB/s")
    # torch's reduction and copy under-read the HBM against a streaming kernel (readbw.cu):
    # pass that kernel's figure, measured in the same job, as READ_CEILING_GBPS.
    ceiling = float(os.environ.get("READ_CEILING_GBPS", max(copy_bw, read_bw)))
    print(f"# pct_ceiling is of {ceiling:.0f} GB/s")
    BS = 16
    rows = []
    hdr = "B,H,KV,D,ctx,dtype,impl,ms,kv_GBps,pct_ceiling,max_abs_err,sets"
    print(hdr)
    for dtype in (torch.bfloat16,):
        for (B, H, KV, D, ctx) in shapes:
            # Rotate over independent input sets spanning >= 4x the 60 MB L2 (at most 16), as
            # pagedattn-bench and the FlashInfer benchmark do: every timed call reads cold K/V.
            kv_bytes = 2 * B * ctx * KV * D * torch.tensor([], dtype=dtype).element_size()
            nsets = ROTATE and max(1, min(16, math.ceil(4 * 60 * 2**20 / kv_bytes))) or 1
            cases = [make_case(B, H, KV, D, ctx, BS, dtype, seed_=i) for i in range(nsets)]
            q, k, v, bt, lens, mb = cases[0]
            ref = reference(q, k, v, bt, lens, BS) if B * ctx <= 32 * 16384 else None
            makers = {"seed_naive": lambda c: (lambda: seed.paged_decode_attention(c[0], c[1], c[2], c[3], c[4], c[5], BS))}
            for ns in (1, 4, 16, 64):
                makers[f"seed_split{ns}"] = (lambda c, ns=ns: (lambda: seed_split(c[0], c[1], c[2], c[3], c[4], c[5], BS, ns)))
            makers["torch_gather_sdpa"] = lambda c: (lambda: torch_gather_sdpa(c[0], c[1], c[2], c[3], c[4], BS))
            for name, make in makers.items():
                try:
                    fns = [make(c) for c in cases]
                    o = fns[0]()
                    torch.cuda.synchronize()
                    err = float((o.float() - ref).abs().max()) if ref is not None else float("nan")
                    it = [0]
                    def step():
                        fns[it[0] % nsets](); it[0] += 1
                    ms = do_bench(step, warmup=25, rep=100, return_mode="median")
                    if GRAPH:
                        s_ = torch.cuda.Stream()
                        s_.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(s_):
                            for f_ in fns:
                                f_()
                        torch.cuda.current_stream().wait_stream(s_)
                        gr = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(gr):
                            for i_ in range(20):
                                fns[i_ % nsets]()
                        ms = do_bench(gr.replay, warmup=25, rep=200, return_mode="median") / 20
                    gbps = kv_bytes / (ms * 1e-3) / 1e9
                    row = f"{B},{H},{KV},{D},{ctx},{str(dtype)[6:]},{name},{ms:.4f},{gbps:.0f},{100*gbps/ceiling:.1f},{err:.2e},{nsets}"
                except Exception as e:  # keep going: one failing impl must not hide the others
                    row = f"{B},{H},{KV},{D},{ctx},{str(dtype)[6:]},{name},ERR,{type(e).__name__}: {str(e)[:80]}"
                print(row, flush=True)
                rows.append(row)
            del cases
            torch.cuda.empty_cache()
    with open(os.path.join(OUT, "gpu_anchors%s.csv" % ("_graph" if GRAPH else "")), "w") as f:
        f.write(f"# ceilings copy={copy_bw:.0f} read={read_bw:.0f}\n{hdr}\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
