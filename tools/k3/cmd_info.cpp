// k3 info -m DIR: opens a checkpoint (config + every tensor validated) and prints what it holds:
//   family and architecture summary, one line per layer ("layer 3: MLA MoE block 1"),
//   parameter counts (total; active per token = all but the routed experts + n_expert_used of them),
//   cache bytes per token per kind and the fixed KDA state per sequence (MODEL.md §11),
//   weight bytes by dtype. Errors: exit code 1 with the Status message.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>

#include "commands.h"
#include "io/checkpoint.h"
#include "io/manifest.h"

namespace k3::cli {

namespace {

std::string millions(int64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lld (%.3f M)", (long long)n, double(n) / 1e6);
  return buf;
}

void print_summary(const ModelConfig& c) {
  std::printf("family: %s (model_type %s)\n", family_name(c.family), c.model_type.c_str());
  std::printf("d_model %d, layers %d (%d KDA, %d MLA, %d DSA), vocab %d, rms_norm_eps %g\n", c.d_model,
              c.n_layer, c.n_layers_of(AttnKind::kda), c.n_layers_of(AttnKind::mla),
              c.n_layers_of(AttnKind::dsa), c.n_vocab, double(c.rms_norm_eps));
  std::printf("KDA: %d heads x %d, conv %d, gate rank %d, ", c.kda.n_head, c.kda.d_head, c.kda.conv_size,
              c.kda.gate_rank);
  if (c.kda.has_gate_lower_bound)
    std::printf("decay lb*sigmoid(exp(A_log) z), lb %g", double(c.kda.gate_lower_bound));
  else
    std::printf("decay -exp(A_log) softplus(z)");
  std::printf(", output gate %s\n", c.kda.full_rank_gate ? "g_proj (full rank)" : "g_a_proj/g_b_proj");
  const MlaConfig& m = c.mla;
  std::printf("MLA: %d heads, q_lora %d, kv_lora %d, nope/rope/v %d/%d/%d, output gate %s\n", m.n_head,
              m.q_lora_rank, m.kv_lora_rank, m.d_nope, m.d_rope, m.d_v, m.use_output_gate ? "yes" : "no");
  if (c.dsa.enabled)
    std::printf("DSA: index %d heads x %d, topk %d\n", c.dsa.n_head, c.dsa.d_head, c.dsa.topk);
  else
    std::printf("DSA: none\n");
  if (c.act == Activation::situ) {
    std::printf("MLP: situ (beta %g", double(c.situ_beta));
    if (c.has_situ_linear_beta) std::printf(", linear beta %g", double(c.situ_linear_beta));
    std::printf("), dense d_ff %d\n", c.d_ff);
  } else {
    std::printf("MLP: silu, dense d_ff %d\n", c.d_ff);
  }
  const MoeConfig& e = c.moe;
  std::printf("MoE: %d experts, %d used, %d shared, d_ff %d", e.n_expert, e.n_expert_used, e.n_shared_expert,
              e.d_ff_expert);
  if (e.d_latent > 0) std::printf(", latent %d%s", e.d_latent, e.latent_norm ? " (norm)" : "");
  std::printf(", routed scaling %g, experts %s\n", double(e.routed_scaling_factor),
              e.experts_mxfp4 ? "MXFP4" : "BF16");
  if (c.uses_attn_res())
    std::printf("AttnRes: block size %d\n", c.attn_res_block_size);
  else
    std::printf("AttnRes: none\n");
  std::printf("token ids: bos %d, eos %d, pad %d\n", c.bos_id, c.eos_id, c.pad_id);
}

void print_layers(const ModelConfig& c) {
  std::printf("layers:\n");
  for (int i = 0; i < c.n_layer; ++i) {
    std::printf("  layer %d: %s %s", i, attn_kind_name(c.layer_attn[size_t(i)]),
                c.layer_moe[size_t(i)] ? "MoE" : "dense");
    if (c.uses_attn_res()) std::printf(" block %d", i / c.attn_res_block_size);
    std::printf("\n");
  }
}

void print_sizes(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  auto has = [&](const std::string& n) { return ck.find(n) != nullptr; };
  const ParamCount p = count_params(c, expected_tensors(c, has));
  std::printf("params: total %s, active per token %s\n", millions(p.total).c_str(),
              millions(p.active).c_str());

  const int n_mla = c.n_layers_of(AttnKind::mla) + c.n_layers_of(AttnKind::dsa),
            n_dsa = c.n_layers_of(AttnKind::dsa);
  const int64_t lat = c.mla_bytes_per_token_per_layer(), idx = c.dsa_index_bytes_per_token_per_layer();
  std::printf("cache per token: %lld B (MLA latent %lld B x %d layers",
              (long long)(lat * n_mla + idx * n_dsa), (long long)lat, n_mla);
  if (n_dsa) std::printf(", DSA index key %lld B x %d layers", (long long)idx, n_dsa);
  const int n_kda = c.n_layers_of(AttnKind::kda);
  const int64_t kda = c.kda_state_bytes_per_layer();
  std::printf(")\nKDA state per sequence: %lld B (%lld B x %d layers)\n", (long long)(kda * n_kda),
              (long long)kda, n_kda);

  std::map<std::string, std::pair<int64_t, int64_t>> by_dtype;  // dtype -> (tensors, bytes)
  for (const std::string& n : ck.names()) {
    const TensorView* t = ck.find(n);
    auto& [count, bytes] = by_dtype[std::string(dtype_name(t->dtype))];
    ++count;
    bytes += int64_t(t->nbytes);
  }
  std::printf("weights by dtype:");
  for (const auto& [d, cb] : by_dtype)
    std::printf(" %s %lld B (%lld tensors);", d.c_str(), (long long)cb.second, (long long)cb.first);
  std::printf("\n");
}

}  // namespace

void add_info(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("info", "Open a checkpoint, validate it and print its architecture and sizes");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("-m,--model", *dir, "checkpoint directory (config.json + safetensors)")->required();
  cmd->callback([dir] {
    CheckpointOptions opt;
    opt.progress = isatty(STDERR_FILENO);
    auto ck = Checkpoint::open(*dir, opt);
    if (!ck.ok()) {
      std::fprintf(stderr, "k3 info: %s\n", ck.status().message().c_str());
      exit_code() = 1;
      return;
    }
    std::printf("model: %s\n", (*ck)->dir().c_str());
    print_summary((*ck)->config());
    print_layers((*ck)->config());
    print_sizes(**ck);
  });
}

}  // namespace k3::cli
