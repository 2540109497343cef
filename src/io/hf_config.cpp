// hf_config.cpp: config.json -> ModelConfig (contract in hf_config.h, keys in MODEL.md §1).
#include "io/hf_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/log.h"
#include "io/safetensors.h"

namespace k3 {

namespace {

using json = nlohmann::json;

// Reads keys of one JSON object; the first problem is kept in `st` and later reads are no-ops.
struct Keys {
  const json& obj;
  std::string prefix;  // "text_config." for K3
  std::string file;
  Status* st;

  std::string path(const char* key) const { return prefix + key; }
  bool failed() const { return !st->ok(); }
  void fail(Code c, const std::string& msg) {
    if (st->ok()) *st = error(c, file + ": " + msg);
  }
  void unsupported(const char* key, const std::string& value, const char* why) {
    fail(Code::unsupported, path(key) + " = " + value + " is not supported (" + why + ")");
  }
  const json* find(const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const char* key) const { return find(key) != nullptr; }

  // Integer in [lo, hi]; `required` or the default.
  int integer(const char* key, bool required, int def, int64_t lo, int64_t hi) {
    const json* v = find(key);
    if (failed()) return def;
    if (!v) {
      if (required) fail(Code::invalid_argument, "missing key " + path(key));
      return def;
    }
    if (!v->is_number_integer()) {
      fail(Code::invalid_argument, path(key) + " must be an integer, got " + v->dump());
      return def;
    }
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) {
      fail(Code::invalid_argument, path(key) + " = " + std::to_string(x) + " is out of range [" +
                                       std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return def;
    }
    return int(x);
  }
  double number(const char* key, bool required, double def) {
    const json* v = find(key);
    if (failed()) return def;
    if (!v) {
      if (required) fail(Code::invalid_argument, "missing key " + path(key));
      return def;
    }
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      fail(Code::invalid_argument, path(key) + " must be a finite number, got " + v->dump());
      return def;
    }
    return v->get<double>();
  }
  bool boolean(const char* key, bool def) {
    const json* v = find(key);
    if (failed() || !v) return def;
    if (!v->is_boolean())
      fail(Code::invalid_argument, path(key) + " must be true or false, got " + v->dump());
    return v->is_boolean() ? v->get<bool>() : def;
  }
  std::string string(const char* key, bool required, const std::string& def) {
    const json* v = find(key);
    if (failed()) return def;
    if (!v) {
      if (required) fail(Code::invalid_argument, "missing key " + path(key));
      return def;
    }
    if (!v->is_string()) fail(Code::invalid_argument, path(key) + " must be a string, got " + v->dump());
    return v->is_string() ? v->get<std::string>() : def;
  }
  // 1-based layer list, each entry in [1, n_layer], no repeats.
  std::vector<int> layer_list(const char* key, int n_layer) {
    std::vector<int> out;
    const json* v = find(key);
    if (failed()) return out;
    if (!v || !v->is_array()) {
      fail(Code::invalid_argument,
           v ? path(key) + " must be a list of 1-based layer numbers" : "missing key " + path(key));
      return out;
    }
    for (const json& e : *v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 1 || e.get<int64_t>() > n_layer) {
        fail(Code::invalid_argument, path(key) + " entry " + e.dump() + " is not a layer number in [1, " +
                                         std::to_string(n_layer) + "]");
        return {};
      }
      out.push_back(int(e.get<int64_t>()));
    }
    return out;
  }
  Keys sub(const char* key, bool required) {
    static const json kEmpty = json::object();
    const json* v = find(key);
    if (!failed() && required && !v) fail(Code::invalid_argument, "missing key " + path(key));
    if (!failed() && v && !v->is_object()) fail(Code::invalid_argument, path(key) + " must be an object");
    return Keys{v && v->is_object() ? *v : kEmpty, path(key) + ".", file, st};
  }
};

constexpr int64_t kMaxDim = 1 << 20, kMaxLayers = 4096;

