// fuzz_config: arbitrary text as config.json -> parse_hf_config (io/hf_config.h). Must never crash;
// an accepted config must be internally consistent (one attention kind and one FFN kind per layer).
#include <cstdint>
#include <string_view>

#include "core/log.h"
#include "io/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = (k3::set_log_level(k3::LogLevel::error), true);
  (void)quiet;
  auto r = k3::parse_hf_config(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  if (!r.ok()) return 0;
  const k3::ModelConfig& c = r.value();
  K3_ASSERT(c.n_layer > 0 && int(c.layer_attn.size()) == c.n_layer && int(c.layer_moe.size()) == c.n_layer);
  K3_ASSERT(c.moe.n_expert_used <= c.moe.n_expert);
  K3_ASSERT(c.n_layers_of(k3::AttnKind::kda) + c.n_layers_of(k3::AttnKind::mla) +
                c.n_layers_of(k3::AttnKind::dsa) ==
            c.n_layer);
  K3_ASSERT(!c.dsa.enabled || c.family == k3::Family::k3_1);
  return 0;
}
