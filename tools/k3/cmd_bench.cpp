// k3 bench: prefill and decode speed, with decode set against the machine's read bandwidth
// (llama-bench's pp/tg tests plus a roofline ratio).
//
//   k3 bench -m DIR [-p 128,512] [-n 32] [-b 1,4] [-r REPS] [--precision fp32|bf16] [-t THREADS]
//            [--jsonl FILE] [--bench NAME] [--commit SHA] [--goal F] [--bw-mb MB]
//
// ppP:     one fresh sequence, P random ids in one forward call: tokens/s = P / t.
// tgN x B: B fresh sequences, N decode steps of one id each (forward_batch when B > 1): tokens/s = B N / t.
// bytes/step (what a decode step must read) =
//     dense weights (every tensor but the routed experts and the embedding table)
//   + routed-expert bytes per expert x E[distinct experts], E = n_expert (1 - (1 - k / n_expert)^B)
//   + B x (one embedding row + the sequence state: KDA S and conv windows, MLA latent / DSA index cache,
//          SeqState::bytes() averaged over the run)
// fraction of bandwidth = bytes/step x steps / t / read bandwidth (core/bandwidth.h, same thread count).
// cpu % = process CPU time / (t x threads) over the same runs: well under 100% means the threads waited for
// a core (a shared machine) or for each other, and the wall-clock numbers say more about the machine.
// The median of REPS runs is reported. --jsonl appends one JSON object per result: bench, commit (--commit
// or $K3_COMMIT), machine ($K3_MACHINE or host + CPU), metric, value, unit, peer, peer_value, ratio, goal,
// met.
// --device cuda: the ceiling is the device's copy bandwidth (a 1 GiB device-to-device copy, bytes read +
// written, median of 10, measured in the same run), and every test gets a byte floor: decode step =
// bytes/step above / copy bandwidth; prefill = (weights + the state after the prompt) / copy bandwidth. ratio
// = floor / measured time (1 = at the floor). The KDA path (fast bf16 kernels or the generic exact ones) is
// printed.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/bandwidth.h"
#include "core/thread_pool.h"
#include "engine_args.h"
#include "gpu/context.h"

