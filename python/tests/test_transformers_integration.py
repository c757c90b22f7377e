"""pagedattn as Hugging Face Transformers' continuous-batching attention, end to end.

Small randomly initialized models built from configs (nothing is downloaded) generate greedily
for 32 prompts of mixed lengths with Transformers' own paged attention and with pagedattn; the
tokens must be the same and the logits of every forward pass close. On the CPU in f32; on a CUDA
GPU too (with a pagedattn built with CUDA) in f32, the same checks, and in bf16, where two
implementations that round differently may pick different tokens where the reference's two best
logits are nearly tied: there each sequence's tokens must agree up to its first difference, and
that difference must sit at a near-tie (pagedattn's token within BF16_TIE_GAP of the reference's
best logit, recomputed by a plain forward pass of the reference on the common prefix). Skips without
PyTorch or Transformers (pip install '.[transformers]').
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.generation.continuous_batching")

import pagedattn  # noqa: E402
import pagedattn.integrations.transformers as pa_tf  # noqa: E402

NUM_PROMPTS = 32
NEW_TOKENS = 64
PAGE_SIZE = 16          # several pages per sequence: prompts are 1 to 99 tokens, plus 64 new
MAX_BATCH_TOKENS = 256  # long prompts are prefilled in chunks, next to other sequences' decodes
VOCAB = 512
# f32 (CPU, and CUDA with 3xTF32 tensor-core products): the two implementations sum in different
# orders, nothing more.
LOGITS_ATOL, LOGITS_RTOL = 2e-3, 1e-4
# bf16: both implementations round every layer's attention output to bf16 (at different points)
# and the logits are bf16 (an ulp is 0.0625 at |logit| 8 to 16; these models' logits reach about
# 15). Measured on the CPU: at most 0.22 (Llama-style) and 0.56 (gpt-oss-style) apart, 0.03 and
# 0.06 on average, before the first differing token. A kernel error moves them by whole units.
BF16_LOGITS_ATOL, BF16_LOGITS_MEAN = 1.0, 0.1
# A token may differ only where the reference's best logit and the logit of pagedattn's token are
# closer than this (4 ulps at 8 to 16): greedy decoding then picks either, by rounding alone.
# Measured on the CPU: every Llama-style difference within 0.125.
BF16_TIE_GAP = 0.25


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and pagedattn.cuda_available()[0]


# (device, dtype) of the end-to-end runs: the CPU in f32 always, a CUDA GPU in f32 and bf16.
DEVICES = [pytest.param("cpu", torch.float32, id="cpu-f32")] + [
    pytest.param("cuda", dtype, id=f"cuda-{name}", marks=pytest.mark.skipif(
        not _cuda_ready(), reason="needs a CUDA GPU and a pagedattn built with CUDA"))
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16"))]


@pytest.fixture(scope="module", autouse=True)
def _registered():
    pa_tf.register()


def _prompts(seed: int = 1) -> list:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 100, (NUM_PROMPTS,), generator=g)
    return [torch.randint(1, VOCAB, (int(n),), generator=g).tolist() for n in lengths]


def _generate(model, impl: str, prompts: list):
    """Greedy generate_batch with attention `impl`: ({request id: tokens}, [logits per pass])."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model.set_attn_implementation(impl)
    assert model.config._attn_implementation == impl.removeprefix("paged|") or impl == "paged|eager"
    logits = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: logits.append(o.detach().clone()))
    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    # auto_switch_to_flash=False: a bf16 model keeps the implementation under test.
    cb = ContinuousBatchingConfig(page_size=PAGE_SIZE, num_blocks=256,
                                  max_batch_tokens=MAX_BATCH_TOKENS, auto_switch_to_flash=False)
    try:
        with torch.no_grad():
            out = model.generate_batch(prompts, generation_config=gen,
                                       continuous_batching_config=cb, progress_bar=False)
    finally:
        hook.remove()
    return {k: list(v.generated_tokens) for k, v in out.items()}, logits


