// k3 plan -m DIR | --config FILE [--gpus N] [--nodes M] [--context T] [--batch B] [--precision fp32|bf16|fp8]
//         [--state-dtype fp32|bf16] [--gpu-mem GB] [--layout tp8xep16] [--all] [--json]
// Memory per GPU (weights by shard kind, KDA state, MLA latent / DSA index caches, workspace) and decode
// traffic (weights + cache bytes per token, TP / EP / KCP bytes per layer) for a multi-GPU layout; without
// --layout, the smallest layout that fits (dist/plan.h, docs/plan.md). Weight bytes come from the loader's
// manifest: with -m, dtypes as the checkpoint stores them.
// Exit codes: 0 a layout fits, 3 none fits (the closest is shown), 1 bad input.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "dist/plan.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"

namespace k3::cli {

namespace {

struct PlanArgs {
  std::string dir, config, layout, precision = "bf16", state_dtype = "fp32";
  int gate_rank = 128;  // MODEL.md §4: f_a_proj [128, D] for KL and K3 (not a config key)
  double gpu_mem_gb = 141.0, reserve_gib = 2.0;
  bool json = false, all = false, no_validate = false;
  PlanOptions opt;
};

// Bytes in the largest decimal unit that keeps the number >= 1 (GB = 1e9: GPU memory is sold that way).
std::string human(double bytes) {
  static const char* kUnit[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (u < 4 && std::abs(bytes) >= 1000.0) bytes /= 1000.0, ++u;
  char b[48];
  std::snprintf(b, sizeof b, u ? "%.2f %s" : "%.0f %s", bytes, kUnit[u]);
  return b;
}

nlohmann::ordered_json plan_json(const Plan& p, const PlanOptions& o) {
  const Layout& l = p.layout;
  const GpuMemory& m = p.mem;
  return {{"layout",
           {{"name", l.name()},
            {"tp", l.tp},
            {"kcp", l.kcp},
            {"dp", l.dp},
            {"ep", l.ep},
            {"world", l.world()},
            {"nodes", (l.world() + o.gpus_per_node - 1) / o.gpus_per_node}}},
          {"fits", p.fits},
          {"per_gpu",
           {{"weights", m.weights()},
            {"weights_replicated", m.weights_replicated},
            {"weights_tp", m.weights_tp},
            {"weights_ep", m.weights_ep},
            {"kda_state", m.kda_state},
            {"mla_cache", m.mla_cache},
            {"dsa_cache", m.dsa_cache},
            {"workspace", m.workspace},
            {"total", m.total()},
            {"gpu_mem", o.gpu_mem}}},
          {"decode",
           {{"weight_bytes_per_token", p.decode.weight_bytes_per_token},
            {"cache_bytes_per_token", p.decode.cache_bytes_per_token},
            {"gpu_bytes_per_step", p.decode.gpu_bytes_per_step},
            {"step_ms_bandwidth_bound", p.decode.step_seconds * 1e3}}},
          {"comm_per_layer",
           {{"tp_allreduce_decode", p.comm.tp_decode},
            {"ep_alltoall_decode", p.comm.ep_decode},
            {"kcp_decode", p.comm.kcp_decode},
            {"tp_allreduce_prefill_per_token", p.comm.tp_prefill_per_token},
            {"ep_alltoall_prefill_per_token", p.comm.ep_prefill_per_token},
            {"kcp_prefill_kda_layer", p.comm.kcp_prefill_kda},
            {"kcp_prefill_mla_layer", p.comm.kcp_prefill_mla}}}};
}

void print_plan(const Plan& p, const PlanOptions& o) {
  const GpuMemory& m = p.mem;
  std::printf("\nlayout %s: %d GPU(s), %s\n", p.layout.name().c_str(), p.layout.world(),
              p.fits ? "fits" : "does NOT fit");
  std::printf("  per GPU: weights %s (replicated %s, TP shard %s, experts %s)\n", human(m.weights()).c_str(),
              human(m.weights_replicated).c_str(), human(m.weights_tp).c_str(), human(m.weights_ep).c_str());
  std::printf("           KDA state %s, MLA latent %s, DSA index %s, workspace %s\n",
              human(m.kda_state).c_str(), human(m.mla_cache).c_str(), human(m.dsa_cache).c_str(),
              human(m.workspace).c_str());
  std::printf("           total %s of %s\n", human(m.total()).c_str(), human(o.gpu_mem).c_str());
  std::printf(
      "  decode per token: weights %s + cache %s read; busiest GPU reads %s per step, >= %.4g ms at "
      "%.0f GB/s\n",
      human(p.decode.weight_bytes_per_token).c_str(), human(p.decode.cache_bytes_per_token).c_str(),
      human(p.decode.gpu_bytes_per_step).c_str(), p.decode.step_seconds * 1e3, o.hbm_bytes_per_s / 1e9);
  std::printf("  sent per GPU per layer, decode step: TP all-reduce %s, EP all-to-all %s, KCP %s\n",
              human(p.comm.tp_decode).c_str(), human(p.comm.ep_decode).c_str(),
              human(p.comm.kcp_decode).c_str());
  std::printf("  prefill: TP %s/token, EP %s/token; KCP all-gather %s per KDA layer, %s per MLA/DSA layer\n",
              human(p.comm.tp_prefill_per_token).c_str(), human(p.comm.ep_prefill_per_token).c_str(),
              human(p.comm.kcp_prefill_kda).c_str(), human(p.comm.kcp_prefill_mla).c_str());
}

void run_plan(PlanArgs& a) {
  PlanOptions& o = a.opt;
  o.gpu_mem = int64_t(a.gpu_mem_gb * 1e9);
  o.reserve = int64_t(a.reserve_gib * double(int64_t(1) << 30));
  if (!cache_format_from_name(a.precision, &o.cache) ||
      (a.state_dtype != "fp32" && a.state_dtype != "bf16")) {
    std::fprintf(stderr, "k3 plan: --precision is fp32|bf16|fp8 and --state-dtype fp32|bf16\n");
    exit_code() = 1;
    return;
  }
  o.state_bf16 = a.state_dtype == "bf16";

  std::unique_ptr<Checkpoint> ck;
  ModelConfig cfg;
  std::string source;
  if (!a.dir.empty()) {
    CheckpointOptions copt;
    copt.validate = !a.no_validate;
    copt.progress = !a.json && isatty(STDERR_FILENO);
    auto r = Checkpoint::open(a.dir, copt);
    if (!r.ok())
      return (void)(std::fprintf(stderr, "k3 plan: %s\n", r.status().message().c_str()), exit_code() = 1);
    ck = std::move(*r);
    cfg = ck->config();
    source = a.dir;
  } else {
    auto r = load_hf_config(a.config);
    if (!r.ok())
      return (void)(std::fprintf(stderr, "k3 plan: %s\n", r.status().message().c_str()), exit_code() = 1);
    cfg = *r;
    if (cfg.kda.gate_rank == 0) cfg.kda.gate_rank = a.gate_rank;
    source = a.config;
  }
  std::function<const TensorView*(const std::string&)> find;
  if (ck) find = [&](const std::string& n) { return ck->find(n); };
  const std::vector<PlanTensor> w = plan_tensors(cfg, find);

  std::optional<Plan> chosen;
  std::vector<Plan> plans;
  if (!a.layout.empty()) {
    auto l = parse_layout(a.layout);
    Status s = l.ok() ? check_layout(cfg, *l, o) : l.status();
    if (!s.ok()) return (void)(std::fprintf(stderr, "k3 plan: %s\n", s.message().c_str()), exit_code() = 1);
    chosen = evaluate_plan(cfg, w, *l, o);
  } else {
    plans = all_plans(cfg, w, o);
    chosen = smallest_fit(plans);
    if (!chosen && !plans.empty()) {  // nothing fits: the least memory on the largest world
      for (const Plan& p : plans)
        if (!chosen || std::make_pair(-p.layout.world(), p.mem.total()) <
                           std::make_pair(-chosen->layout.world(), chosen->mem.total()))
          chosen = p;
    }
  }
  if (!chosen)
    return (void)(std::fprintf(stderr, "k3 plan: no valid layout for this model\n"), exit_code() = 1);

  std::map<std::string, int64_t> by_dtype, by_shard;
  int64_t total = 0;
  for (const PlanTensor& t : w) {
    by_dtype[std::string(dtype_name(t.dtype))] += t.bytes;
    by_shard[shard_name(t.shard)] += t.bytes;
    total += t.bytes;
  }
  const SeqCacheBytes sc = seq_cache_bytes(cfg, o.cache, o.state_bf16);
  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = {{"source", source},
                  {"family", family_name(cfg.family)},
                  {"n_layer", cfg.n_layer},
                  {"kda_layers", cfg.n_layers_of(AttnKind::kda)},
                  {"mla_layers", cfg.n_layers_of(AttnKind::mla)},
                  {"dsa_layers", cfg.n_layers_of(AttnKind::dsa)},
                  {"n_tensors", w.size()}};
    j["weights"] = {{"total", total}, {"by_dtype", by_dtype}, {"by_shard", by_shard}};
    j["cache"] = {{"format", cache_format_name(o.cache)}, {"state_dtype", a.state_dtype},
                  {"kda_state_per_seq", sc.kda_state},    {"mla_per_token", sc.mla_per_token},
                  {"dsa_per_token", sc.dsa_per_token},    {"per_seq_at_context", sc.at(o.context)}};
    j["options"] = {{"gpus_per_node", o.gpus_per_node},
                    {"nodes", o.nodes},
                    {"context", o.context},
                    {"batch", o.batch},
                    {"gpu_mem", o.gpu_mem},
                    {"reserve", o.reserve},
                    {"chunk", o.chunk}};
    j["plan"] = plan_json(*chosen, o);
    if (a.all) {
      j["candidates"] = nlohmann::ordered_json::array();
      for (const Plan& p : plans) j["candidates"].push_back(plan_json(p, o));
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model: %s (%s, %d layers: %d KDA, %d MLA, %d DSA)\n", source.c_str(),
                family_name(cfg.family), cfg.n_layer, cfg.n_layers_of(AttnKind::kda),
                cfg.n_layers_of(AttnKind::mla), cfg.n_layers_of(AttnKind::dsa));
    std::printf("weights: %s (%lld B) in %zu tensors:", human(double(total)).c_str(), (long long)total,
                w.size());
    for (const auto& [d, b] : by_dtype) std::printf(" %s %s;", d.c_str(), human(double(b)).c_str());
    std::printf("\n  experts (EP) %s, TP-sharded %s, replicated %s\n", human(by_shard["ep"]).c_str(),
                human(by_shard["tp"]).c_str(), human(by_shard["replicated"]).c_str());
    std::printf("cache per sequence (%s, S %s): KDA state %s + %lld B per token (latent %lld, index %lld)\n",
                cache_format_name(o.cache), a.state_dtype.c_str(), human(sc.kda_state).c_str(),
                (long long)(sc.mla_per_token + sc.dsa_per_token), (long long)sc.mla_per_token,
                (long long)sc.dsa_per_token);
    std::printf("context %lld, batch %lld, %d GPU(s) per node x %d node(s), %s per GPU\n",
                (long long)o.context, (long long)o.batch, o.gpus_per_node, o.nodes, human(o.gpu_mem).c_str());
    if (a.all)
      for (const Plan& p : plans) print_plan(p, o);
    if (a.layout.empty())
      std::printf(chosen->fits ? "\nsmallest layout that fits:" : "\nno layout fits; closest:");
    print_plan(*chosen, o);
  }
  if (!chosen->fits) exit_code() = 3;
}

}  // namespace

void add_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Memory per GPU and traffic per token for a multi-GPU layout");
  auto a = std::make_shared<PlanArgs>();
  auto* m = cmd->add_option("-m,--model", a->dir, "checkpoint directory (dtypes as stored)");
  auto* c = cmd->add_option("--config", a->config, "config.json alone (e.g. docs/configs/kimi-k3.json)");
  m->excludes(c);
  cmd->add_option("--gpus", a->opt.gpus_per_node, "GPUs per node")->check(CLI::Range(1, 1024));
  cmd->add_option("--nodes", a->opt.nodes, "nodes")->check(CLI::Range(1, 4096));
  cmd->add_option("--context", a->opt.context, "tokens per sequence")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 32));
  cmd->add_option("--batch", a->opt.batch, "sequences decoded together")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("--precision", a->precision, "cache storage: fp32 (CPU engine), bf16 (MODEL.md), fp8");
  cmd->add_option("--state-dtype", a->state_dtype, "KDA state S: fp32 or bf16");
  cmd->add_option("--gpu-mem", a->gpu_mem_gb, "memory per GPU in GB (1e9 B)")->check(CLI::Range(0.001, 1e6));
  cmd->add_option("--reserve", a->reserve_gib, "fixed per-GPU reserve in GiB")->check(CLI::Range(0.0, 1e4));
  cmd->add_option("--chunk", a->opt.chunk, "prefill tokens per step")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("--layout", a->layout, "evaluate this layout (tp8xep16, TP8xKCP2xEP16, ...)");
  cmd->add_option("--gate-rank", a->gate_rank, "KDA gate rank with --config (128)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_flag("--all", a->all, "also list every valid layout");
  cmd->add_flag("--json", a->json, "JSON output");
  cmd->add_flag("--no-validate", a->no_validate, "with -m: skip the MXFP4 scale scan");
  cmd->callback([a] {
    if (a->dir.empty() == a->config.empty()) {
      std::fprintf(stderr, "k3 plan: give -m DIR or --config FILE\n");
      exit_code() = 1;
      return;
    }
    run_plan(*a);
  });
}

}  // namespace k3::cli
