// plan.cpp: per-GPU memory and decode traffic of a layout (plan.h, docs/plan.md).
#include "dist/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "io/manifest.h"

namespace k3 {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool ends_with(const std::string& s, const char* suf) {
  const size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// Split over TP as src/dist/tp.h does: head-indexed attention projections (the low-rank a-projections and
// the 576-wide latent projection stay replicated; of the DSA indexer, the head-indexed wq_b and weights_proj
// split, the per-token key projection wk and k_norm stay replicated), d_ff-indexed dense / shared GLUs.
// Embedding, lm_head, norms, AttnRes, router and LatentMoE down/up are replicated.
Shard shard_of(const ExpectedTensor& e) {
  if (e.routed_expert) return Shard::ep;
  const std::string& n = e.name;
  if (n.find(".mlp.") != std::string::npos || n.find(".shared_experts.") != std::string::npos)
    return Shard::tp;
  if (n.find(".indexer.") != std::string::npos)
    return ends_with(n, ".wq_b.weight") || ends_with(n, ".weights_proj.weight") ? Shard::tp
                                                                                : Shard::replicated;
  if (n.find(".self_attn.") == std::string::npos) return Shard::replicated;
  static const char* kTp[] = {".q_proj.weight",   ".k_proj.weight",   ".v_proj.weight",   ".q_conv1d.weight",
                              ".k_conv1d.weight", ".v_conv1d.weight", ".f_b_proj.weight", ".g_b_proj.weight",
                              ".b_proj.weight",   ".dt_bias",         ".A_log",           ".g_proj.weight",
                              ".o_proj.weight",   ".q_b_proj.weight", ".kv_b_proj.weight"};
  for (const char* s : kTp)
    if (ends_with(n, s)) return Shard::tp;
  return Shard::replicated;  // f_a / g_a / q_a / kv_a projections, norms
}

bool divides(int64_t d, int64_t n) {
  return d > 0 && n % d == 0;
}

}  // namespace

const char* shard_name(Shard s) {
  switch (s) {
    case Shard::replicated:
      return "replicated";
    case Shard::tp:
      return "tp";
    case Shard::ep:
      return "ep";
  }
  return "?";
}

std::vector<PlanTensor> plan_tensors(const ModelConfig& c,
                                     const std::function<const TensorView*(const std::string&)>& find) {
  auto get = [&](const std::string& n) -> const TensorView* { return find ? find(n) : nullptr; };
  auto has = [&](const std::string& n) { return get(n) != nullptr; };
  std::vector<PlanTensor> out;
  for (const ExpectedTensor& e : expected_tensors(c, has)) {
    const TensorView* t = get(e.name);
    const bool stored = t && std::find(e.dtypes.begin(), e.dtypes.end(), t->dtype) != e.dtypes.end();
    const DType dt = stored ? t->dtype : e.dtypes.front();
    int64_t numel = 1;
    for (int64_t d : e.shapes.front()) numel *= std::max<int64_t>(d, 0);
    if (t) {  // the shape the checkpoint stores when it is an allowed one (K3 A_log: [H] or [max(H, K)])
      for (const auto& s : e.shapes)
        if (s == t->shape) numel = t->numel();
    }
    out.push_back({e.name, e.layer, dt, numel * int64_t(dtype_size(dt)), shard_of(e)});
  }
  return out;
}

const char* cache_format_name(CacheFormat f) {
  switch (f) {
    case CacheFormat::fp32:
      return "fp32";
    case CacheFormat::bf16:
      return "bf16";
    case CacheFormat::fp8:
      return "fp8";
  }
  return "?";
}

bool cache_format_from_name(const std::string& s, CacheFormat* out) {
  for (CacheFormat f : {CacheFormat::fp32, CacheFormat::bf16, CacheFormat::fp8})
    if (s == cache_format_name(f)) return *out = f, true;
  return false;
}

SeqCacheBytes seq_cache_bytes(const ModelConfig& c, CacheFormat f, bool state_bf16) {
  const int64_t H = c.kda.n_head, K = c.kda.d_head, W = c.kda.conv_size;
  const int64_t S = H * K * K * (state_bf16 ? 2 : 4);                           // [H, K, V]
  const int64_t conv = 3 * H * K * (W - 1) * (f == CacheFormat::fp32 ? 4 : 2);  // q, k, v windows
  const int64_t kvr = c.mla.kv_lora_rank, dr = c.mla.d_rope, id = c.dsa.d_head;
  int64_t lat = 0, idx = 0;
  switch (f) {
    case CacheFormat::fp32:
      lat = (kvr + dr) * 4, idx = id * 4;
      break;
    case CacheFormat::bf16:
      lat = (kvr + dr) * 2, idx = id * 2;
      break;
    // fp8_ds_mla: e4m3 latent, one fp32 scale per 128, bf16 rope part; index key e4m3 + one fp32 scale.
    case CacheFormat::fp8:
      lat = kvr + 4 * ceil_div(kvr, 128) + 2 * dr, idx = id + 4;
      break;
  }
  const int n_dsa = c.n_layers_of(AttnKind::dsa);
  return {c.n_layers_of(AttnKind::kda) * (S + conv), (c.n_layers_of(AttnKind::mla) + n_dsa) * lat,
          n_dsa * idx};
}

std::string Layout::name() const {
  std::string s;
  auto part = [&](const char* n, int d) {
    if (d > 1) s += (s.empty() ? "" : "x") + std::string(n) + std::to_string(d);
  };
  part("TP", tp), part("KCP", kcp), part("DP", dp), part("EP", ep);
  return s.empty() ? "TP1" : s;
}

Result<Layout> parse_layout(const std::string& text) {
  Layout l;
  bool ep_given = false;
  std::string s;
  for (char ch : text) s += char(std::tolower(static_cast<unsigned char>(ch)));
  size_t i = 0;
  auto bad = [&](const std::string& why) {
    return error(Code::invalid_argument, "layout \"" + text + "\": " + why +
                                             " (expected e.g. tp8xep16, TP8,KCP2,EP16 or tp=8 ep=16)");
  };
  while (i < s.size()) {
    if (s[i] == 'x' || s[i] == ',' || s[i] == ' ' || s[i] == '*') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && std::isalpha(static_cast<unsigned char>(s[j])) && s[j] != 'x') ++j;
    const std::string key = s.substr(i, j - i);
    if (j < s.size() && s[j] == '=') ++j;
    size_t k = j;
    while (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) ++k;
    if (key.empty() || k == j || k - j > 6) return bad("cannot read a part at \"" + s.substr(i) + "\"");
    const int v = std::stoi(s.substr(j, k - j));
    if (v < 1) return bad(key + " must be >= 1");
    if (key == "tp")
      l.tp = v;
    else if (key == "kcp" || key == "cp")
      l.kcp = v;
    else if (key == "dp")
      l.dp = v;
    else if (key == "ep")
      l.ep = v, ep_given = true;
    else
      return bad("unknown part \"" + key + "\"");
    i = k;
  }
  if (!ep_given) l.ep = l.world();
  return l;
}

