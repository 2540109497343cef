// manifest.cpp: the expected-tensor list of a ModelConfig and the check against a checkpoint (manifest.h).
#include "io/manifest.h"

#include <algorithm>
#include <cstring>

namespace k3 {

namespace {

const std::vector<DType> kBf16 = {DType::bf16};
const std::vector<DType> kF32 = {DType::f32};
const std::vector<DType> kBf16OrF32 = {DType::bf16, DType::f32};
const std::vector<DType> kU8 = {DType::u8};

struct Builder {
  std::vector<ExpectedTensor>* out;
  int layer = -1;
  void add(std::string name, std::vector<int64_t> shape, const std::vector<DType>& dtypes,
           bool routed = false, int64_t n_param = -1) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    out->push_back({std::move(name), {std::move(shape)}, dtypes, layer, routed, n_param < 0 ? n : n_param});
  }
};

void add_kda(Builder& b, const ModelConfig& c, const std::string& a) {
  const int64_t D = c.d_model, H = c.kda.n_head, K = c.kda.d_head, HK = H * K, R = c.kda.gate_rank;
  const bool k3 = c.family != Family::kimi_linear;
  for (const char* x : {"q", "k", "v"}) {
    b.add(a + x + "_proj.weight", {HK, D}, kBf16);
    b.add(a + x + "_conv1d.weight", {HK, 1, c.kda.conv_size}, k3 ? kF32 : kBf16OrF32);
  }
  b.add(a + "f_a_proj.weight", {R, D}, kBf16);
  b.add(a + "f_b_proj.weight", {HK, R}, kBf16);
  b.add(a + "b_proj.weight", {H, D}, kBf16);
  b.add(a + "dt_bias", {HK}, kF32);
  if (k3) {  // [K] as released (H values, then zeros), or exactly [H]
    b.add(a + "A_log", {std::max(H, K)}, kF32, false, H);
    if (K != H) b.out->back().shapes.push_back({H});
  } else {
    b.add(a + "A_log", {1, 1, H, 1}, kF32);
  }
  if (c.kda.full_rank_gate) {
    b.add(a + "g_proj.weight", {HK, D}, kBf16);
  } else {
    b.add(a + "g_a_proj.weight", {R, D}, kBf16);
    b.add(a + "g_b_proj.weight", {HK, R}, kBf16);
  }
  b.add(a + "o_norm.weight", {K}, k3 ? kF32 : kBf16OrF32);
  b.add(a + "o_proj.weight", {D, HK}, kBf16);
}

void add_mla(Builder& b, const ModelConfig& c, const std::string& a) {
  const MlaConfig& m = c.mla;
  const int64_t D = c.d_model, nh = m.n_head, qr = m.q_lora_rank, kvr = m.kv_lora_rank;
  if (qr > 0) {
    b.add(a + "q_a_proj.weight", {qr, D}, kBf16);
    b.add(a + "q_a_layernorm.weight", {qr}, kBf16);
    b.add(a + "q_b_proj.weight", {nh * m.d_qk(), qr}, kBf16);
  } else {
    b.add(a + "q_proj.weight", {nh * m.d_qk(), D}, kBf16);
  }
  b.add(a + "kv_a_proj_with_mqa.weight", {kvr + m.d_rope, D}, kBf16);
  b.add(a + "kv_a_layernorm.weight", {kvr}, kBf16);
  b.add(a + "kv_b_proj.weight", {nh * (m.d_nope + m.d_v), kvr}, kBf16);
  b.add(a + "o_proj.weight", {D, nh * m.d_v}, kBf16);
  if (m.use_output_gate) b.add(a + "g_proj.weight", {nh * m.d_v, D}, kBf16);
}

void add_dsa(Builder& b, const ModelConfig& c, const std::string& a) {
  const int64_t ih = c.dsa.n_head, id = c.dsa.d_head;
  b.add(a + "indexer.wq_b.weight", {ih * id, c.mla.q_lora_rank}, kBf16OrF32);
  b.add(a + "indexer.wk.weight", {id, c.d_model}, kBf16OrF32);
  b.add(a + "indexer.weights_proj.weight", {ih, c.d_model}, kBf16OrF32);
  b.add(a + "indexer.k_norm.weight", {id}, kBf16OrF32);
  b.add(a + "indexer.k_norm.bias", {id}, kBf16OrF32);
}

void add_moe(Builder& b, const ModelConfig& c, const std::string& m,
             const std::function<bool(const std::string&)>& has) {
  const MoeConfig& e = c.moe;
  const int64_t D = c.d_model, F = e.d_ff_expert, Fs = int64_t(e.n_shared_expert) * F;
  b.add(m + "gate.weight", {e.n_expert, D}, kBf16OrF32);
  b.add(m + "gate.e_score_correction_bias", {e.n_expert}, kF32);
  if (Fs > 0) {
    b.add(m + "shared_experts.gate_proj.weight", {Fs, D}, kBf16);
    b.add(m + "shared_experts.up_proj.weight", {Fs, D}, kBf16);
    b.add(m + "shared_experts.down_proj.weight", {D, Fs}, kBf16);
  }
  const int64_t Din = e.d_latent > 0 ? e.d_latent : D;
  if (e.d_latent > 0) {
    b.add(m + "routed_expert_down_proj.weight", {Din, D}, kBf16);
    if (e.latent_norm) b.add(m + "routed_expert_norm.weight", {Din}, kBf16);
    b.add(m + "routed_expert_up_proj.weight", {D, Din}, kBf16);
  }
  for (int x = 0; x < e.n_expert; ++x) {
    const std::string p = m + "experts." + std::to_string(x) + ".";
    for (const char* w : {"w1", "w3", "w2"}) {
      const bool down = !std::strcmp(w, "w2");
      const int64_t out = down ? Din : F, in = down ? F : Din;
      const std::string n = p + w;
      const bool mxfp4 = has(n + ".weight_packed") || (!has(n + ".weight") && e.experts_mxfp4);
      if (mxfp4) {  // in % 32 != 0 cannot be MXFP4: the shape below then never matches
        b.add(n + ".weight_packed", {out, in % 32 ? -1 : in / 2}, kU8, true, out * in);
        b.add(n + ".weight_scale", {out, in % 32 ? -1 : in / 32}, kU8, true, 0);
      } else {
        b.add(n + ".weight", {out, in}, kBf16, true);
      }
    }
  }
}

bool ends_with(const std::string& s, const char* suf) {
  const size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

std::string shapes_str(const std::vector<std::vector<int64_t>>& shapes) {
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i) s += " or ";
    s += shape_str(shapes[i]);
  }
  return s;
}

