"""PyTorch tensors: CPU always (where torch is installed), CUDA where a GPU is present."""

import numpy as np
import pytest

import pagedattn
from _cases import (DTYPES, LSE_TOL, OUT_TOL, case_tensors, check_lse, check_out, from_torch,
                    load, make_case, needs_cuda, rejection, rejection_case, store, to_torch)

torch = pytest.importorskip("torch")


TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


# ----------------------------------------------------------------------------------------------
# CPU


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_tensors(dtype):
    c = make_case(np.random.default_rng(0), context_lens=[0, 1, 15, 16, 17, 200],
                  q_dtype=dtype, kv_dtype=dtype)
    q, k, v, table, lens = case_tensors(c)
    out, lse = pagedattn.decode(q, k, v, table, lens, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == TORCH_DTYPE[dtype]
    assert lse.dtype == torch.float32 and lse.shape == (6, 8)
    want_out, want_lse = c.reference()
    check_out(from_torch(out, dtype), dtype, want_out)
    check_lse(lse.numpy(), want_lse)


def test_cpu_outputs_written_in_place_and_autograd_tensors_accepted():
    c = make_case(np.random.default_rng(1), context_lens=[7, 40])
    q, k, v, table, lens = case_tensors(c)
    q.requires_grad_(True)
    out = torch.full(q.shape, float("nan"))
    ptr = out.data_ptr()
    got = pagedattn.decode(q, k, v, table, lens, out=out)
    assert got is out and out.data_ptr() == ptr
    check_out(out.numpy(), "f32", c.reference()[0])


def test_cpu_non_contiguous_rejected():
    c = make_case(np.random.default_rng(2), context_lens=[7, 40])
    q, k, v, table, lens = case_tensors(c)
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q.transpose(0, 1).contiguous().transpose(0, 1), k, v, table, lens)
    assert info.value.argument == "q"