def _compare(model, reference: str, monkeypatch, plain_reference: Optional[str]) -> dict:
    """Generates with `reference` and with pagedattn and checks tokens and logits.

    f32: the same tokens, the logits of every forward pass within LOGITS_ATOL / LOGITS_RTOL.
    bf16: the logits within BF16_LOGITS_ATOL (and BF16_LOGITS_MEAN on average) for every pass
    up to the first in which a sampled token differs (later passes read different tokens); each
    sequence's tokens equal up to its first difference, which must be a near-tie of the reference
    (`plain_reference`, the reference's implementation for a plain forward pass, recomputes the
    gap; None skips the token check)."""
    prompts = _prompts()
    ref_tokens, ref_logits = _generate(model, reference, prompts)

    # Count how pagedattn is called, to see the in-place path run (and on what).
    calls = {"write_cache": 0, "decode_paged": 0, "decode_gathered": 0, "multi_token": 0}
    write_cache, decode = pagedattn.write_cache, pagedattn.decode

    def counting_write_cache(*args, **kwargs):
        calls["write_cache"] += 1
        return write_cache(*args, **kwargs)

    def counting_decode(q, k_cache, v_cache, *args, **kwargs):
        calls["decode_paged" if k_cache.shape[1] == PAGE_SIZE else "decode_gathered"] += 1
        calls["multi_token"] += kwargs.get("max_q_len", 1) > 1
        return decode(q, k_cache, v_cache, *args, **kwargs)

    monkeypatch.setattr(pagedattn, "write_cache", counting_write_cache)
    monkeypatch.setattr(pagedattn, "decode", counting_decode)
    tokens, logits = _generate(model, "pagedattn", prompts)

    assert len(tokens) == NUM_PROMPTS
    assert all(len(t) == NEW_TOKENS for t in tokens.values())
    # The engine schedules by token counts only, so both runs make the same forward passes.
    assert len(logits) == len(ref_logits)
    if model.dtype != torch.bfloat16:
        for rid, ref in ref_tokens.items():
            assert tokens[rid] == ref, rid
        for step, (got, want) in enumerate(zip(logits, ref_logits)):
            torch.testing.assert_close(got, want, atol=LOGITS_ATOL, rtol=LOGITS_RTOL,
                                       msg=lambda m: f"forward pass {step}: {m}")
        return calls

    for step, (got, want) in enumerate(zip(logits, ref_logits)):
        diff = (got.float() - want.float()).abs()
        assert diff.max() <= BF16_LOGITS_ATOL and diff.mean() <= BF16_LOGITS_MEAN, (
            f"forward pass {step} (bf16): logits differ by {diff.max():.3f} at most, "
            f"{diff.mean():.4f} on average (bounds {BF16_LOGITS_ATOL}, {BF16_LOGITS_MEAN})")
        if not torch.equal(got.argmax(-1), want.argmax(-1)):
            break  # a sampled token differs: the next passes' inputs differ
    if plain_reference is None:
        return calls
    diverged = []
    for i, (rid, ref) in enumerate(ref_tokens.items()):
        got = tokens[rid]
        first = next((t for t, (a, b) in enumerate(zip(got, ref)) if a != b), None)
        if first is None:
            continue
        gap = _logit_gap(model, plain_reference, prompts[i] + ref[:first], got[first])
        assert gap < BF16_TIE_GAP, (
            f"{rid}: token {first} is {got[first]}, the reference's {ref[first]}, but its logit "
            f"is {gap:.3f} below the reference's best there (a near-tie is < {BF16_TIE_GAP})")
        diverged.append(first)
    calls["diverged"] = diverged
    return calls


def _logit_gap(model, impl: str, ids: list, token: int) -> float:
    """How far `token`'s next-token logit after `ids` is below the best one: a plain forward
    pass with `impl` (the reference's implementation outside continuous batching)."""
    model.set_attn_implementation(impl)
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0, -1].float()
    return float(logits.max() - logits[token])


def _llama(device: str, dtype) -> "torch.nn.Module":
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=64, initializer_range=0.2, max_position_embeddings=1024,
                         bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                             dtype=torch.float32)
    # Initialized in f32 on the CPU (the same weights everywhere), then moved.
    return model.to(device=device, dtype=dtype).eval()


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_llama_gqa_matches_sdpa(monkeypatch, device, dtype):
    model = _llama(device, dtype)
    calls = _compare(model, "sdpa", monkeypatch, "sdpa")
    # Every layer of every pass ran on the engine's pages: a write and a paged decode each,
    # prefill chunks (several query tokens) included.
    assert calls["decode_gathered"] == 0
    assert calls["write_cache"] == calls["decode_paged"] > 0
    assert calls["multi_token"] > 0


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_gpt_oss_sinks_sliding_window_matches_eager(monkeypatch, device, dtype):
    cls = getattr(transformers, "GptOssConfig", None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no gpt-oss")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = cls(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 initializer_range=0.2, num_local_experts=4, num_experts_per_tok=2,
                 sliding_window=24, layer_types=["sliding_attention", "full_attention"],
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                 max_position_embeddings=1024, bos_token_id=None, eos_token_id=None,
                 pad_token_id=0)
    # gpt-oss has no SDPA path (its sinks); Transformers' paged reference for it is paged|eager.
    model = AutoModelForCausalLM.from_config(config, attn_implementation="paged|eager",
                                             dtype=torch.float32)
    model = model.to(device=device, dtype=dtype).eval()
    assert model.model.layers[0].self_attn.sliding_window == 24
    # In bf16 its router's top-2 expert choice has near-ties of its own, which change a token by
    # more than a logit near-tie explains: there only the logits are compared.
    calls = _compare(model, "paged|eager", monkeypatch,
                     None if dtype == torch.bfloat16 else "eager")
    # The full-attention layer runs on the pages; the sliding layer on the engine's gathered
    # window (its ring buffer is no block table).
    assert calls["decode_paged"] == calls["decode_gathered"] == calls["write_cache"] > 0