Status check_layout(const ModelConfig& c, const Layout& l, const PlanOptions& o) {
  auto bad = [&](const std::string& why) {
    return error(Code::invalid_argument, "layout " + l.name() + ": " + why);
  };
  const int W = l.world(), max_world = o.gpus_per_node * o.nodes;
  if (l.tp < 1 || l.kcp < 1 || l.dp < 1 || l.ep < 1) return bad("every degree must be >= 1");
  if (W > max_world)
    return bad("needs " + std::to_string(W) + " GPUs, more than " + std::to_string(o.nodes) + " node(s) x " +
               std::to_string(o.gpus_per_node));
  if (W > o.gpus_per_node && W % o.gpus_per_node != 0) return bad("a multi-node world must be whole nodes");
  if (l.tp > o.gpus_per_node) return bad("tp must stay within one node");
  if (!divides(l.ep, W)) return bad("ep must divide the world size " + std::to_string(W));
  auto need = [&](int64_t n, const char* what) -> Status {
    if (n > 0 && n % l.tp != 0)
      return bad("tp must divide " + std::string(what) + " (" + std::to_string(n) + ")");
    return ok_status();
  };
  if (c.n_layers_of(AttnKind::kda) > 0) K3_RETURN_IF_ERROR(need(c.kda.n_head, "the KDA heads"));
  if (c.n_layers_of(AttnKind::kda) < c.n_layer) K3_RETURN_IF_ERROR(need(c.mla.n_head, "the MLA heads"));
  if (std::count(c.layer_moe.begin(), c.layer_moe.end(), false) > 0) K3_RETURN_IF_ERROR(need(c.d_ff, "d_ff"));
  K3_RETURN_IF_ERROR(need(int64_t(c.moe.n_shared_expert) * c.moe.d_ff_expert, "the shared-expert width"));
  if (c.moe.n_expert > 0 ? c.moe.n_expert % l.ep != 0 : l.ep != 1)
    return bad("ep must divide n_expert (" + std::to_string(c.moe.n_expert) + ")");
  return ok_status();
}

