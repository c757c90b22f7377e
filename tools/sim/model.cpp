#include "sim/model.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace pagedattn::sim {
namespace {

Model preset(const char* name, int layers, int heads, int kv_heads, int head_dim,
             const char* source) {
  Model m{name, layers, heads, kv_heads, head_dim};  // the fields in declaration order
  m.source = source;
  return m;
}

std::vector<Model> make_presets() {
  std::vector<Model> p;
  p.push_back(preset("llama-3.1-8b", 32, 32, 8, 128,
                     "meta-llama/Llama-3.1-8B config.json: num_hidden_layers, "
                     "num_attention_heads, num_key_value_heads, hidden_size / heads"));
  // Tensor parallel 8 splits the 64 query and 8 kv heads evenly: one GPU's share.
  p.push_back(preset("llama-3.1-70b-tp8", 80, 64 / 8, 8 / 8, 128,
                     "meta-llama/Llama-3.1-70B config.json (64 heads, 8 kv heads), "
                     "divided by tensor parallel 8"));
  p.push_back(preset("qwen3-32b", 64, 64, 8, 128,
                     "Qwen/Qwen3-32B config.json: num_hidden_layers, num_attention_heads, "
                     "num_key_value_heads, head_dim"));
  Model oss = preset("gpt-oss-120b", 36, 64, 8, 64,
                     "openai/gpt-oss-120b config.json: num_hidden_layers, num_attention_heads, "
                     "num_key_value_heads, head_dim, sliding_window, layer_types; sinks "
                     "from the model card");
  oss.sliding_window = 128;
  oss.full_every = 2;  // layer_types alternate sliding_attention, full_attention
  oss.sinks = true;
  p.push_back(oss);
  Model gemma = preset("gemma-3-27b", 62, 32, 16, 128,
                       "google/gemma-3-27b-it config.json text_config: num_hidden_layers, "
                       "num_attention_heads, num_key_value_heads, head_dim, sliding_window, "
                       "sliding_window_pattern, query_pre_attn_scalar, attn_logit_softcapping");
  gemma.sliding_window = 1024;
  gemma.full_every = 6;                  // sliding_window_pattern: 5 local, then 1 global
  gemma.scale = 1.f / std::sqrt(168.f);  // query_pre_attn_scalar = 168, not head_dim
  p.push_back(gemma);                    // attn_logit_softcapping: null (no soft-cap)
  // Tensor parallel 8 splits the 128 query heads; the latent row is every head's, so each GPU
  // caches all of it.
  Model deepseek = preset("deepseek-v3-tp8", 61, 128 / 8, 1, 0,
                          "deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers, "
                          "num_attention_heads / tensor parallel 8, kv_lora_rank, "
                          "qk_rope_head_dim, qk_nope_head_dim + qk_rope_head_dim, rope_scaling");
  deepseek.kv_lora_rank = 512;
  deepseek.rope_dim = 64;
  // DeepSeek's softmax scale: qk_head_dim^-1/2 (128 + 64 = 192) times YaRN's mscale squared,
  // mscale = 0.1 * mscale_all_dim * ln(factor) + 1 with factor 40 and mscale_all_dim 1.
  const float mscale = 0.1f * std::log(40.f) + 1.f;
  deepseek.scale = mscale * mscale / std::sqrt(192.f);
  p.push_back(deepseek);
  return p;
}

}  // namespace

int Model::window_left(int layer) const {
  if (sliding_window <= 0) return -1;
  return (layer + 1) % std::max(1, full_every) == 0 ? -1 : sliding_window - 1;
}

int Model::sliding_layers() const {
  int n = 0;
  for (int l = 0; l < layers; ++l) n += sliding(l) ? 1 : 0;
  return n;
}

std::string Model::describe() const {
  std::ostringstream os;
  os << name << ": " << layers << " layers, H=" << num_heads;
  if (mla()) {
    os << ", MLA latent " << kv_lora_rank << " + " << rope_dim;
    if (scale > 0) os << ", scale " << scale;
    return os.str();
  }
  os << " KV=" << num_kv_heads << " D=" << head_dim;
  const int s = sliding_layers();
  if (s > 0) os << ", window " << sliding_window << " on " << s << " of " << layers << " layers";
  if (sinks) os << ", sinks";
  if (logits_soft_cap > 0) os << ", soft-cap " << logits_soft_cap;
  if (scale > 0) os << ", scale " << scale;
  return os.str();
}

const std::vector<Model>& model_presets() {
  static const std::vector<Model> presets = make_presets();
  return presets;
}

const Model* find_model(const std::string& name) {
  static const Model custom = [] {
    Model m;
    m.name = "custom";
    m.source = "the shape flags";
    return m;
  }();
  if (name == "custom") return &custom;
  for (const Model& m : model_presets()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::string model_names() {
  std::string names;
  for (const Model& m : model_presets()) names += m.name + ", ";
  return names + "custom";
}

std::vector<int> sample_layers(const Model& model, int count) {
  const int n = std::clamp(count, 1, model.layers);
  std::vector<int> picked;
  for (int i = 0; i < n; ++i) picked.push_back(static_cast<int>((i + 0.5) * model.layers / n));
  // Both kinds of layer present in the model should be timed: swap one in where missing.
  const int sliding = model.sliding_layers();
  if (n >= 2 && sliding > 0 && sliding < model.layers) {
    for (const bool want_sliding : {true, false}) {
      const auto has = [&](int l) { return model.sliding(l) == want_sliding; };
      if (std::any_of(picked.begin(), picked.end(), has)) continue;
      int l = picked.back();
      while (!has(l)) l = (l + 1) % model.layers;
      picked[want_sliding ? 0 : n - 1] = l;
    }
  }
  std::sort(picked.begin(), picked.end());
  picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
  return picked;
}

}  // namespace pagedattn::sim
