// The attention shape of a served model and its per-layer variants, from public configs
// (docs/simulator.md names each config.json field), or given as flags (--model custom).
#pragma once

#include <string>
#include <vector>

namespace pagedattn::sim {

struct Model {
  std::string name;
  int layers = 2;  // attention layers of the whole model
  int num_heads = 16;
  int num_kv_heads = 2;
  int head_dim = 128;
  // Sliding-window layers attend to the last `sliding_window` tokens, the query's own included
  // (DecodeArgs::window_left = sliding_window - 1); 0: no sliding-window layer.
  int sliding_window = 0;
  // Layer l (from 0) attends to the whole context when (l + 1) % full_every == 0 and to the
  // window otherwise; 1 with a window: every layer full.
  int full_every = 1;
  bool sinks = false;           // a learned sink logit per query head on every layer
  float logits_soft_cap = 0.f;  // 0: none
  float scale = 0.f;            // 0: 1 / sqrt(head_dim) (MLA: 1 / sqrt(kv_lora_rank + rope_dim))
  // Multi-head latent attention (docs/mla.md) when kv_lora_rank > 0: one latent row of
  // kv_lora_rank + rope_dim values per token and layer, shared by all num_heads query heads,
  // decoded by mla_decode; num_kv_heads, head_dim and the variants above do not apply.
  int kv_lora_rank = 0;
  int rope_dim = 0;
  std::string source;  // where the numbers come from

  bool mla() const { return kv_lora_rank > 0; }
  // Elements of one token's cache row in one layer, over all kv heads: K's (V's the same), or
  // the latent row.
  int row_elements() const { return mla() ? kv_lora_rank + rope_dim : num_kv_heads * head_dim; }
  // Cache rows a token holds per layer: K and V, or the one latent row.
  int rows_per_token() const { return mla() ? 1 : 2; }

  // DecodeArgs::window_left of layer `layer`: -1 (the whole context) or sliding_window - 1.
  int window_left(int layer) const;
  bool sliding(int layer) const { return window_left(layer) >= 0; }
  // Layers of the model that slide (the rest are full).
  int sliding_layers() const;
  // One line: "llama-3.1-8b: 32 layers, H=32 KV=8 D=128, ...", or for MLA
  // "deepseek-v3-tp8: 61 layers, H=16, MLA latent 512 + 64, ..."
  std::string describe() const;
};

// The presets in --help order; "custom" is not among them.
const std::vector<Model>& model_presets();
// The preset named `name`, or the custom base (the shape flags' defaults) for "custom"; nullptr
// for an unknown name.
const Model* find_model(const std::string& name);
// "llama-3.1-8b, ..., custom"
std::string model_names();

// `count` layers of `model` to simulate, spread over the model, ascending, with at least one
// sliding and one full layer where the model has both and count >= 2.
std::vector<int> sample_layers(const Model& model, int count);

}  // namespace pagedattn::sim