namespace {

// What every layout needs from the model, summed once per evaluation.
struct ModelSums {
  int64_t replicated = 0, tp_whole = 0, routed = 0, embed = 0;  // bytes; embed is also in replicated
  std::map<int64_t, int64_t> tp_sizes;                          // TP tensor bytes -> how many
  int n_kda = 0, n_mla = 0, n_dsa = 0, n_moe = 0;
  SeqCacheBytes seq;
  double lat = 0, idx = 0;  // cache bytes per token per MLA/DSA layer, per DSA layer
};

ModelSums sum_model(const ModelConfig& c, const std::vector<PlanTensor>& w, const PlanOptions& o) {
  ModelSums m;
  for (const PlanTensor& t : w) {
    if (t.name == "model.embed_tokens.weight") m.embed = t.bytes;
    (t.shard == Shard::ep ? m.routed : t.shard == Shard::tp ? m.tp_whole : m.replicated) += t.bytes;
    if (t.shard == Shard::tp) ++m.tp_sizes[t.bytes];
  }
  m.n_kda = c.n_layers_of(AttnKind::kda), m.n_mla = c.n_layers_of(AttnKind::mla);
  m.n_dsa = c.n_layers_of(AttnKind::dsa);
  m.n_moe = int(std::count(c.layer_moe.begin(), c.layer_moe.end(), true));
  m.seq = seq_cache_bytes(c, o.cache, o.state_bf16);
  if (m.n_mla + m.n_dsa) m.lat = double(m.seq.mla_per_token) / (m.n_mla + m.n_dsa);
  if (m.n_dsa) m.idx = double(m.seq.dsa_per_token) / m.n_dsa;
  return m;
}

// Activations of one prefill chunk (n_tok tokens) at the widest sub-layer of a TP rank, in elements per
// token: residual stream and AttnRes blocks + the sub-layer's intermediates (fused attention: no [T, T]).
int64_t activation_width(const ModelConfig& c, const ModelSums& m, int64_t tp) {
  const int64_t D = c.d_model, HK = int64_t(c.kda.n_head) * c.kda.d_head, nh = c.mla.n_head;
  const int64_t F = c.moe.d_ff_expert, Fs = int64_t(c.moe.n_shared_expert) * F, k = c.moe.n_expert_used;
  const int64_t Din = c.moe.d_latent > 0 ? c.moe.d_latent : D;
  int64_t width = 0;
  if (m.n_kda) width = std::max(width, 6 * HK / tp + c.kda.n_head / tp);  // q k v g f o, beta
  if (m.n_mla + m.n_dsa)  // c^Q, q, k, v, o per head, the latent row, the indexer
    width = std::max(
        width, c.mla.q_lora_rank + nh / tp * (2 * c.mla.d_qk() + 2 * c.mla.d_v) + c.mla.d_latent() +
                   (c.dsa.enabled ? ceil_div(c.dsa.n_head, tp) * (c.dsa.d_head + 1) + c.dsa.d_head : 0));
  if (m.n_moe < c.n_layer) width = std::max(width, 3 * int64_t(c.d_ff) / tp);  // gate, up, h
  if (m.n_moe) width = std::max(width, c.moe.n_expert + k * (3 * F + Din) + 3 * Fs / tp + Din);
  const int64_t blocks = c.uses_attn_res() ? ceil_div(c.n_layer, c.attn_res_block_size) + 1 : 0;
  return D * (2 + blocks) + width;
}

Plan evaluate(const ModelConfig& c, const ModelSums& m, const Layout& l, const PlanOptions& o) {
  const int64_t W = l.world(), tp = l.tp, kcp = l.kcp, E = std::max(c.moe.n_expert, 1),
                V = std::max(c.n_vocab, 1);
  const int64_t B = std::max<int64_t>(o.batch, 1), T = std::max<int64_t>(o.context, 1);
  const int64_t seqs = ceil_div(B, l.dp), rows = ceil_div(T, kcp);  // per replica / per kcp rank
  Plan p;
  p.layout = l;

  // Weights: TP tensors split by tp (rounded up per tensor), experts ceil(E / ep) per rank.
  p.mem.weights_replicated = m.replicated;
  for (const auto& [bytes, n] : m.tp_sizes) p.mem.weights_tp += n * ceil_div(bytes, tp);
  p.mem.weights_ep = m.routed / E * ceil_div(E, l.ep);
  // Caches: the KDA state splits over heads (tp); latent / index rows over positions (kcp).
  p.mem.kda_state = seqs * ceil_div(m.seq.kda_state, tp);
  p.mem.mla_cache = seqs * rows * m.seq.mla_per_token;
  p.mem.dsa_cache = seqs * rows * m.seq.dsa_per_token;
  const int64_t n_tok = std::max(std::min(o.chunk, rows), seqs);
  p.mem.workspace = o.reserve + n_tok * activation_width(c, m, tp) * o.act_bytes + seqs * c.n_vocab * 4;
  p.fits = p.mem.total() <= o.gpu_mem;

  // Decode: every non-expert weight once per step (the embedding as a gather of one row per sequence),
  // distinct experts touched E (1 - (1 - k/E)^b) per MoE layer for b tokens.
  const double k = c.moe.n_expert_used, e_bytes = m.n_moe ? double(m.routed) / m.n_moe / double(E) : 0.0;
  auto touched = [&](double n_exp, double b) { return n_exp * (1.0 - std::pow(1.0 - k / double(E), b)); };
  auto embed_rows = [&](int64_t n) { return double(m.embed) * double(std::min(n, V)) / double(V); };
  const double sparse = c.dsa.enabled ? double(std::min<int64_t>(T, c.dsa.topk)) : 0.0;
  p.decode.weight_bytes_per_token = (double(m.replicated + m.tp_whole - m.embed) + embed_rows(B) +
                                     m.n_moe * e_bytes * touched(double(E), double(B))) /
                                    double(B);
  p.decode.cache_bytes_per_token =
      double(m.seq.kda_state) + double(T) * m.n_mla * m.lat + m.n_dsa * (double(T) * m.idx + sparse * m.lat);
  const double gpu_weights =
      double(p.mem.weights_replicated + p.mem.weights_tp - m.embed) + embed_rows(seqs) +
      m.n_moe * e_bytes * touched(double(ceil_div(E, l.ep)), double(B) * l.ep / double(W));
  const double gpu_cache =
      double(seqs) * (double(ceil_div(m.seq.kda_state, tp)) + double(rows) * m.n_mla * m.lat +
                      m.n_dsa * (double(rows) * m.idx + std::ceil(sparse / kcp) * m.lat));
  p.decode.gpu_bytes_per_step = gpu_weights + gpu_cache;
  p.decode.step_seconds = p.decode.gpu_bytes_per_step / o.hbm_bytes_per_s;

  // Communication, bytes one GPU sends per layer (ring collectives: 2 (n-1)/n of the message).
  const int64_t D = c.d_model, nh = c.mla.n_head, H = c.kda.n_head, K = c.kda.d_head;
  const double Din = c.moe.d_latent > 0 ? c.moe.d_latent : D, wire = o.wire_bytes;
  const double ring_tp = 2.0 * double(tp - 1) / double(tp), ep_remote = double(l.ep - 1) / double(l.ep);
  p.comm.tp_decode = 2 * ring_tp * double(seqs) * D * wire;
  p.comm.ep_decode = 2 * double(B) / double(W) * k * ep_remote * Din * wire;
  p.comm.tp_prefill_per_token = 2 * ring_tp * D * wire;
  p.comm.ep_prefill_per_token = 2 * k * ep_remote * Din * wire / double(tp);
  if (kcp > 1) {
    p.comm.kcp_decode =
        double(seqs) * double(nh / tp) * ((c.mla.kv_lora_rank + 2) * 4.0 + c.mla.d_latent() * wire);
    p.comm.kcp_prefill_kda = double(kcp - 1) * 2.0 * double(H / tp) * double(K * K) * 4.0 +
                             3.0 * (c.kda.conv_size - 1) * double(H / tp * K) * wire;
    p.comm.kcp_prefill_mla = double(kcp - 1) * double(rows) * (m.lat + m.idx);
  }
  if (c.dsa.enabled && m.n_dsa) {  // fp32 index-score rows [n_tok, n_ctx] summed over the TP ranks' heads
    p.comm.tp_dsa_decode = ring_tp * double(seqs) * double(T) * 4.0;
    p.comm.tp_dsa_prefill_per_token = ring_tp * double(T) * 4.0;
  }
  return p;
}

}  // namespace

