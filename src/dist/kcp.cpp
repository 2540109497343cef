// kcp.cpp: KDA context parallelism (kcp.h).
#include "dist/kcp.h"

#include <algorithm>

#include "model/common.h"
#include "model/kda.h"
#include "model/mla.h"
#include "ops/kda.h"
#include "ops/kda_transition.h"

namespace k3 {

namespace {

void fail(const Ctx& c, const Status& s) {
  if (c.guard && c.guard->ok() && !s.ok()) *c.guard = s;
}

Status check_ascending(const std::vector<int64_t>& v, const char* what) {
  if (v.size() < 2 || v.front() != 0)
    return error(Code::invalid_argument, std::string(what) + " must start at 0 and hold at least 2 entries");
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] <= v[i - 1])
      return error(Code::invalid_argument, std::string(what) + " must be strictly increasing");
  return ok_status();
}

}  // namespace

Status KcpLayout::validate() const {
  K3_RETURN_IF_ERROR(check_ascending(cu_seqlens, "cu_seqlens"));
  K3_RETURN_IF_ERROR(check_ascending(rank_start, "rank slice starts"));
  if (rank_start.back() != cu_seqlens.back())
    return error(Code::invalid_argument, "the rank slices must cover the packed sequence exactly");
  return ok_status();
}

Result<KcpLayout> KcpLayout::even(std::vector<int64_t> cu_seqlens, int n_rank) {
  KcpLayout l;
  l.cu_seqlens = std::move(cu_seqlens);
  K3_RETURN_IF_ERROR(check_ascending(l.cu_seqlens, "cu_seqlens"));
  const int64_t T = l.cu_seqlens.back();
  if (n_rank < 1 || T < n_rank)
    return error(Code::invalid_argument, "context parallel: " + std::to_string(T) + " tokens cannot fill " +
                                             std::to_string(n_rank) + " ranks");
  for (int r = 0; r <= n_rank; ++r) l.rank_start.push_back(T * r / n_rank);
  return l;
}

std::vector<KcpPiece> kcp_pieces(const KcpLayout& layout, int rank) {
  const int64_t t0 = layout.rank_start[size_t(rank)], t1 = layout.rank_start[size_t(rank) + 1];
  std::vector<KcpPiece> out;
  for (size_t d = 0; d + 1 < layout.cu_seqlens.size(); ++d) {
    const int64_t a = std::max(t0, layout.cu_seqlens[d]), b = std::min(t1, layout.cu_seqlens[d + 1]);
    if (a < b) out.push_back({a, b, layout.cu_seqlens[d]});
  }
  return out;
}

KcpHooks::KcpHooks(Comm& comm, KcpLayout layout) : comm_(comm), layout_(std::move(layout)) {
  status_ = layout_.validate();
  if (status_.ok() && layout_.n_rank() != comm_.size())
    status_ =
        error(Code::invalid_argument, "context parallel layout has " + std::to_string(layout_.n_rank()) +
                                          " slices for " + std::to_string(comm_.size()) + " ranks");
  if (status_.ok()) pieces_ = kcp_pieces(layout_, comm_.rank());
}

void KcpHooks::kda_conv_halo(const Ctx& c, int layer, std::span<const KdaSeq> seqs, const float* q,
                             const float* k, const float* v, int64_t HK, int W) {
  const int me = comm_.rank(), n = comm_.size();
  if (seqs.size() != pieces_.size())
    return fail(c, error(Code::internal, "kcp: sequences do not match the pieces"));
  const int64_t w1 = W - 1, win = w1 * HK;  // one projection's window [W-1, HK]
  std::vector<float> halo(size_t(3 * win));
  if (me > 0) {
    Status s = comm_.recv(halo.data(), int64_t(halo.size() * sizeof(float)), me - 1);
    if (!s.ok()) return fail(c, s.with_context("kcp conv halo, layer " + std::to_string(layer)));
    if (pieces_[0].continues()) std::copy(halo.begin(), halo.end(), seqs[0].st->conv.begin());
  }
  if (me == n - 1) return;
  // The window after the last piece: the last W-1 rows of [its conv state | its pre-conv rows].
  const KdaSeq& s = seqs.back();
  const float* src[3] = {q, k, v};
  for (int p = 0; p < 3; ++p)
    for (int64_t i = 0; i < w1; ++i) {
      const int64_t j = s.n_tok + i;  // row of the window [state (W-1) | rows (n_tok)]
      const float* row = j < w1 ? &s.st->conv[size_t(p * win + j * HK)] : src[p] + (s.row0 + j - w1) * HK;
      std::copy_n(row, HK, &halo[size_t(p * win + i * HK)]);
    }
  fail(c, comm_.send(halo.data(), int64_t(halo.size() * sizeof(float)), me + 1));
}