std::string dtypes_str(const std::vector<DType>& dtypes) {
  std::string s;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (i) s += '|';
    s += dtype_name(dtypes[i]);
  }
  return s;
}

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c,
                                             const std::function<bool(const std::string&)>& has) {
  std::vector<ExpectedTensor> out;
  Builder b{&out};
  const int64_t D = c.d_model, V = c.n_vocab;
  b.add("model.embed_tokens.weight", {V, D}, kBf16);
  b.add("model.norm.weight", {D}, kBf16);
  b.add("lm_head.weight", {V, D}, kBf16);
  if (c.uses_attn_res()) {
    b.add("model.output_attn_res_proj.weight", {1, D}, kBf16);
    b.add("model.output_attn_res_norm.weight", {D}, kBf16);
  }
  for (int i = 0; i < c.n_layer && i < int(c.layer_attn.size()); ++i) {
    b.layer = i;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    b.add(p + "input_layernorm.weight", {D}, kBf16);
    b.add(p + "post_attention_layernorm.weight", {D}, kBf16);
    if (c.uses_attn_res())
      for (const char* s : {"self_attention_res", "mlp_res"}) {
        b.add(p + s + "_proj.weight", {1, D}, kBf16);
        b.add(p + s + "_norm.weight", {D}, kBf16);
      }
    const std::string a = p + "self_attn.";
    if (c.layer_attn[size_t(i)] == AttnKind::kda) {
      add_kda(b, c, a);
    } else {
      add_mla(b, c, a);
      if (c.layer_attn[size_t(i)] == AttnKind::dsa) add_dsa(b, c, a);
    }
    if (c.layer_moe[size_t(i)]) {
      add_moe(b, c, p + "block_sparse_moe.", has);
    } else {
      b.add(p + "mlp.gate_proj.weight", {c.d_ff, D}, kBf16);
      b.add(p + "mlp.up_proj.weight", {c.d_ff, D}, kBf16);
      b.add(p + "mlp.down_proj.weight", {D, c.d_ff}, kBf16);
    }
  }
  return out;
}

