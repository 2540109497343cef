// bench_slice_run.cpp: one slice checkpoint: load, GPU = CPU checks, decode timings (bench_slice.cpp says
// what each number is).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <tuple>

#include "bench_slice.h"
#include "gpu/model_gpu.h"
#include "io/checkpoint.h"
#include "model/model.h"

namespace slice {

using namespace k3;
using Trace = std::map<std::pair<std::string, int>, std::vector<float>>;

namespace {

const std::vector<int32_t> kPrompt = {1, 2, 3, 100, 1000, 517, 1023, 42};

int check(Out& out, const std::string& name, const Checkpoint& ck, gpu::GpuModel& gm) {
  const int64_t T = int64_t(kPrompt.size()), V = ck.config().n_vocab;
  int rc = 0;
  // fp32: logits of every position
  ModelOptions o;
  o.precision = Precision::fp32;
  auto cpu = Model::load(ck, o);
  if (!cpu.ok()) return std::printf("%s: CPU load: %s\n", name.c_str(), cpu.status().message().c_str()), 1;
  std::vector<float> lc, lg;
  double t = now_s();
  auto cs = cpu.value()->new_state();
  Status s = cpu.value()->forward(*cs, kPrompt.data(), T, &lc, true);
  const double t_cpu = now_s() - t;
  gm.set_precision(Precision::fp32);
  auto gs = gm.new_state();
  t = now_s();
  if (s.ok() && gs.ok()) s = gm.forward(*gs.value(), kPrompt.data(), T, &lg, true);
  if (!s.ok()) return std::printf("%s: check fp32: %s\n", name.c_str(), s.message().c_str()), 1;
  const double e32 = nmse(lg.data(), lc.data(), T * V);
  std::printf("%s fp32: %lld tokens, CPU %.2f s, GPU %.3f s, logits NMSE %.3e\n", name.c_str(), (long long)T,
              t_cpu, now_s() - t, e32);
  out.line(name, "check fp32 logits NMSE gpu vs cpu (8 tokens)", e32, "nmse", nullptr, 0, 1e-6);
  rc |= !(e32 <= 1e-6);
  // bf16: every named intermediate, each GPU layer fed the CPU's input: the prompt, then one decode step
  // on the states it left (the decode kernels: the fused KDA step, absorbed MLA)
  Trace ct, gt;
  o.precision = Precision::bf16;
  o.trace = [&ct](const char* n, int l, const float* x, int64_t k) { ct[{n, l}].assign(x, x + k); };
  auto cpub = Model::load(ck, o);
  if (!cpub.ok()) return 1;
  auto cs2 = cpub.value()->new_state();
  gm.set_precision(Precision::bf16);
  auto gs2 = gm.new_state();
  if (!cs2 || !gs2.ok()) return 1;
  gm.set_layer_inputs([&ct](int l, int64_t n) -> const float* {
    auto it = ct.find({"l_out", l});
    return it != ct.end() && int64_t(it->second.size()) == n ? it->second.data() : nullptr;
  });
  const int32_t next = 77;
  for (const auto& [what, toks, n] :
       {std::tuple{"prompt", kPrompt.data(), T}, std::tuple{"decode step", &next, int64_t(1)}}) {
    ct.clear(), gt.clear();
    s = cpub.value()->forward(*cs2, toks, n, &lc, true);
    gm.set_trace([&gt](const char* nm, int l, const float* x, int64_t k) { gt[{nm, l}].assign(x, x + k); });
    if (s.ok()) s = gm.forward(*gs2.value(), toks, n, &lg, true);
    gm.set_trace(nullptr);
    if (!s.ok()) {
      gm.set_layer_inputs(nullptr);
      return std::printf("%s: check bf16 (%s): %s\n", name.c_str(), what, s.message().c_str()), 1;
    }
    double worst = 0;
    std::string worst_at;
    int n_cmp = 0, n_bad = 0;
    for (const auto& [key, ref] : ct) {
      auto it = gt.find(key);
      if (it == gt.end() || it->second.size() != ref.size()) {
        std::printf("  %s layer %d: %s\n", key.first.c_str(), key.second,
                    it == gt.end() ? "not traced on the GPU" : "size differs");
        ++n_bad;
        continue;
      }
      const double e = nmse(it->second.data(), ref.data(), int64_t(ref.size()));
      ++n_cmp;
      if (e > 1e-4)
        ++n_bad, std::printf("  %s layer %d: NMSE %.3e > 1e-4\n", key.first.c_str(), key.second, e);
      if (e > worst) worst = e, worst_at = key.first + " layer " + std::to_string(key.second);
    }
    std::printf("%s bf16 %s: %d intermediates compared, %d over 1e-4 or missing, worst %.3e (%s)\n",
                name.c_str(), what, n_cmp, n_bad, worst, worst_at.c_str());
    out.line(name,
             std::string("check bf16 worst intermediate NMSE gpu vs cpu (layer by layer, ") + what + ")",
             worst, "nmse", nullptr, 0, 1e-4);
    rc |= n_bad > 0;
  }
  gm.set_layer_inputs(nullptr);
  return rc;
}

struct Floor {
  double dense = 0, expert_each = 0, embed_row = 0;  // bytes
};

Floor weight_bytes(const Checkpoint& ck) {
  Floor f;
  const ModelConfig& c = ck.config();
  for (const std::string& n : ck.names()) {
    const TensorView* t = ck.find(n);
    if (!t) continue;
    if (n.find(".experts.") != std::string::npos)
      f.expert_each += double(t->nbytes) / std::max(c.moe.n_expert, 1);
    else if (n == "model.embed_tokens.weight")
      f.embed_row = double(t->nbytes) / double(c.n_vocab);
    else
      f.dense += double(t->nbytes);
  }
  return f;
}

// Bytes one decode step must move for B sequences at context T (see bench_slice.cpp).
double step_bytes(const ModelConfig& c, const Floor& w, int64_t B, int64_t T) {
  const double E = c.moe.n_expert, k = c.moe.n_expert_used;
  const double distinct = E > 0 ? E * (1 - std::pow(1 - k / E, double(B))) : 0;
  double per_seq = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const AttnKind a = c.layer_attn[size_t(l)];
    if (a == AttnKind::kda)
      per_seq += 2.0 * c.kda.n_head * c.kda.d_head * c.kda.d_head * 4 +
                 2.0 * 3 * (c.kda.conv_size - 1) * c.kda.n_head * c.kda.d_head * 4;
    else if (a == AttnKind::dsa)
      per_seq += double(T) * c.dsa.d_head * 2 + double(std::min<int64_t>(T, c.dsa.topk)) * c.mla.d_latent() * 2;
    else
      per_seq += double(T) * c.mla.d_latent() * 2;
  }
  return w.dense + w.expert_each * distinct + double(B) * (w.embed_row + per_seq);
}

void decode(const Args& a, Out& out, const std::string& name, const Checkpoint& ck, gpu::GpuModel& gm,
            double bw, double t0) {
  const ModelConfig& c = ck.config();
  const Floor w = weight_bytes(ck);
  std::printf("%s weights: dense %.2f GB, one expert x MoE layers %.1f MB, embedding row %.1f KB\n",
              name.c_str(), w.dense / 1e9, w.expert_each / 1e6, w.embed_row / 1e3);
  std::mt19937 rng(5);
  gm.set_precision(Precision::bf16);
  bool profiled = false;
  for (int64_t B : a.batches) {
    double prev_ms = 0, prev_T = 0;
    for (int64_t T : a.contexts) {
      const double left = a.budget_s - (now_s() - t0);
      const double guess_s = prev_ms > 0 ? prev_ms * 1e-3 * double(T) / prev_T : 0.5;
      if (left < 3 || guess_s * 4 > left) {
        std::printf("%s B=%lld T=%lld: skipped (%.0f s left, a step may take %.2f s)\n", name.c_str(),
                    (long long)B, (long long)T, left, guess_s);
        continue;
      }
      std::vector<std::unique_ptr<gpu::GpuSeqState>> st;
      std::vector<gpu::GpuSeqState*> sp;
      Status s;
      double tf = now_s();
      for (int64_t i = 0; i < B && s.ok(); ++i) {
        auto r = gm.new_state();
        if (!r.ok()) s = r.status();
        else s = gm.fill_synthetic(*r.value(), T, uint64_t(1000 * B + i), 2 * a.steps + 8), st.push_back(std::move(r).value());
      }
      if (!s.ok()) {
        std::printf("%s B=%lld T=%lld: %s\n", name.c_str(), (long long)B, (long long)T, s.message().c_str());
        continue;
      }
      for (auto& x : st) sp.push_back(x.get());
      const double fill_s = now_s() - tf;
      std::vector<int32_t> tok(static_cast<size_t>(B));
      std::vector<std::span<const int32_t>> spans;
      for (int64_t i = 0; i < B; ++i) spans.emplace_back(&tok[size_t(i)], 1);
      std::vector<std::vector<float>> logits;
      auto step = [&]() -> double {
        for (auto& x : tok) x = int32_t(rng() % 1024);
        const double t = now_s();
        Status r = gm.forward_batch(sp, spans, &logits);
        if (!r.ok()) std::printf("  step: %s\n", r.message().c_str());
        return r.ok() ? (now_s() - t) * 1e3 : -1;
      };
      // graphs: the bucket's first step is eager, the second captures, then replays
      gm.set_cuda_graph(true);
      std::vector<double> tg, te;
      const double first = step();
      if (first < 0) continue;
      const int n = std::max(1, std::min(a.steps, int((left - 2) / (4 * first * 1e-3))));
      step();
      for (int i = 0; i < n; ++i) tg.push_back(step());
      gm.set_cuda_graph(false);
      for (int i = 0; i < n; ++i) te.push_back(step());
      gpu::GpuStepProfile prof;
      gm.set_profile(&prof);
      step();
      gm.set_profile(nullptr);
      if (a.profile_step && !profiled) {  // one eager step for a kernel profiler (--profile-step)
        profiled = true;
        cudaDeviceSynchronize();
        cudaProfilerStart();
        step();
        cudaDeviceSynchronize();
        cudaProfilerStop();
      }
      gm.set_cuda_graph(true);
      const double floor_ms = step_bytes(c, w, B, T) / bw * 1e3, mg = median(tg), me = median(te);
      prev_ms = std::min(mg, me), prev_T = double(T);
      std::printf("%s B=%lld T=%lld: graph %.3f ms, eager %.3f ms, floor %.3f ms (%.2f GB) -> %.2fx; fill %.1f s;"
                  " profile %.3f ms:", name.c_str(), (long long)B, (long long)T, mg, me, floor_ms,
                  step_bytes(c, w, B, T) / 1e9, mg / floor_ms, fill_s, prof.total_ms);
      for (int m = 0; m < int(gpu::GpuModule::count); ++m)
        std::printf(" %s %.3f", gpu::gpu_module_name(gpu::GpuModule(m)), prof.ms[m]);
      std::printf("\n");
      const std::string tag = "decode b" + std::to_string(B) + " ctx" + std::to_string(T);
      out.line(name, tag + " ms/step graph", mg, "ms", "byte floor", floor_ms, B == 1 ? 1.25 : 0);
      out.line(name, tag + " ms/step eager", me, "ms", "byte floor", floor_ms);
      for (int m = 0; m < int(gpu::GpuModule::count); ++m)
        if (prof.ms[m] > 0)
          out.line(name, tag + " module " + gpu::gpu_module_name(gpu::GpuModule(m)) + " ms (eager, events)",
                   prof.ms[m], "ms");
      const gpu::GpuGraphStats g = gm.graph_stats();
      std::printf("  graphs so far: %d captured, %d replayed, %d failed%s%s\n", g.captures, g.replays, g.failed,
                  g.eager_reason.empty() ? "" : " (", (g.eager_reason + (g.eager_reason.empty() ? "" : ")")).c_str());
    }
  }
}

}  // namespace

int run_model(const Args& a, Out& out, const std::string& name, const std::string& dir, double bw, double t0) {
  double t = now_s();
  auto ck = Checkpoint::open(dir);
  if (!ck.ok()) return std::printf("%s: %s\n", name.c_str(), ck.status().message().c_str()), 1;
  const double open_s = now_s() - t;
  ModelOptions o;
  o.precision = Precision::bf16;
  auto gm = gpu::GpuModel::load(*ck.value(), o);
  if (!gm.ok()) return std::printf("%s: %s\n", name.c_str(), gm.status().message().c_str()), 1;
  const double load_s = now_s() - t;
  std::printf("%s: open %.1f s, open + upload %.1f s, %.2f GB on the GPU\n", name.c_str(), open_s, load_s,
              double(gm.value()->weight_bytes()) / 1e9);
  out.line(name, "load s (open + bind + upload)", load_s, "s");
  int rc = 0;
  if (a.check) rc |= check(out, name, *ck.value(), *gm.value());
  if (a.decode) decode(a, out, name, *ck.value(), *gm.value(), bw, t0);
  return rc;
}

}  // namespace slice