void KcpHooks::kda_initial_state(const Ctx& c, int layer, std::span<const KdaSeq> seqs, const KdaParams& p) {
  const int me = comm_.rank(), n = comm_.size(), H = p.n_head, K = p.d_k, V = p.d_v;
  const size_t nM = size_t(H) * K * K, nS = size_t(H) * K * V;
  // (M, S~) of the last piece; a piece that starts on this rank sends (0, its final state) instead.
  const KdaSeq& s = seqs.back();
  std::vector<float> mine(nM + nS), all(size_t(n) * (nM + nS));
  KdaTransitionParams tp;
  tp.n_tok = s.n_tok, tp.n_head = H, tp.d_k = K, tp.d_v = V, tp.chunk = p.chunk;
  tp.k = p.k + s.row0 * H * K, tp.v = p.v + s.row0 * H * V, tp.g = p.g + s.row0 * H * K;
  tp.beta = p.beta + s.row0 * H;
  tp.M = mine.data(), tp.S = mine.data() + nM;
  kda_transition_cpu(tp, c.pool);
  const bool carried = pieces_.size() == 1 && pieces_[0].continues();
  if (!carried) {
    std::vector<float> S = s.st->S;
    kda_transition_apply(tp.M, tp.S, H, K, V, S.data());
    std::fill_n(mine.begin(), nM, 0.f);
    std::copy(S.begin(), S.end(), mine.begin() + long(nM));
  }
  Status st = comm_.all_gather(mine.data(), int64_t(mine.size() * sizeof(float)), all.data());
  if (!st.ok()) return fail(c, st.with_context("kcp KDA state, layer " + std::to_string(layer)));
  if (!pieces_[0].continues()) return;
  std::vector<float> S(nS, 0.f);
  for (int j = 0; j < me; ++j) {
    const float* Mj = &all[size_t(j) * (nM + nS)];
    kda_transition_apply(Mj, Mj + nM, H, K, V, S.data());
  }
  seqs[0].st->S = S;
}

void KcpHooks::mla_context(const Ctx& c, const ModelConfig& cfg, const MlaWeights& w, int layer,
                           std::span<const MlaSeq> seqs, const float* latent, const float* x,
                           int64_t n_rows) {
  const int n = comm_.size();
  const int64_t T = layout_.rank_start.back(), dl = cfg.mla.d_latent(), Di = cfg.dsa.d_head;
  std::vector<int64_t> lat_bytes(static_cast<size_t>(n)), key_bytes(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int64_t rows = layout_.rank_start[size_t(r) + 1] - layout_.rank_start[size_t(r)];
    lat_bytes[size_t(r)] = rows * dl * 4;
    key_bytes[size_t(r)] = rows * Di * 4;
  }
  std::vector<float> all_lat(size_t(T * dl)), all_key;
  Status st = comm_.all_gatherv(latent, lat_bytes, all_lat.data());
  if (st.ok() && w.has_dsa) {  // index keys k^I = bf16(LayerNorm(wk x)), as dsa_select computes them
    std::vector<float> kI;
    linear(c, w.dsa.wk, x, n_rows, kI);
    layer_norm(kI.data(), w.dsa.k_norm_w.data(), w.dsa.k_norm_b.data(), 1e-6f, n_rows, Di, kI.data());
    c.rnd(kI.data(), int64_t(kI.size()));
    all_key.resize(size_t(T * Di));
    st = comm_.all_gatherv(kI.data(), key_bytes, all_key.data());
  }
  if (!st.ok()) return fail(c, st.with_context("kcp MLA rows, layer " + std::to_string(layer)));
  if (!pieces_[0].continues()) return;
  const KcpPiece& p = pieces_[0];
  if (seqs.empty() || seqs[0].n_past != p.t0 - p.doc_start)
    return fail(c, error(Code::internal, "kcp: the continuing piece's n_past does not match its document"));
  MlaState& s = *seqs[0].st;
  s.latent.assign(all_lat.begin() + long(p.doc_start * dl), all_lat.begin() + long(p.t0 * dl));
  if (w.has_dsa)
    s.index_k.assign(all_key.begin() + long(p.doc_start * Di), all_key.begin() + long(p.t0 * Di));
}

Status kcp_prefill(Model& model, const KcpHooks& hooks, const int32_t* tokens, std::vector<float>* logits,
                   std::vector<std::unique_ptr<SeqState>>* states) {
  K3_RETURN_IF_ERROR(hooks.status());
  const std::vector<KcpPiece>& pieces = hooks.pieces();
  if (pieces.empty()) return error(Code::invalid_argument, "kcp: empty slice");
  const int64_t t0 = pieces.front().t0, t1 = pieces.back().t1;
  std::vector<std::unique_ptr<SeqState>> own;
  std::vector<SeqState*> ptrs;
  std::vector<int64_t> row0 = {0}, out_rows;
  for (const KcpPiece& p : pieces) {
    own.push_back(model.new_state());
    if (p.continues()) own.back()->set_n_past(p.t0 - p.doc_start);
    ptrs.push_back(own.back().get());
    row0.push_back(p.t1 - t0);
  }
  for (int64_t t = 0; t < t1 - t0; ++t) out_rows.push_back(t);
  K3_RETURN_IF_ERROR(model.forward_packed(ptrs, tokens + t0, row0, out_rows, logits));
  if (states) *states = std::move(own);
  return ok_status();
}

}  // namespace k3