void parse_quantization(Keys q, MoeConfig* moe) {
  const std::string method = q.string("quant_method", true, "");
  const std::string format = q.string("format", true, "");
  if (q.failed()) return;
  if (method != "compressed-tensors") return q.unsupported("quant_method", method, "only compressed-tensors");
  if (format != "mxfp4-pack-quantized") return q.unsupported("format", format, "only mxfp4-pack-quantized");
  Keys groups = q.sub("config_groups", false);
  for (auto it = groups.obj.begin(); it != groups.obj.end() && !q.failed(); ++it) {
    if (!it->is_object()) continue;
    Keys g{*it, groups.prefix + it.key() + ".", q.file, q.st};
    Keys w = g.sub("weights", false);
    if (w.has("num_bits") && w.integer("num_bits", true, 4, 0, 64) != 4)
      w.unsupported("num_bits", w.find("num_bits")->dump(), "MXFP4 is 4-bit");
    if (w.has("group_size") && w.integer("group_size", true, 32, 0, kMaxDim) != 32)
      w.unsupported("group_size", w.find("group_size")->dump(), "MXFP4 blocks are 32 wide");
    if (w.has("type") && w.string("type", true, "float") != "float")
      w.unsupported("type", w.find("type")->dump(), "MXFP4 elements are floats (E2M1)");
  }
  moe->experts_mxfp4 = true;
}

void parse_dsa(Keys d, ModelConfig& c, const std::vector<int>& full_attn) {
  for (const char* k : {"dsa_layers", "index_num_heads", "index_head_dim", "index_topk", "index_topk_freq",
                        "index_k_norm_type"})
    if (!d.has(k))
      return d.fail(Code::unsupported, "missing key " + d.path(k) + " (every dsa_config key is required)");
  std::vector<int> dsa_layers = d.layer_list("dsa_layers", c.n_layer);
  c.dsa.n_head = d.integer("index_num_heads", true, 0, 1, kMaxDim);
  c.dsa.d_head = d.integer("index_head_dim", true, 0, 1, kMaxDim);
  c.dsa.topk = d.integer("index_topk", true, 0, 1, int64_t(1) << 30);
  const int freq = d.integer("index_topk_freq", true, 1, INT32_MIN, INT32_MAX);
  const std::string norm = d.string("index_k_norm_type", true, "");
  if (d.failed()) return;
  if (freq != 1)
    return d.unsupported("index_topk_freq", std::to_string(freq), "every DSA layer runs its own indexer");
  if (norm != "layernorm") return d.unsupported("index_k_norm_type", "\"" + norm + "\"", "only layernorm");
  std::sort(dsa_layers.begin(), dsa_layers.end());
  if (dsa_layers != full_attn)
    return d.unsupported("dsa_layers", d.find("dsa_layers")->dump(),
                         "must equal linear_attn_config.full_attn_layers");
  if (c.mla.q_lora_rank == 0)
    return d.fail(Code::unsupported, "dsa_config needs q_lora_rank > 0 (the indexer reads the q latent)");
  if (d.has("index_skip_topk_offset"))
    K3_LOG_INFO("%s: %sindex_skip_topk_offset = %s is ignored (index_topk_freq = 1)", d.file.c_str(),
                d.prefix.c_str(), d.find("index_skip_topk_offset")->dump().c_str());
  c.dsa.enabled = true;
}