ParamCount count_params(const ModelConfig& c, const std::vector<ExpectedTensor>& manifest) {
  ParamCount n;
  int64_t routed = 0;
  for (const ExpectedTensor& t : manifest) {
    n.total += t.n_param;
    if (t.routed_expert)
      routed += t.n_param;
    else
      n.active += t.n_param;
  }
  if (c.moe.n_expert > 0) n.active += routed / c.moe.n_expert * c.moe.n_expert_used;
  return n;
}

Status check_manifest(const ModelConfig& c, const std::vector<ExpectedTensor>& manifest,
                      const std::function<const TensorView*(const std::string&)>& find,
                      const std::string& where) {
  constexpr size_t kNamed = 6;
  std::vector<std::string> problems;
  size_t n_problems = 0;
  auto report = [&](std::string msg) {
    if (problems.size() < kNamed) problems.push_back(std::move(msg));
    ++n_problems;
  };
  for (const ExpectedTensor& e : manifest) {
    const TensorView* t = find(e.name);
    if (!t) {
      report("missing " + e.name + " " + shape_str(e.shapes[0]) + " " + dtypes_str(e.dtypes));
      continue;
    }
    const bool shape_ok = std::find(e.shapes.begin(), e.shapes.end(), t->shape) != e.shapes.end();
    const bool dtype_ok = std::find(e.dtypes.begin(), e.dtypes.end(), t->dtype) != e.dtypes.end();
    if (!shape_ok || !dtype_ok) {
      report(e.name + " is " + describe(*t) + ", expected " + shapes_str(e.shapes) + " " +
             dtypes_str(e.dtypes));
      continue;
    }
    // K3 A_log: only the first H entries are used; the tail must be zero (MODEL.md §4).
    if (c.family != Family::kimi_linear && ends_with(e.name, ".A_log")) {
      const float* a = t->as<float>();
      for (int64_t j = c.kda.n_head; j < t->numel(); ++j)
        if (a[j] != 0.f) {
          report(e.name + ": A_log[" + std::to_string(j) + "] = " + std::to_string(a[j]) +
                 " is nonzero (entries past num_heads = " + std::to_string(c.kda.n_head) + " must be 0)");
          break;
        }
    }
    // E8M0 scale 255 is NaN (MODEL.md §9).
    if (ends_with(e.name, ".weight_scale") && std::memchr(t->data, 0xff, t->nbytes))
      report(e.name + ": MXFP4 scale byte 255 (E8M0 NaN) at offset " +
             std::to_string(static_cast<const uint8_t*>(std::memchr(t->data, 0xff, t->nbytes)) -
                            t->as<uint8_t>()));
  }
  if (n_problems == 0) return ok_status();
  std::string msg = where + ": " + std::to_string(n_problems) + " problem(s) with the checkpoint tensors: ";
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
  if (n_problems > problems.size())
    msg += "; ... and " + std::to_string(n_problems - problems.size()) + " more";
  return error(Code::bad_file, msg);
}

}  // namespace k3