def test_cpu_write_cache_and_copy_blocks():
    k_cache = torch.zeros(4, 2, 8, 64, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(3, 2, 64)
    value = torch.randn(3, 2, 64)
    pagedattn.write_cache(key, value, torch.tensor([1, 9, 30], dtype=torch.int32), k_cache,
                          v_cache)
    assert torch.equal(k_cache[1, :, 1], key[1].to(torch.bfloat16))
    assert torch.equal(v_cache[3, :, 6], value[2].to(torch.bfloat16))
    pagedattn.copy_blocks(k_cache, v_cache, [(1, 2)])
    assert torch.equal(k_cache[2], k_cache[1])


# ----------------------------------------------------------------------------------------------
# CUDA


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_reference(dtype):
    c = make_case(np.random.default_rng(10), context_lens=[0, 1, 15, 16, 17, 300, 2000],
                  num_heads=16, num_kv_heads=2, head_dim=128, q_dtype=dtype, kv_dtype=dtype)
    q, k, v, table, lens = case_tensors(c, "cuda")
    out, lse = pagedattn.decode(q, k, v, table, lens, return_lse=True)
    assert out.device == q.device and lse.device == q.device
    torch.cuda.synchronize()
    want_out, want_lse = c.reference()
    check_out(from_torch(out, dtype), dtype, want_out)
    check_lse(lse.cpu().numpy(), want_lse)


@needs_cuda
@pytest.mark.parametrize("shape", [(4, 4, 64, 16), (8, 1, 80, 1), (64, 1, 256, 32),
                                   (12, 3, 96, 7)], ids=str)
def test_cuda_shapes(shape):
    h, kv, d, bs = shape
    c = make_case(np.random.default_rng(11), context_lens=[0, 1, bs, bs + 1, 500],
                  num_heads=h, num_kv_heads=kv, head_dim=d, block_size=bs,
                  q_dtype="bf16", kv_dtype="bf16")
    q, k, v, table, lens = case_tensors(c, "cuda")
    out = pagedattn.decode(q, k, v, table, lens)
    check_out(from_torch(out, "bf16"), "bf16", c.reference()[0])


@needs_cuda
def test_cuda_runs_on_the_current_stream():
    # On a side stream: a long sleep, then q is refilled, then decode. If decode ran on any
    # other stream it would read q before the refill.
    c = make_case(np.random.default_rng(12), context_lens=[100, 300])
    q, k, v, table, lens = case_tensors(c, "cuda")
    new_q = store(np.random.default_rng(13).standard_normal(c.q.shape, dtype=np.float32), "f32")
    new_q_dev = torch.from_numpy(new_q).cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        q.copy_(new_q_dev)
        out = pagedattn.decode(q, k, v, table, lens)
    side.synchronize()
    c.q = new_q
    check_out(from_torch(out, "f32"), "f32", c.reference()[0])


@needs_cuda
@pytest.mark.parametrize("explicit", ["object", "int"])
def test_cuda_explicit_stream(explicit):
    c = make_case(np.random.default_rng(14), context_lens=[30, 70])
    q, k, v, table, lens = case_tensors(c, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    out = torch.empty_like(q)
    pagedattn.decode(q, k, v, table, lens, out=out,
                     stream=side if explicit == "object" else side.cuda_stream)
    side.synchronize()
    check_out(from_torch(out, "f32"), "f32", c.reference()[0])


@needs_cuda
def test_cuda_graph_capture_with_workspace_and_replay():
    rng = np.random.default_rng(15)
    c = make_case(rng, context_lens=[50, 400, 3], num_heads=8, num_kv_heads=2, head_dim=128,
                  q_dtype="bf16", kv_dtype="bf16", extra_width=30, spare_blocks=60,
                  poison=False)
    q, k, v, table, lens = case_tensors(c, "cuda")
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device="cuda")
    ws = torch.empty(pagedattn.workspace_size(q, k, table), dtype=torch.uint8, device="cuda")
    assert ws.numel() > 0

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        pagedattn.decode(q, k, v, table, lens, out=out, lse=lse, workspace=ws)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pagedattn.decode(q, k, v, table, lens, out=out, lse=lse, workspace=ws)

    for step in range(3):
        # New lengths and table contents within the captured width, new queries.
        new_lens = np.array([50 + 37 * step, 400 - 100 * step, 3 + 200 * step], np.int32)
        need = [(-(-int(n) // c.block_size)) for n in new_lens]
        perm = rng.permutation(c.k.shape[0]).astype(np.int32)
        new_table = np.full(c.block_table.shape, -1, np.int32)
        pos = 0
        for b, n in enumerate(need):
            new_table[b, :n] = perm[pos:pos + n]
            pos += n
        new_q = store(rng.standard_normal(c.q.shape, dtype=np.float32), "bf16")
        lens.copy_(torch.from_numpy(new_lens))
        table.copy_(torch.from_numpy(new_table))
        q.copy_(to_torch(new_q, "bf16", "cuda"))
        graph.replay()
        torch.cuda.synchronize()
        c.q, c.block_table, c.context_lens = new_q, new_table, new_lens
        want_out, want_lse = c.reference()
        check_out(from_torch(out, "bf16"), "bf16", want_out)
        check_lse(lse.cpu().numpy(), want_lse)


@needs_cuda
def test_cuda_errors():
    (q, k, v, table, lens), out = rejection_case(16, [30, 70], "cuda")

    def decode(**kw):
        a = dict(q=q, k_cache=k, v_cache=v, block_table=table, context_lens=lens)
        a.update({n: kw.pop(n) for n in list(kw) if n in a})
        pagedattn.decode(a["q"], a["k_cache"], a["v_cache"], a["block_table"],
                         a["context_lens"], out=out, **kw)

    def err(**kw):
        return rejection(decode, out, **kw)

    e = err(block_table=table.cpu())
    assert e.argument == "block_table" and "device" in str(e)
    e = err(context_lens=lens.cpu())
    assert e.argument == "context_lens"
    e = err(backend="cpu")
    assert e.argument == "backend"
    e = err(workspace=torch.empty(16, dtype=torch.uint8, device="cuda"))
    assert e.argument == "workspace_bytes"
    bad = table.clone()
    bad[1, 0] = 10**6
    e = err(block_table=bad, checked=True)
    assert e.code == "out_of_range" and e.argument == "block_table[1][0]"
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.decode(q, k, v, table, lens, out=out.cpu())
    assert info.value.argument == "out"


@needs_cuda
def test_cuda_unchecked_bad_ids_never_crash():
    c = make_case(np.random.default_rng(17), context_lens=[30, 70])
    q, k, v, table, lens = case_tensors(c, "cuda")
    table[1, 0] = 10**6
    out = pagedattn.decode(q, k, v, table, lens)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


@needs_cuda
def test_cuda_write_cache_and_copy_blocks_match_cpu():
    rng = np.random.default_rng(18)
    k_cpu = torch.zeros(8, 2, 16, 64, dtype=torch.float16)
    v_cpu = torch.zeros_like(k_cpu)
    k_gpu, v_gpu = k_cpu.cuda(), v_cpu.cuda()
    key = torch.from_numpy(rng.standard_normal((5, 2, 64), dtype=np.float32))
    value = torch.from_numpy(rng.standard_normal((5, 2, 64), dtype=np.float32))
    slots = torch.tensor([0, 17, -1, 100, 127], dtype=torch.int32)
    pagedattn.write_cache(key, value, slots, k_cpu, v_cpu)
    pagedattn.write_cache(key.cuda(), value.cuda(), slots.cuda(), k_gpu, v_gpu)
    pagedattn.copy_blocks(k_cpu, v_cpu, [(1, 4), (6, 2)])
    pagedattn.copy_blocks(k_gpu, v_gpu, [(1, 4), (6, 2)])
    torch.cuda.synchronize()
    assert torch.equal(k_gpu.cpu(), k_cpu) and torch.equal(v_gpu.cpu(), v_cpu)
    # A slot past the pool: checked, an error naming it and nothing written; unchecked (the
    # default, no host round trip), the slot is skipped on the device.
    bad_slots = torch.tensor([0, 1, 2, 3, 128], dtype=torch.int32).cuda()
    before = k_gpu.clone()
    with pytest.raises(pagedattn.Error) as info:
        pagedattn.write_cache(key.cuda(), value.cuda(), bad_slots, k_gpu, v_gpu, checked=True)
    assert info.value.code == "out_of_range" and info.value.argument == "slot_mapping[4]"
    torch.cuda.synchronize()
    assert torch.equal(k_gpu, before)
    pagedattn.write_cache(key.cuda(), value.cuda(), bad_slots, k_gpu, v_gpu)
    torch.cuda.synchronize()
    assert torch.equal(k_gpu[0, :, :4], key.cuda()[:4].to(torch.float16).transpose(0, 1))


@needs_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_runs_on_the_tensors_device():
    c = make_case(np.random.default_rng(19), context_lens=[30, 300], q_dtype="bf16",
                  kv_dtype="bf16")
    torch.cuda.set_device(0)
    for device in ("cuda:1", "cuda:0", "cuda:1"):  # the library's current device follows
        q, k, v, table, lens = case_tensors(c, device)
        ws = torch.empty(pagedattn.workspace_size(q, k, table), dtype=torch.uint8, device=device)
        out = pagedattn.decode(q, k, v, table, lens, workspace=ws)
        assert out.device == q.device and torch.cuda.current_device() == 0
        torch.cuda.synchronize(q.device)
        check_out(from_torch(out, "bf16"), "bf16", c.reference()[0])
