// tp.cpp: tensor-parallel sharding of bound weights (tp.h).
#include "dist/tp.h"

#include <deque>
#include <vector>

#include "model/weights.h"

namespace k3 {

namespace {

// Owned bytes of column slices and views of sliced tensors; kept alive by ModelWeights::shard_storage.
struct Store {
  std::deque<std::vector<uint8_t>> bytes;
  std::deque<TensorView> views;
};

Store& store_of(std::shared_ptr<void>& s) {
  if (!s) s = std::make_shared<Store>();
  return *static_cast<Store*>(s.get());
}

int64_t row_bytes(const LinearWeight& W) {
  return W.is_mxfp4() ? W.in / 2 : W.in * int64_t(dtype_size(W.dtype));
}

std::vector<float> slice(const std::vector<float>& v, int64_t off, int64_t n) {
  return std::vector<float>(v.begin() + off, v.begin() + off + n);
}

Status check_div(const char* what, int64_t count, int n) {
  if (count % n != 0)
    return error(Code::invalid_argument, std::string("tensor parallel degree ") + std::to_string(n) +
                                             " does not divide " + what + " (" + std::to_string(count) + ")");
  return ok_status();
}

Status shard_glu(FfnWeights& f, int rank, int n, std::shared_ptr<void>& store) {
  const int64_t d_ff = f.gate_proj.out, part = d_ff / n;
  f.gate_proj = linear_rows(f.gate_proj, rank * part, part);
  f.up_proj = linear_rows(f.up_proj, rank * part, part);
  K3_ASSIGN_OR_RETURN(f.down_proj, linear_cols(f.down_proj, rank * part, part, store));
  f.out_partial = true;
  return ok_status();
}

Status shard_kda(const ModelConfig& cfg, KdaWeights& w, int rank, int n, std::shared_ptr<void>& store) {
  const int64_t K = cfg.kda.d_head, W = cfg.kda.conv_size, nh = cfg.kda.n_head / n, h0 = rank * nh;
  for (LinearWeight* p : {&w.q_proj, &w.k_proj, &w.v_proj, &w.f_b_proj}) *p = linear_rows(*p, h0 * K, nh * K);
  for (std::vector<float>* c : {&w.q_conv, &w.k_conv, &w.v_conv}) *c = slice(*c, h0 * K * W, nh * K * W);
  w.dt_bias = slice(w.dt_bias, h0 * K, nh * K);
  w.A_log = slice(w.A_log, h0, nh);
  w.b_proj = linear_rows(w.b_proj, h0, nh);
  if (cfg.kda.full_rank_gate)
    w.g_proj = linear_rows(w.g_proj, h0 * K, nh * K);
  else
    w.g_b_proj = linear_rows(w.g_b_proj, h0 * K, nh * K);
  K3_ASSIGN_OR_RETURN(w.o_proj, linear_cols(w.o_proj, h0 * K, nh * K, store));
  return ok_status();
}

Status shard_mla(const ModelConfig& cfg, MlaWeights& w, int rank, int n, std::shared_ptr<void>& store) {
  const MlaConfig& m = cfg.mla;
  const int64_t nh = m.n_head / n, h0 = rank * nh, dqk = m.d_qk(), wkv = m.d_nope + m.d_v;
  if (m.q_lora_rank > 0)
    w.q_b_proj = linear_rows(w.q_b_proj, h0 * dqk, nh * dqk);
  else
    w.q_proj = linear_rows(w.q_proj, h0 * dqk, nh * dqk);
  w.kv_b_proj = linear_rows(w.kv_b_proj, h0 * wkv, nh * wkv);
  TensorView kv_b = *w.kv_b;  // rows [h0 wkv, (h0 + nh) wkv) of [n_head wkv, R]
  const size_t rb = size_t(kv_b.dim(1)) * dtype_size(kv_b.dtype);
  kv_b.data = static_cast<const uint8_t*>(kv_b.data) + size_t(h0 * wkv) * rb;
  kv_b.shape = {nh * wkv, kv_b.dim(1)};
  kv_b.nbytes = size_t(nh * wkv) * rb;
  Store& s = store_of(store);
  s.views.push_back(kv_b);
  w.kv_b = &s.views.back();
  if (m.use_output_gate) w.g_proj = linear_rows(w.g_proj, h0 * m.d_v, nh * m.d_v);
  K3_ASSIGN_OR_RETURN(w.o_proj, linear_cols(w.o_proj, h0 * m.d_v, nh * m.d_v, store));
  return ok_status();
}

// Index heads [r Hi / n, (r+1) Hi / n): wq_b and weights_proj rows. An even split when n divides Hi, else
// sizes differ by one (a rank may get none and contribute zero scores). wk and k_norm stay whole: the index
// key is one per token, shared by all heads, so every rank keeps the whole index-key cache.
void shard_dsa(const ModelConfig& cfg, DsaWeights& w, int rank, int n) {
  const int64_t Hi = cfg.dsa.n_head, Di = cfg.dsa.d_head, h0 = rank * Hi / n, nh = (rank + 1) * Hi / n - h0;
  w.wq_b = linear_rows(w.wq_b, h0 * Di, nh * Di);
  w.weights_proj = linear_rows(w.weights_proj, h0, nh);
}

}  // namespace

LinearWeight linear_rows(const LinearWeight& W, int64_t row0, int64_t n_rows) {
  K3_ASSERT(row0 >= 0 && n_rows >= 0 && row0 + n_rows <= W.out);
  LinearWeight s = W;
  s.out = n_rows;
  s.w = static_cast<const uint8_t*>(W.w) + size_t(row0 * row_bytes(W));
  if (W.is_mxfp4()) s.scale = W.scale + row0 * (W.in / 32);
  return s;
}

Result<LinearWeight> linear_cols(const LinearWeight& W, int64_t col0, int64_t n_cols,
                                 std::shared_ptr<void>& store) {
  if (col0 < 0 || n_cols <= 0 || col0 + n_cols > W.in)
    return error(Code::invalid_argument, "linear_cols: columns out of range");
  if (W.is_mxfp4() && (col0 % 32 != 0 || n_cols % 32 != 0))
    return error(Code::unsupported, "linear_cols: MXFP4 column slices must be multiples of 32");
  Store& s = store_of(store);
  LinearWeight out = W;
  out.in = n_cols;
  const bool mx = W.is_mxfp4();
  const int64_t es = mx ? 0 : int64_t(dtype_size(W.dtype));
  const int64_t src_rb = row_bytes(W), dst_rb = mx ? n_cols / 2 : n_cols * es,
                off = mx ? col0 / 2 : col0 * es;
  std::vector<uint8_t>& w = s.bytes.emplace_back(size_t(W.out * dst_rb));
  for (int64_t r = 0; r < W.out; ++r)
    std::copy_n(static_cast<const uint8_t*>(W.w) + r * src_rb + off, dst_rb, &w[size_t(r * dst_rb)]);
  out.w = w.data();
  if (mx) {
    std::vector<uint8_t>& sc = s.bytes.emplace_back(size_t(W.out * (n_cols / 32)));
    for (int64_t r = 0; r < W.out; ++r)
      std::copy_n(W.scale + r * (W.in / 32) + col0 / 32, n_cols / 32, &sc[size_t(r * (n_cols / 32))]);
    out.scale = sc.data();
  }
  return out;
}

Status tp_check(const ModelConfig& cfg, int n) {
  if (n < 1) return error(Code::invalid_argument, "tensor parallel degree must be >= 1");
  if (cfg.n_layers_of(AttnKind::kda) > 0) K3_RETURN_IF_ERROR(check_div("the KDA heads", cfg.kda.n_head, n));
  if (cfg.n_layers_of(AttnKind::mla) + cfg.n_layers_of(AttnKind::dsa) > 0)
    K3_RETURN_IF_ERROR(check_div("the MLA heads", cfg.mla.n_head, n));
  bool dense = false, moe = false;
  for (bool b : cfg.layer_moe) (b ? moe : dense) = true;
  if (dense) K3_RETURN_IF_ERROR(check_div("intermediate_size", cfg.d_ff, n));
  if (moe && cfg.moe.n_shared_expert > 0)
    K3_RETURN_IF_ERROR(
        check_div("the shared-expert width", int64_t(cfg.moe.n_shared_expert) * cfg.moe.d_ff_expert, n));
  return ok_status();
}

Status tp_shard(ModelConfig& cfg, ModelWeights& w, int rank, int n) {
  K3_RETURN_IF_ERROR(tp_check(cfg, n));
  if (rank < 0 || rank >= n) return error(Code::invalid_argument, "tensor parallel rank out of range");
  if (n == 1) return ok_status();
  for (int l = 0; l < cfg.n_layer; ++l) {
    LayerWeights& lw = w.layers[size_t(l)];
    if (lw.kind == AttnKind::kda)
      K3_RETURN_IF_ERROR(shard_kda(cfg, lw.kda, rank, n, w.shard_storage));
    else
      K3_RETURN_IF_ERROR(shard_mla(cfg, lw.mla, rank, n, w.shard_storage));
    if (lw.kind != AttnKind::kda && lw.mla.has_dsa) shard_dsa(cfg, lw.mla.dsa, rank, n);
    if (!lw.moe)
      K3_RETURN_IF_ERROR(shard_glu(lw.mlp, rank, n, w.shard_storage));
    else if (cfg.moe.n_shared_expert > 0)
      K3_RETURN_IF_ERROR(shard_glu(lw.moe_w.shared, rank, n, w.shard_storage));
  }
  cfg.kda.n_head /= n;
  cfg.mla.n_head /= n;  // cfg.dsa.n_head stays the model's: the index-score scale counts every head
  return ok_status();
}

}  // namespace k3