void parse_text(Keys t, ModelConfig& c) {
  c.d_model = t.integer("hidden_size", true, 0, 1, kMaxDim);
  c.n_layer = t.integer("num_hidden_layers", true, 0, 1, kMaxLayers);
  c.n_vocab = t.integer("vocab_size", true, 0, 1, int64_t(1) << 24);
  c.rms_norm_eps = float(t.number("rms_norm_eps", false, 1e-5));
  if (t.boolean("tie_word_embeddings", false))
    t.unsupported("tie_word_embeddings", "true", "the LM head is untied");
  if (const int n = t.integer("num_nextn_predict_layers", false, 0, INT32_MIN, INT32_MAX); n != 0)
    t.unsupported("num_nextn_predict_layers", std::to_string(n), "MTP layers are not implemented");

  Keys la = t.sub("linear_attn_config", true);
  c.kda.n_head = la.integer("num_heads", true, 0, 1, kMaxDim);
  c.kda.d_head = la.integer("head_dim", true, 0, 1, kMaxDim);
  c.kda.conv_size = la.integer("short_conv_kernel_size", true, 0, 1, 64);
  c.kda.full_rank_gate = la.boolean("use_full_rank_gate", false);
  c.kda.has_gate_lower_bound = la.has("gate_lower_bound");
  c.kda.gate_lower_bound = float(la.number("gate_lower_bound", false, 0.0));
  if (c.kda.has_gate_lower_bound && !(c.kda.gate_lower_bound < 0))
    la.unsupported("gate_lower_bound", la.find("gate_lower_bound")->dump(), "must be negative");
  std::vector<int> kda_layers = la.layer_list("kda_layers", c.n_layer);
  std::vector<int> full_attn = la.layer_list("full_attn_layers", c.n_layer);

  c.mla.n_head = t.integer("num_attention_heads", true, 0, 1, kMaxDim);
  c.mla.q_lora_rank = t.integer("q_lora_rank", false, 0, 1, kMaxDim);
  c.mla.kv_lora_rank = t.integer("kv_lora_rank", true, 0, 1, kMaxDim);
  c.mla.d_nope = t.integer("qk_nope_head_dim", true, 0, 0, kMaxDim);
  c.mla.d_rope = t.integer("qk_rope_head_dim", true, 0, 0, kMaxDim);
  c.mla.d_v = t.integer("v_head_dim", true, 0, 1, kMaxDim);
  if (!t.boolean("mla_use_nope", true)) t.unsupported("mla_use_nope", "false", "only NoPE MLA (no rotary)");
  c.mla.use_output_gate = t.boolean("mla_use_output_gate", false);

  const std::string act = t.string("hidden_act", true, "");
  if (act == "silu")
    c.act = Activation::silu;
  else if (act == "situ")
    c.act = Activation::situ;
  else if (!t.failed())
    t.unsupported("hidden_act", "\"" + act + "\"", "only silu and situ");
  if (c.act == Activation::situ) {
    c.situ_beta = float(t.number("activation_situ_beta", true, 4.0));
    c.has_situ_linear_beta = t.has("activation_situ_linear_beta");
    c.situ_linear_beta = float(t.number("activation_situ_linear_beta", false, 0.0));
    if (!(c.situ_beta > 0) || (c.has_situ_linear_beta && !(c.situ_linear_beta > 0)))
      t.unsupported("activation_situ_beta", "a non-positive value", "SiTU caps need beta > 0");
  }
  c.d_ff = t.integer("intermediate_size", true, 0, 1, kMaxDim);
  c.first_k_dense_replace = t.integer("first_k_dense_replace", false, 0, 0, kMaxLayers);
  c.moe_layer_freq = t.integer("moe_layer_freq", false, 1, 1, kMaxLayers);
  c.attn_res_block_size = t.integer("attn_res_block_size", false, 0, 0, kMaxLayers);

  MoeConfig& m = c.moe;
  m.n_expert = t.integer("num_experts", true, 0, 1, 1 << 16);
  m.n_expert_used = t.integer("num_experts_per_token", true, 0, 1, 1 << 16);
  m.n_shared_expert = t.integer("num_shared_experts", false, 0, 0, 1 << 10);
  m.d_ff_expert = t.integer("moe_intermediate_size", true, 0, 1, kMaxDim);
  m.d_latent = t.integer("routed_expert_hidden_size", false, 0, 1, kMaxDim);
  m.latent_norm = t.boolean("latent_moe_use_norm", false);
  m.renormalize = t.boolean("moe_renormalize", true);
  m.routed_scaling_factor = float(t.number("routed_scaling_factor", false, 1.0));
  m.n_expert_group = t.integer("num_expert_group", false, 1, INT32_MIN, INT32_MAX);
  m.topk_group = t.integer("topk_group", false, 1, INT32_MIN, INT32_MAX);
  if (m.n_expert_group != 1)
    t.unsupported("num_expert_group", std::to_string(m.n_expert_group), "grouped top-k; only 1");
  if (m.topk_group != 1) t.unsupported("topk_group", std::to_string(m.topk_group), "grouped top-k; only 1");
  if (const std::string f = t.string("moe_router_activation_func", false, "sigmoid"); f != "sigmoid")
    t.unsupported("moe_router_activation_func", "\"" + f + "\"", "only the sigmoid router");
  if (const std::string f = t.string("topk_method", false, "noaux_tc"); f != "noaux_tc")
    t.unsupported("topk_method", "\"" + f + "\"", "only noaux_tc (bias-corrected top-k)");
  if (!t.failed() && m.n_expert_used > m.n_expert)
    t.fail(Code::invalid_argument, t.path("num_experts_per_token") + " = " + std::to_string(m.n_expert_used) +
                                       " exceeds num_experts = " + std::to_string(m.n_expert));
  if (t.failed()) return;

  // Layer kinds: each layer in exactly one of kda_layers / full_attn_layers.
  std::vector<int> seen(size_t(c.n_layer), 0);
  for (int l : kda_layers) seen[size_t(l - 1)] += 1;
  for (int l : full_attn) seen[size_t(l - 1)] += 2;
  for (int i = 0; i < c.n_layer; ++i)
    if (seen[size_t(i)] != 1 && seen[size_t(i)] != 2)
      return t.fail(Code::invalid_argument,
                    "layer " + std::to_string(i + 1) + " (1-based) is in " +
                        (seen[size_t(i)] == 0 ? "neither" : "more than one") + " of " + la.prefix +
                        "kda_layers / full_attn_layers; every layer must be in exactly one");
  std::sort(full_attn.begin(), full_attn.end());
  Keys d = t.sub("dsa_config", false);
  if (t.has("dsa_config")) parse_dsa(d, c, full_attn);
  if (t.failed()) return;
  for (int i = 0; i < c.n_layer; ++i) {
    c.layer_attn.push_back(seen[size_t(i)] == 1 ? AttnKind::kda
                           : c.dsa.enabled      ? AttnKind::dsa
                                                : AttnKind::mla);
    c.layer_moe.push_back(i >= c.first_k_dense_replace && i % c.moe_layer_freq == 0);
  }
}

}  // namespace