def _reference(q, k, v, lens_q, lens_k, scale, window, cap, sinks):
    """Per-sequence causal attention with the variants, in float64."""
    out = []
    start_q = start_k = 0
    group = q.shape[1] // k.shape[1]
    for n, L in zip(lens_q, lens_k):
        for i in range(n):
            P = L - n + i
            qi = q[start_q + i].double()                                   # [H, D]
            kk = k[start_k:start_k + P + 1].double().repeat_interleave(group, 1)
            vv = v[start_k:start_k + P + 1].double().repeat_interleave(group, 1)
            s = torch.einsum("hd,thd->ht", qi, kk) * scale
            if cap:
                s = cap * torch.tanh(s / cap)
            t = torch.arange(P + 1)
            if window is not None:
                s = s.masked_fill((t <= P - window)[None, :], -math.inf)
            m = s.max(dim=1, keepdim=True).values
            if sinks is not None:
                m = torch.maximum(m, sinks.double()[:, None])
            e = torch.exp(s - m)
            den = e.sum(dim=1, keepdim=True)
            if sinks is not None:
                den = den + torch.exp(sinks.double()[:, None] - m)
            out.append(torch.einsum("ht,thd->hd", e / den, vv))
        start_q += n
        start_k += L
    return torch.stack(out)


@pytest.mark.parametrize("window,cap,with_sinks", [(None, 30.0, False), (8, 5.0, True)])
def test_gathered_call_maps_variants(window, cap, with_sinks):
    """The attention function on dense K/V (the path of sliding-window layers) with a soft-cap,
    a window and sinks, against the definition. No Transformers model has a soft-cap on a paged
    reference to compare with end to end (its SDPA refuses one, paged|eager ignores it)."""
    g = torch.Generator().manual_seed(3)
    H, KV, D = 8, 2, 64
    lens_q, lens_k = [3, 1, 5], [10, 20, 5]
    q = torch.randn(1, sum(lens_q), H, D, generator=g).transpose(1, 2)   # [1, H, T, D]
    k = torch.randn(1, sum(lens_k), KV, D, generator=g).transpose(1, 2)  # [1, KV, N, D]
    v = torch.randn(1, sum(lens_k), KV, D, generator=g).transpose(1, 2)
    sinks = torch.randn(H, generator=g) if with_sinks else None

    class Module(torch.nn.Module):
        pass

    cu = lambda lens: torch.tensor(np.cumsum([0] + lens), dtype=torch.int32)  # noqa: E731
    out, weights = pa_tf.attention_forward(
        Module(), q, k, v, None, scaling=0.125, sliding_window=window, softcap=cap, s_aux=sinks,
        cu_seq_lens_q=cu(lens_q), cu_seq_lens_k=cu(lens_k), max_length_q=max(lens_q),
        max_length_k=max(lens_k))
    assert weights is None and out.shape == (1, sum(lens_q), H, D)
    want = _reference(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), lens_q,
                      lens_k, 0.125, window, cap, sinks)
    torch.testing.assert_close(out[0].double(), want, atol=1e-5, rtol=1e-5)


def test_register_refuses_bad_names():
    for name in ("", "paged|pagedattn", "pagedattn_flash", 3):
        with pytest.raises(pagedattn.Error) as e:
            pa_tf.register(name)
        assert e.value.argument == "name"
    assert pa_tf.register() == "pagedattn"
    assert "pagedattn" in transformers.AttentionInterface().valid_keys()


def test_outside_continuous_batching_is_sdpa():
    """A plain forward pass and generate (no paged cache) give SDPA's results."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=64, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                             dtype=torch.float32).eval()
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
        want_ids = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
        model.set_attn_implementation("pagedattn")
        got = model(ids, attention_mask=mask).logits
        got_ids = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert torch.equal(got_ids, want_ids)
