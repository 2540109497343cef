// ep.cpp: expert placement, sharding and dispatch/combine (ep.h).
#include "dist/ep.h"

#include <algorithm>
#include <numeric>

#include "model/common.h"
#include "model/weights.h"

namespace k3 {

std::vector<int> ep_placement(int n_expert, int n_rank, std::span<const double> load) {
  K3_ASSERT(n_rank >= 1 && n_expert >= 0);
  K3_ASSERT(load.empty() || int(load.size()) == n_expert);
  std::vector<int> order(static_cast<size_t>(n_expert)), owner(static_cast<size_t>(n_expert), -1);
  std::iota(order.begin(), order.end(), 0);
  auto w = [&](int e) { return load.empty() ? 1.0 : load[size_t(e)]; };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w(a) > w(b); });
  const int cap = (n_expert + n_rank - 1) / n_rank;
  std::vector<double> sum(static_cast<size_t>(n_rank), 0.0);
  std::vector<int> held(static_cast<size_t>(n_rank), 0);
  for (int e : order) {
    int best = -1;
    for (int r = 0; r < n_rank; ++r)
      if (held[size_t(r)] < cap && (best < 0 || sum[size_t(r)] < sum[size_t(best)])) best = r;
    owner[size_t(e)] = best;
    sum[size_t(best)] += w(e);
    ++held[size_t(best)];
  }
  return owner;
}

Status ep_shard(const ModelConfig& cfg, ModelWeights& w, std::span<const int> owner, int rank) {
  if (int(owner.size()) != cfg.moe.n_expert)
    return error(Code::invalid_argument, "expert placement must name one owner per expert");
  for (LayerWeights& lw : w.layers)
    if (lw.moe)
      for (size_t e = 0; e < lw.moe_w.experts.size(); ++e)
        if (owner[e] != rank) lw.moe_w.experts[e] = FfnWeights{};
  return ok_status();
}

Status ep_run_experts(Comm& comm, std::span<const int> owner, const Ctx& c, const ModelConfig& cfg,
                      const MoeWeights& w, const float* z, const int32_t* sel, int64_t n_tok,
                      float* slot_out) {
  const int n = comm.size(), me = comm.rank();
  const int64_t k = cfg.moe.n_expert_used, dz = cfg.moe.d_latent > 0 ? cfg.moe.d_latent : cfg.d_model;
  auto slice0 = [&](int r) { return n_tok * r / n; };
  const int64_t t0 = slice0(me), t1 = slice0(me + 1);

  // 1-2. my (token, slot) rows, grouped by destination rank in ascending row order
  std::vector<std::vector<int64_t>> rows_to(static_cast<size_t>(n));
  for (int64_t r = t0 * k; r < t1 * k; ++r) rows_to[size_t(owner[size_t(sel[r])])].push_back(r);
  std::vector<int64_t> my_cnt(static_cast<size_t>(n)), cnt(size_t(n) * size_t(n));  // cnt[src * n + dst]
  for (int d = 0; d < n; ++d) my_cnt[size_t(d)] = int64_t(rows_to[size_t(d)].size());
  K3_RETURN_IF_ERROR(comm.all_gather(my_cnt.data(), n * int64_t(sizeof(int64_t)), cnt.data()));
  std::vector<int32_t> send_id;
  std::vector<float> send_z;
  for (int d = 0; d < n; ++d)
    for (int64_t r : rows_to[size_t(d)]) {
      send_id.push_back(sel[r]);
      send_z.insert(send_z.end(), z + (r / k) * dz, z + (r / k + 1) * dz);
    }
  std::vector<int64_t> sb_id(static_cast<size_t>(n)), rb_id(static_cast<size_t>(n)),
      sb_z(static_cast<size_t>(n)), rb_z(static_cast<size_t>(n));
  int64_t n_recv = 0;
  for (int j = 0; j < n; ++j) {
    sb_id[size_t(j)] = cnt[size_t(me * n + j)] * 4, rb_id[size_t(j)] = cnt[size_t(j * n + me)] * 4;
    sb_z[size_t(j)] = sb_id[size_t(j)] * dz, rb_z[size_t(j)] = rb_id[size_t(j)] * dz;
    n_recv += cnt[size_t(j * n + me)];
  }
  std::vector<int32_t> recv_id(static_cast<size_t>(n_recv));
  std::vector<float> recv_z(size_t(n_recv * dz)), recv_y(recv_z.size());
  K3_RETURN_IF_ERROR(comm.all_to_allv(send_id.data(), sb_id, recv_id.data(), rb_id));
  K3_RETURN_IF_ERROR(comm.all_to_allv(send_z.data(), sb_z, recv_z.data(), rb_z));

  // 3. my experts over the received rows (source rank order = ascending token order)
  std::vector<int64_t> idx;
  std::vector<float> xe, ye;
  for (int e = 0; e < cfg.moe.n_expert; ++e) {
    if (owner[size_t(e)] != me) continue;
    idx.clear();
    for (int64_t i = 0; i < n_recv; ++i)
      if (recv_id[size_t(i)] == e) idx.push_back(i);
    if (idx.empty()) continue;
    xe.resize(idx.size() * size_t(dz));
    ye.resize(xe.size());
    for (size_t i = 0; i < idx.size(); ++i)
      std::copy_n(&recv_z[size_t(idx[i] * dz)], dz, &xe[i * size_t(dz)]);
    ffn_forward(c, cfg, w.experts[size_t(e)], xe.data(), int64_t(idx.size()), ye.data());
    for (size_t i = 0; i < idx.size(); ++i)
      std::copy_n(&ye[i * size_t(dz)], dz, &recv_y[size_t(idx[i] * dz)]);
  }

  // 4. outputs back to their source ranks, into my slice of slot_out, then every slice to every rank
  std::vector<float> back(send_z.size());
  K3_RETURN_IF_ERROR(comm.all_to_allv(recv_y.data(), rb_z, back.data(), sb_z));
  std::vector<float> mine(size_t((t1 - t0) * k * dz));
  size_t i = 0;
  for (int d = 0; d < n; ++d)
    for (int64_t r : rows_to[size_t(d)])
      std::copy_n(&back[(i++) * size_t(dz)], dz, &mine[size_t((r - t0 * k) * dz)]);
  std::vector<int64_t> slice_bytes(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) slice_bytes[size_t(r)] = (slice0(r + 1) - slice0(r)) * k * dz * 4;
  return comm.all_gatherv(mine.data(), slice_bytes, slot_out);
}

}  // namespace k3