Result<ModelConfig> parse_hf_config(std::string_view json_text, const std::string& file) {
  K3_ASSIGN_OR_RETURN(json top, parse_json_strict(json_text, file));
  if (!top.is_object()) return error(Code::invalid_argument, file + ": not a JSON object");
  Status st;
  Keys root{top, "", file, &st};
  ModelConfig c;
  c.model_type = root.string("model_type", true, "");
  if (!st.ok()) return st;
  const bool nested = c.model_type == "kimi_k3";
  if (!nested && c.model_type != "kimi_linear")
    return error(Code::unsupported,
                 file + ": model_type \"" + c.model_type + "\" is not supported (kimi_linear or kimi_k3)");
  Keys text = nested ? root.sub("text_config", true) : root;
  if (!st.ok()) return st;
  c.family = !nested ? Family::kimi_linear : text.has("dsa_config") ? Family::k3_1 : Family::k3;
  if (nested && root.boolean("tie_word_embeddings", false))
    root.unsupported("tie_word_embeddings", "true", "the LM head is untied");
  parse_text(text, c);
  if (root.has("quantization_config")) parse_quantization(root.sub("quantization_config", true), &c.moe);
  if (!st.ok()) return st;
  // Token ids: text keys first, then the top level.
  auto id = [&](const char* key) {
    for (Keys* k : {&text, &root}) {  // a list (eos_token_id: [a, b]) gives its first entry
      const json* v = k->find(key);
      if (v && v->is_array() && !v->empty() && (*v)[0].is_number_integer()) {
        const int64_t x = (*v)[0].get<int64_t>();
        if (x >= 0 && x < c.n_vocab) return int(x);
      }
      if (v && !v->is_array()) return k->integer(key, false, -1, 0, c.n_vocab - 1);
    }
    return -1;
  };
  c.bos_id = id("bos_token_id");
  c.eos_id = id("eos_token_id");
  c.pad_id = id("pad_token_id");
  if (!st.ok()) return st;
  return c;
}

Result<ModelConfig> load_hf_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(Code::not_found, path + ": cannot open (missing config.json?)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_hf_config(ss.str(), path);
}

}  // namespace k3
