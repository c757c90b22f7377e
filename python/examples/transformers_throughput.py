"""Decode throughput of Transformers' continuous batching with attn_implementation="pagedattn"
against Transformers' own paged implementations ("sdpa", "paged|eager").

A randomly initialized Llama-style GQA model built from a config (nothing is downloaded; by
default 16 layers, hidden 2048, 32 query heads and 8 kv heads of head dim 128, intermediate 8192,
vocabulary 32000: 1.3 B parameters) generates greedily with ``model.generate_batch`` for a batch
of random prompts of one length, once per implementation, batch size and prompt length:

    python python/examples/transformers_throughput.py --batch 8,32,128 --prompt 4096 > out.csv
    python python/examples/transformers_throughput.py --quick --device cpu     # a tiny check

What is measured (one row per run, CSV on stdout; progress on stderr):

- ``decode_tok_s``: tokens per second while every sequence of the batch decodes and none is in
  prefill or done. The engine interleaves prefill chunks with the decode steps of sequences
  already prefilled, so each run asks for enough new tokens to outlast the prefill
  (``--window`` decode steps after the last sequence's first token), and the window runs from
  the last sequence's first token to the first sequence's last token (Transformers' per-token
  timestamps, ``record_timestamps=True``). ``decode_step_ms`` is the window over its steps.
- ``prefill_s``: from the start of generate_batch to the last sequence's first token.
- ``attn_share``: the share of the model's forward time (GPU time on CUDA, from events) spent in
  attention, the layers' cache update (Transformers' gather of K/V for "sdpa" and "paged|eager",
  nothing for pagedattn, which writes the new tokens in its attention call) plus the attention
  function, over every ``--probe-every``-th decode-only pass (0 turns the probe off).
- ``tokens_equal``: sequences whose first ``--check-tokens`` tokens equal the first
  implementation's (bf16: two implementations may part at a near-tie of the logits, which random
  weights make common).

The references are skipped where they would take minutes: Transformers' paged "sdpa" and
"paged|eager" gather every sequence's context into one dense K/V per layer and attend with a
[tokens, all contexts] mask, so each pass costs as much as attending to the whole batch;
``--ref-max-tokens`` bounds batch x (prompt + new tokens) for them, and ``--eager-max-gb`` the
f32 scores of "paged|eager". Runs whose KV cache would not fit are skipped too; skipped runs are
rows with a note.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    p.add_argument("--impls", default="pagedattn,sdpa,paged|eager",
                   help="comma-separated attention implementations; the first is the token "
                        "reference of tokens_equal")
    p.add_argument("--batch", default=None, help="comma-separated batch sizes (8,32,128)")
    p.add_argument("--prompt", default=None,
                   help="comma-separated prompt lengths in tokens (4096)")
    p.add_argument("--window", type=int, default=32,
                   help="decode steps wanted with every sequence decoding")
    p.add_argument("--max-batch-tokens", type=int, default=4096,
                   help="the engine's token budget of one forward pass (prefill chunk size); "
                        "pagedattn's CUDA workspace grows with it times the batch")
    p.add_argument("--page-size", type=int, default=256, help="the engine's page size")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--ref-max-tokens", type=int, default=160_000,
                   help="skip the references above batch x (prompt + new) tokens")
    p.add_argument("--eager-max-gb", type=float, default=8.0,
                   help="skip paged|eager where one layer's f32 scores exceed this")
    p.add_argument("--check-tokens", type=int, default=8)
    p.add_argument("--probe-every", type=int, default=4,
                   help="time attention in every n-th decode-only pass (0: off)")
    p.add_argument("--quick", action="store_true",
                   help="a tiny model, batches 2 and 4, 64-token prompts (runs on a CPU)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.quick:
        a.layers, a.hidden, a.intermediate, a.heads, a.kv_heads = 2, 256, 512, 4, 2
        a.head_dim, a.vocab, a.page_size, a.max_batch_tokens, a.window = 64, 512, 16, 128, 8
    a.batch = a.batch or ("2,4" if a.quick else "8,32,128")
    a.prompt = a.prompt or ("64" if a.quick else "4096")
    a.batch = [int(x) for x in a.batch.split(",") if x]
    a.prompt = [int(x) for x in a.prompt.split(",") if x]
    a.impls = [x for x in a.impls.split(",") if x]
    if not a.impls or min(a.batch + a.prompt) < 1 or a.window < 1:
        p.error("need at least one implementation, batch and prompt lengths >= 1, --window >= 1")
    return a


class AttentionProbe:
    """Times attention (the layers' cache update plus the attention function) and the whole
    forward pass of every n-th decode-only pass: CUDA events on a GPU, the clock on a CPU."""

    def __init__(self, model, impl: str, every: int, cuda: bool) -> None:
        import torch
        from transformers import AttentionInterface
        from transformers.generation.continuous_batching import cache as cb_cache

        self.torch, self.cuda, self.every = torch, cuda, every
        self.decode_passes = 0
        self.current = None      # [start, end, [(start, end) per attention part]] of this pass
        self.samples = []
        self.removers = []
        key = impl.removeprefix("paged|") if impl != "paged|eager" else impl
        mapping = AttentionInterface._global_mapping
        attention, update = mapping[key], cb_cache.PagedAttentionCache.update
        mapping[key] = self._timed(attention)
        cb_cache.PagedAttentionCache.update = self._timed(update)

        def restore() -> None:
            mapping[key] = attention
            cb_cache.PagedAttentionCache.update = update

        self.removers.append(restore)
        self.removers.append(model.register_forward_pre_hook(self._pre, with_kwargs=True).remove)
        self.removers.append(model.register_forward_hook(self._post).remove)

    def _mark(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _elapsed_ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def _timed(self, fn):
        def timed(*args, **kwargs):
            if self.current is None:
                return fn(*args, **kwargs)
            start = self._mark()
            result = fn(*args, **kwargs)
            self.current[2].append((start, self._mark()))
            return result
        return timed

    def _pre(self, module, args, kwargs):
        self.current = None
        if kwargs.get("max_length_q") == 1:
            self.decode_passes += 1
            if self.every and self.decode_passes % self.every == 0:
                self.current = [self._mark(), None, []]

    def _post(self, module, args, output):
        if self.current is not None:
            self.current[1] = self._mark()
            self.samples.append(self.current)
            self.current = None

    def share(self):
        """(attention ms / forward ms over the sampled passes, number of passes), or None."""
        for remove in self.removers:
            remove()
        if not self.samples:
            return None
        if self.cuda:
            self.torch.cuda.synchronize()
        total = sum(self._elapsed_ms(s, e) for s, e, _ in self.samples)
        attention = sum(self._elapsed_ms(a, b) for _, _, parts in self.samples for a, b in parts)
        return attention / total if total > 0 else None, len(self.samples)


def build_model(a, device: str, dtype):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                         max_position_embeddings=max(a.prompt) + 4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                         bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(a.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.eval()


def kv_bytes_per_token(a, dtype) -> int:
    import torch
    return 2 * a.layers * a.kv_heads * a.head_dim * torch.empty((), dtype=dtype).element_size()


def new_tokens_for(a, batch: int, prompt: int) -> int:
    """Enough new tokens that every sequence still decodes `window` steps after the last one's
    prefill: each pass prefills at most max_batch_tokens minus the decode tokens beside it."""
    per_pass = max(1, a.max_batch_tokens - batch)
    return math.ceil(batch * prompt / per_pass) + 4 + a.window


def skip_reason(a, impl: str, batch: int, prompt: int, new: int, dtype, free_bytes) -> str:
    tokens = batch * (prompt + new)
    kv = tokens * kv_bytes_per_token(a, dtype)
    if free_bytes is not None and kv > 0.6 * free_bytes:
        return f"KV cache {kv / 2**30:.1f} GiB > 60% of free memory"
    if impl == a.impls[0] or impl == "pagedattn":
        return ""
    if tokens > a.ref_max_tokens:
        return f"reference skipped: {tokens} tokens > --ref-max-tokens {a.ref_max_tokens}"
    if impl == "paged|eager":
        scores = a.heads * a.max_batch_tokens * tokens * 4
        if scores > a.eager_max_gb * 2**30:
            return f"paged|eager skipped: scores {scores / 2**30:.0f} GiB > --eager-max-gb"
    return ""


def workspace_gib(a, batch: int, prompt: int, new: int, device: str, dtype) -> float:
    """pagedattn's CUDA workspace for the largest pass of a run: every sequence of the batch
    beside a prefill chunk of max_batch_tokens query tokens."""
    import torch
    import pagedattn

    q = torch.empty(a.max_batch_tokens, a.heads, a.head_dim, dtype=dtype, device=device)
    k = torch.empty(1, a.page_size, a.kv_heads, a.head_dim, dtype=dtype, device=device)
    table = torch.zeros(batch, -(-(prompt + new) // a.page_size), dtype=torch.int32,
                        device=device)
    return pagedattn.workspace_size(q, k, table, max_q_len=a.max_batch_tokens,
                                    kv_layout="NHD") / 2**30


def run_one(model, a, impl: str, prompts, new: int, device: str, probe: bool):
    """One generate_batch: (seconds, {request id: GenerationOutput}, attention share or None)."""
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model.set_attn_implementation(impl)
    batch = len(prompts)
    need = batch * (len(prompts[0]) + new)
    # Room for every sequence, plus the engine's safety margin (it admits no new prefill below
    # 15% free blocks) and a block per sequence of rounding.
    num_blocks = math.ceil(need / a.page_size / 0.8) + 2 * batch
    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    cb = ContinuousBatchingConfig(page_size=a.page_size, num_blocks=num_blocks,
                                  max_batch_tokens=a.max_batch_tokens,
                                  max_requests_per_batch=max(batch, 1),
                                  auto_switch_to_flash=False)
    cuda = device.startswith("cuda")
    timer = AttentionProbe(model, impl, a.probe_every, cuda) if probe and a.probe_every else None
    try:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate_batch(prompts, generation_config=gen,
                                       continuous_batching_config=cb, record_timestamps=True,
                                       progress_bar=False)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    finally:
        share = timer.share() if timer is not None else None
    if len(out) != batch or any(len(o.generated_tokens) != new for o in out.values()):
        raise RuntimeError(f"{impl}: generate_batch returned {len(out)} of {batch} sequences, or "
                           "fewer tokens than asked (see the engine's log above)")
    return seconds, t0, out, share


def decode_window(out, t0: float):
    """(prefill seconds, decode tokens/s, ms per step, steps) from the per-token timestamps."""
    stamps = [o.timestamps for o in out.values()]
    start = max(s[0] for s in stamps)     # the last sequence's first token: prefill done
    end = min(s[-1] for s in stamps)      # the first sequence's last token
    counts = [sum(1 for t in s if start < t <= end) for s in stamps]
    steps = max(counts) if counts else 0
    if end <= start or steps == 0:
        return start - t0, float("nan"), float("nan"), 0
    return start - t0, sum(counts) / (end - start), (end - start) * 1e3 / steps, steps


def main() -> int:
    a = parse_args()
    try:
        import torch
        import transformers  # noqa: F401
        import pagedattn
        import pagedattn.integrations.transformers as pa_tf
    except ImportError as e:
        log(f"transformers_throughput: needs torch, transformers and pagedattn: {e}")
        return 2
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        ok, why = pagedattn.cuda_available()
        if not torch.cuda.is_available() or not ok:
            log(f"transformers_throughput: --device {device}: no usable CUDA GPU for torch and "
                f"pagedattn ({why or 'torch sees none'})")
            return 2
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    pa_tf.register()

    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    log(f"# {gpu}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"pagedattn {getattr(pagedattn, '__version__', '?')}, {a.dtype}")
    t = time.perf_counter()
    model = build_model(a, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    log(f"# model: {a.layers} layers, hidden {a.hidden}, heads {a.heads}/{a.kv_heads} x "
        f"{a.head_dim}, intermediate {a.intermediate}, vocab {a.vocab}: {params / 1e9:.2f} B "
        f"parameters, built in {time.perf_counter() - t:.1f} s; KV "
        f"{kv_bytes_per_token(a, dtype) / 1024:.0f} KiB per token")

    gen = torch.Generator().manual_seed(a.seed + 1)
    w = csv.writer(sys.stdout)
    w.writerow(["impl", "device", "dtype", "batch", "prompt", "new_tokens", "max_batch_tokens",
                "page_size", "wall_s", "prefill_s", "decode_tok_s", "decode_step_ms",
                "decode_steps", "attn_share", "probed_passes", "tokens_equal", "note"])
    sys.stdout.flush()

    # One short run per implementation first: kernels load, the allocator warms up.
    warm = [torch.randint(1, a.vocab, (32,), generator=gen).tolist() for _ in range(2)]
    for impl in a.impls:
        try:
            run_one(model, a, impl, warm, 4, device, probe=False)
        except Exception as e:  # reported again by the real runs
            log(f"# warm-up {impl}: {type(e).__name__}: {e}")

    for prompt in a.prompt:
        for batch in a.batch:
            prompts = [torch.randint(1, a.vocab, (prompt,), generator=gen).tolist()
                       for _ in range(batch)]
            new = new_tokens_for(a, batch, prompt)
            first = None
            for impl in a.impls:
                row = [impl, device, a.dtype, batch, prompt, new, a.max_batch_tokens, a.page_size]
                free = None
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
                    free = torch.cuda.mem_get_info()[0]
                reason = skip_reason(a, impl, batch, prompt, new, dtype, free)
                if reason:
                    log(f"{impl:>12} B={batch:<4} P={prompt:<6} {reason}")
                    w.writerow(row + [""] * 8 + [reason])
                    sys.stdout.flush()
                    continue
                if impl == "pagedattn" and device.startswith("cuda"):
                    log(f"# pagedattn workspace, largest pass of B={batch} P={prompt}: "
                        f"{workspace_gib(a, batch, prompt, new, device, dtype):.2f} GiB")
                try:
                    seconds, t0, out, share = run_one(model, a, impl, prompts, new, device,
                                                      probe=True)
                except Exception as e:
                    note = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    log(f"{impl:>12} B={batch:<4} P={prompt:<6} {note}")
                    w.writerow(row + [""] * 8 + [note])
                    sys.stdout.flush()
                    continue
                prefill, tok_s, step_ms, steps = decode_window(out, t0)
                tokens = [o.generated_tokens[:a.check_tokens] for o in out.values()]
                if first is None:
                    first, equal = tokens, ""
                else:
                    equal = f"{sum(x == y for x, y in zip(tokens, first))}/{batch}"
                attn = "" if share is None or share[0] is None else f"{share[0]:.3f}"
                probed = "" if share is None else share[1]
                note = "" if steps >= a.window // 2 else "short decode window"
                w.writerow(row + [f"{seconds:.3f}", f"{prefill:.3f}", f"{tok_s:.1f}",
                                  f"{step_ms:.3f}", steps, attn, probed, equal, note])
                sys.stdout.flush()
                log(f"{impl:>12} B={batch:<4} P={prompt:<6} new={new:<4} wall {seconds:7.2f} s "
                    f"prefill {prefill:7.2f} s decode {tok_s:9.1f} tok/s ({step_ms:.2f} ms/step,"
                    f" {steps} steps) attention {attn or '-'} tokens equal "
                    f"{equal or '(reference)'}")
                del out
    return 0


if __name__ == "__main__":
    sys.exit(main())