Plan evaluate_plan(const ModelConfig& c, const std::vector<PlanTensor>& w, const Layout& l,
                   const PlanOptions& o) {
  return evaluate(c, sum_model(c, w, o), l, o);
}

std::vector<Plan> all_plans(const ModelConfig& c, const std::vector<PlanTensor>& w, const PlanOptions& o) {
  const ModelSums m = sum_model(c, w, o);
  std::vector<int> worlds;
  for (int n = 1; n <= o.gpus_per_node; ++n)
    if (o.gpus_per_node % n == 0) worlds.push_back(n);
  for (int m = 2; m <= o.nodes; ++m) worlds.push_back(m * o.gpus_per_node);
  std::vector<Plan> out;
  for (int W : worlds)
    for (int tp = 1; tp <= W; ++tp)
      for (int kcp = 1; tp * kcp <= W; ++kcp) {
        if (W % (tp * kcp)) continue;
        for (int ep = 1; ep <= W; ++ep) {
          const Layout l{tp, kcp, W / (tp * kcp), ep};
          if (check_layout(c, l, o).ok()) out.push_back(evaluate(c, m, l, o));
        }
      }
  return out;
}

std::optional<Plan> smallest_fit(const std::vector<Plan>& plans) {
  auto key = [](const Plan& p) {
    const double comm = p.comm.tp_decode + p.comm.ep_decode + p.comm.kcp_decode + p.comm.tp_dsa_decode;
    return std::make_tuple(p.layout.world(), p.decode.gpu_bytes_per_step, comm, p.mem.total());
  };
  std::optional<Plan> best;
  for (const Plan& p : plans)
    if (p.fits && (!best || key(p) < key(*best))) best = p;
  return best;
}

}  // namespace k3