namespace k3::cli {
namespace {

struct BenchArgs {
  ModelArgs model;
  std::vector<int> prompt_lens = {128, 512};
  int n_decode = 32;
  std::vector<int> batches = {1, 4};
  int reps = 3;
  std::string jsonl, bench = "k3_bench", commit;
  double goal = 0.5;  // decode: wanted fraction of the read bandwidth
  int64_t bw_mb = 0;  // 0 = automatic buffer size
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_s() {  // CPU time of the whole process, every thread
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct WeightBytes {
  int64_t dense = 0;        // read once per step
  int64_t expert_each = 0;  // sum over MoE layers of one routed expert's bytes
  int64_t embed_row = 0;
};

WeightBytes weight_bytes(const Checkpoint& ck, const ModelConfig& c) {
  WeightBytes w;
  int64_t experts = 0;
  for (const std::string& name : ck.names()) {
    const TensorView* t = ck.find(name);
    if (!t) continue;
    if (name == "model.embed_tokens.weight")
      w.embed_row = int64_t(t->nbytes) / std::max<int64_t>(t->dim(0), 1);
    else if (name.find(".block_sparse_moe.experts.") != std::string::npos)
      experts += int64_t(t->nbytes);
    else
      w.dense += int64_t(t->nbytes);
  }
  w.expert_each = c.moe.n_expert > 0 ? experts / c.moe.n_expert : 0;
  return w;
}

double distinct_experts(const ModelConfig& c, int batch) {
  const double n = c.moe.n_expert, k = c.moe.n_expert_used;
  return n > 0 ? n * (1.0 - std::pow(1.0 - k / n, batch)) : 0.0;
}

std::string machine_name() {
  if (const char* m = std::getenv("K3_MACHINE")) return m;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::ifstream f("/proc/cpuinfo");
  std::string line, cpu = "unknown CPU";
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  return std::string(host) + " (" + cpu + ", " + std::to_string(std::thread::hardware_concurrency()) +
         " cpus)";
}

struct Row {
  std::string test;
  int batch = 1;
  double tok_s = 0, ms_step = 0, bytes_step = 0, gb_s = 0, frac = -1, cpu = 0;
  double floor_ms = -1;  // --device cuda: bytes / device copy bandwidth for this test's call or step
};

// Device-to-device copy of 1 GiB, median of 10 (after 2 warm-ups): (bytes read + written) / s.
Result<double> device_copy_bandwidth() {
  gpu::ContextOwner ctx;
  K3_RETURN_IF_ERROR(ctx.create());
  const size_t n = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  K3_RETURN_IF_ERROR(gpu::malloc_device(&a, n));
  Status st = gpu::malloc_device(&b, n);
  std::vector<double> t;
  if (st.ok()) st = gpu::memset_device(a, 1, n, ctx.get());
  for (int i = 0; st.ok() && i < 12; ++i) {
    st = gpu::synchronize(ctx.get());
    const double t0 = now_s();
    if (st.ok()) st = gpu::copy_on_device(b, a, n, ctx.get());
    if (st.ok()) st = gpu::synchronize(ctx.get());
    if (i >= 2) t.push_back(now_s() - t0);
  }
  gpu::free_device(a);
  gpu::free_device(b);
  K3_RETURN_IF_ERROR(st);
  return 2.0 * double(n) / median(t);
}

// Which KDA kernels a GPU sequence runs: the fast ones keep a bf16 conv window (gpu/model_gpu.h).
const char* kda_path(const Sequence& s) {
  if (!s.gpu_state) return "cpu";
  for (const gpu::KdaStateGpu& k : s.gpu_state->kda)
    if (k.S) return k.conv16 ? "fast bf16 kernels (ops/kda_fast.h)" : "generic exact kernels (ops/kda.h)";
  return "none (no KDA layer)";
}

Status run(const BenchArgs& a) {
  if (a.n_decode < 1 || a.reps < 1) return error(Code::invalid_argument, "-n and -r must be at least 1");
  if (a.bw_mb < 0 || a.bw_mb > (int64_t(1) << 30))
    return error(Code::invalid_argument, "--bw-mb out of range");
  for (int p : a.prompt_lens)
    if (p < 1) return error(Code::invalid_argument, "-p lengths must be positive");
  for (int b : a.batches)
    if (b < 1) return error(Code::invalid_argument, "-b batch sizes must be positive");
  K3_ASSIGN_OR_RETURN(Loaded l, load_model(a.model, /*with_tokenizer=*/false));
  const ModelConfig& c = l.model->config();
  const int threads =
      a.model.threads > 0 ? a.model.threads : int(std::max(1u, std::thread::hardware_concurrency()));

  BandwidthOptions bo;
  bo.buffer_bytes = a.bw_mb << 20;
  ThreadPool pool(threads);
  K3_ASSIGN_OR_RETURN(BandwidthResult bw, measure_read_bandwidth(&pool, bo));
  const WeightBytes wb = weight_bytes(*l.ckpt, c);

  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> any_id(0, c.n_vocab - 1);
  std::vector<Row> rows;
  std::vector<float> logits;
  std::string kda = "cpu";
  double copy_bw = 0;  // --device cuda
  if (l.gpu) {         // (a failure only drops the floors)
    Result<double> cb = device_copy_bandwidth();
    if (cb.ok())
      copy_bw = *cb;
    else
      std::fprintf(stderr, "k3 bench: device copy bandwidth not measured: %s\n",
                   cb.status().message().c_str());
  }
  {  // warm-up: page in the weights, start the threads
    K3_ASSIGN_OR_RETURN(auto s, new_sequence(l));
    const int32_t id = any_id(rng);
    K3_RETURN_IF_ERROR(s->forward(&id, 1, &logits, false));
    kda = kda_path(*s);
  }
  for (int p : a.prompt_lens) {
    std::vector<int32_t> ids(static_cast<size_t>(p));
    for (auto& id : ids) id = any_id(rng);
    std::vector<double> t;
    double wall = 0, cpu = 0, state = 0;
    for (int r = 0; r < a.reps; ++r) {
      K3_ASSIGN_OR_RETURN(auto s, new_sequence(l));
      const double t0 = now_s(), c0 = cpu_s();
      K3_RETURN_IF_ERROR(s->forward(ids.data(), p, &logits, false));
      t.push_back(now_s() - t0);
      wall += t.back(), cpu += cpu_s() - c0;
      state = double(s->bytes());
    }
    const double tm = median(t);
    rows.push_back({"pp" + std::to_string(p), 1, p / tm, tm * 1e3, 0, 0, -1, cpu / (wall * threads)});
    if (copy_bw > 0)  // every weight once (routed experts: the distinct ones of p tokens) + the state written
      rows.back().floor_ms =
          (double(wb.dense) + double(wb.expert_each) * distinct_experts(c, p) + state) / copy_bw * 1e3;
  }
  for (int b : a.batches) {
    std::vector<double> t;
    double state_bytes = 0, wall = 0, cpu = 0;
    for (int r = 0; r < a.reps; ++r) {
      std::vector<std::unique_ptr<Sequence>> states;
      std::vector<Sequence*> ptrs;
      for (int i = 0; i < b; ++i) {
        K3_ASSIGN_OR_RETURN(auto s, new_sequence(l));
        ptrs.push_back(states.emplace_back(std::move(s)).get());
      }
      std::vector<int32_t> ids(static_cast<size_t>(b));
      std::vector<std::span<const int32_t>> spans;
      for (int i = 0; i < b; ++i) spans.emplace_back(&ids[size_t(i)], 1);
      std::vector<std::vector<float>> last;
      const double before = double(states[0]->bytes());
      const double t0 = now_s(), c0 = cpu_s();
      for (int step = 0; step < a.n_decode; ++step) {
        for (auto& id : ids) id = any_id(rng);
        if (b == 1)
          K3_RETURN_IF_ERROR(states[0]->forward(ids.data(), 1, &logits, false));
        else
          K3_RETURN_IF_ERROR(forward_batch(l, ptrs, spans, &last));
      }
      t.push_back(now_s() - t0);
      wall += t.back(), cpu += cpu_s() - c0;
      state_bytes = 0.5 * (before + double(states[0]->bytes()));
    }
    const double tm = median(t);
    const double bytes = double(wb.dense) + double(wb.expert_each) * distinct_experts(c, b) +
                         b * (double(wb.embed_row) + state_bytes);
    const double gbs = bytes * a.n_decode / tm / 1e9;
    rows.push_back({"tg" + std::to_string(a.n_decode), b, double(b) * a.n_decode / tm, tm * 1e3 / a.n_decode,
                    bytes, gbs, gbs * 1e9 / bw.bytes_per_s, cpu / (wall * threads)});
    if (copy_bw > 0) rows.back().floor_ms = bytes / copy_bw * 1e3;
  }

  std::printf("k3 bench: %s (%s), precision %s, %d threads%s\n", a.model.dir.c_str(), family_name(c.family),
              a.model.precision.c_str(), threads,
              l.gpu ? ", device cuda (% of bw: against the host's read bandwidth, not the GPU's)" : "");
  std::printf("read bandwidth: %.2f GB/s (median %.2f; %lld MiB buffer, %d passes)\n", bw.bytes_per_s / 1e9,
              bw.median_bytes_per_s / 1e9, (long long)(bw.buffer_bytes >> 20), bw.n_passes);
  if (copy_bw > 0) {
    std::printf("device copy bandwidth: %.1f GB/s (1 GiB device-to-device, read + write); KDA: %s\n",
                copy_bw / 1e9, kda.c_str());
    std::printf(
        "byte floor per call (prefill) or step (decode) at that bandwidth; ratio = floor / measured:\n");
    for (const Row& r : rows)
      std::printf("  %-8s b%-3d %10.3f ms measured, floor %8.3f ms, ratio %.3f\n", r.test.c_str(), r.batch,
                  r.ms_step, r.floor_ms, r.floor_ms / r.ms_step);
  }
  std::printf("| %-8s | %5s | %12s | %10s | %12s | %8s | %8s | %6s |\n", "test", "batch", "tokens/s",
              "ms/step", "bytes/step", "GB/s", "% of bw", "cpu %");
  std::printf(
      "|----------|-------|--------------|------------|--------------|----------|----------|--------|\n");
  for (const Row& r : rows) {
    if (r.frac < 0)
      std::printf("| %-8s | %5d | %12.2f | %10.3f | %12s | %8s | %8s | %5.1f%% |\n", r.test.c_str(), r.batch,
                  r.tok_s, r.ms_step, "-", "-", "-", 100 * r.cpu);
    else
      std::printf("| %-8s | %5d | %12.2f | %10.3f | %12.0f | %8.3f | %7.2f%% | %5.1f%% |\n", r.test.c_str(),
                  r.batch, r.tok_s, r.ms_step, r.bytes_step, r.gb_s, 100 * r.frac, 100 * r.cpu);
  }

  if (!a.jsonl.empty()) {
    std::ofstream out(a.jsonl, std::ios::app);
    if (!out) return error(Code::bad_file, a.jsonl + ": cannot open for appending");
    const char* env_commit = std::getenv("K3_COMMIT");
    const std::string commit = !a.commit.empty() ? a.commit : env_commit ? env_commit : "unknown";
    const std::string machine = machine_name();
    std::string model = a.model.dir;
    while (model.size() > 1 && model.back() == '/') model.pop_back();
    model = model.substr(model.find_last_of('/') + 1);
    const std::string cfg =
        " " + model + " " + a.model.precision + " t" + std::to_string(threads) + (l.gpu ? " cuda" : "");
    auto line = [&](const std::string& metric, double value, const char* unit) {
      nlohmann::ordered_json j = {{"bench", a.bench}, {"commit", commit},      {"machine", machine},
                                  {"metric", metric}, {"value", value},        {"unit", unit},
                                  {"peer", nullptr},  {"peer_value", nullptr}, {"ratio", nullptr},
                                  {"goal", nullptr},  {"met", nullptr}};
      return j;
    };
    out << line("read bandwidth" + cfg, bw.bytes_per_s / 1e9, "GB/s").dump() << "\n";
    if (copy_bw > 0) {
      out << line("device copy bandwidth" + cfg, copy_bw / 1e9, "GB/s").dump() << "\n";
      for (const Row& r : rows) {  // time per call / step against its byte floor
        const bool dec = r.frac >= 0;
        nlohmann::ordered_json j =
            line((dec ? "decode ms/step " : "prefill ms ") + r.test + " b" + std::to_string(r.batch) + cfg +
                     " kda:" + kda.substr(0, kda.find(' ')),
                 r.ms_step, "ms");
        j["peer"] = "byte floor (weights + state bytes / device copy bandwidth)";
        j["peer_value"] = r.floor_ms;
        j["ratio"] = r.floor_ms / r.ms_step;
        out << j.dump() << "\n";
      }
    }
    for (const Row& r : rows) {
      nlohmann::ordered_json j =
          line((r.frac < 0 ? "prefill " : "decode ") + r.test + " b" + std::to_string(r.batch) + cfg, r.tok_s,
               "tokens/s");
      if (r.frac >= 0 && !l.gpu) {  // the host's read bandwidth is no roofline for --device cuda
        j["peer"] = "read-bandwidth roofline (bytes/step at the measured read bandwidth)";
        j["peer_value"] = r.tok_s / r.frac;
        j["ratio"] = r.frac;
        j["goal"] = a.goal;
        j["met"] = r.frac >= a.goal;
      }
      out << j.dump() << "\n";
      out << line((r.frac < 0 ? "cpu utilization prefill " : "cpu utilization decode ") + r.test + " b" +
                      std::to_string(r.batch) + cfg,
                  r.cpu, "fraction of threads x wall time")
                 .dump()
          << "\n";
    }
  }
  return ok_status();
}

}  // namespace

void add_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench", "prefill and decode speed against the machine's read bandwidth");
  add_model_options(cmd, &a->model, /*with_device=*/true);
  cmd->add_option("-p,--n-prompt", a->prompt_lens, "prompt lengths (default 128,512)")->delimiter(',');
  cmd->add_option("-n,--n-gen", a->n_decode, "decode steps (default 32)");
  cmd->add_option("-b,--batch", a->batches, "decode batch sizes (default 1,4)")->delimiter(',');
  cmd->add_option("-r,--repetitions", a->reps, "runs per test; the median is reported (default 3)");
  cmd->add_option("--jsonl", a->jsonl, "append JSON lines to this file");
  cmd->add_option("--bench", a->bench, "the 'bench' field of the JSON lines (default k3_bench)");
  cmd->add_option("--commit", a->commit, "the 'commit' field (default $K3_COMMIT)");
  cmd->add_option("--goal", a->goal, "decode goal as a fraction of the read bandwidth (default 0.5)");
  cmd->add_option("--bw-mb", a->bw_mb, "bandwidth buffer in MiB (default max(4 x L3, 256 MiB))");
  cmd->callback([a] {
    Status s = run(*a);
    if (!s.ok()) fail("bench", s);
  });
}

}  // namespace k3::cli
