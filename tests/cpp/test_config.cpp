// test_config.cpp: config.json -> ModelConfig for the three families, and every unsupported or
// malformed value rejected with a message naming the key (MODEL.md §1-2, §6, §8.3).
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/hf_config.h"

namespace k3 {
namespace {

using json = nlohmann::json;

json tiny_config(const char* model) {
  std::ifstream in(std::string(K3_SOURCE_DIR) + "/models/" + model + "/config.json");
  return json::parse(in);
}

Result<ModelConfig> parse(const json& j) {
  return parse_hf_config(j.dump(), "cfg.json");
}

// Applies `edit` to the text keys (text_config for K3) of a tiny config and expects a rejection
// whose message contains every one of `parts`.
void expect_rejected(const char* model, const std::function<void(json&)>& edit,
                     std::initializer_list<const char*> parts) {
  json j = tiny_config(model);
  edit(j.contains("text_config") ? j["text_config"] : j);
  auto r = parse(j);
  ASSERT_FALSE(r.ok()) << model << ": accepted " << j.dump().substr(0, 80);
  for (const char* p : parts)
    EXPECT_NE(r.status().message().find(p), std::string::npos)
        << "'" << p << "' not in: " << r.status().message();
}

TEST(Config, KimiLinearFlat) {
  auto r = parse(tiny_config("tiny-kl"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.family, Family::kimi_linear);
  EXPECT_EQ(c.chat_format(), ChatFormat::k2);
  EXPECT_EQ(c.d_model, 64);
  EXPECT_EQ(c.n_layer, 6);
  EXPECT_EQ(c.n_vocab, 1280);
  EXPECT_EQ(c.act, Activation::silu);
  EXPECT_EQ(c.kda.n_head, 2);
  EXPECT_EQ(c.kda.d_head, 16);
  EXPECT_FALSE(c.kda.full_rank_gate);
  EXPECT_FALSE(c.kda.has_gate_lower_bound);
  EXPECT_EQ(c.mla.q_lora_rank, 0);  // null
  EXPECT_EQ(c.mla.d_latent(), 40);
  EXPECT_FLOAT_EQ(c.moe.routed_scaling_factor, 2.446f);
  EXPECT_FALSE(c.moe.experts_mxfp4);
  EXPECT_FALSE(c.uses_attn_res());
  EXPECT_EQ(c.n_layers_of(AttnKind::mla), 2);
  EXPECT_EQ(c.layer_attn[3], AttnKind::mla);  // 1-based 4
  EXPECT_EQ(c.layer_attn[5], AttnKind::mla);  // 1-based 6
  EXPECT_FALSE(c.layer_moe[0]);
  EXPECT_TRUE(c.layer_moe[1]);
  EXPECT_EQ(c.bos_id, 1024);
  EXPECT_EQ(c.eos_id, 1026);
  EXPECT_EQ(c.pad_id, 1279);
}

TEST(Config, K3NestedAndK31Dsa) {
  auto r3 = parse(tiny_config("tiny-k3"));
  ASSERT_TRUE(r3.ok()) << r3.status().message();
  EXPECT_EQ(r3->family, Family::k3);
  EXPECT_EQ(r3->chat_format(), ChatFormat::k3_xtml);
  EXPECT_EQ(r3->act, Activation::situ);
  EXPECT_FLOAT_EQ(r3->situ_beta, 4.f);
  EXPECT_TRUE(r3->has_situ_linear_beta);
  EXPECT_FLOAT_EQ(r3->situ_linear_beta, 25.f);
  EXPECT_TRUE(r3->kda.full_rank_gate);
  EXPECT_FLOAT_EQ(r3->kda.gate_lower_bound, -5.f);
  EXPECT_EQ(r3->mla.q_lora_rank, 32);
  EXPECT_TRUE(r3->mla.use_output_gate);
  EXPECT_EQ(r3->moe.d_latent, 32);
  EXPECT_TRUE(r3->moe.latent_norm);
  EXPECT_TRUE(r3->moe.experts_mxfp4);
  EXPECT_EQ(r3->attn_res_block_size, 3);
  EXPECT_FALSE(r3->dsa.enabled);
  EXPECT_EQ(r3->n_layers_of(AttnKind::mla), 2);

  auto r31 = parse(tiny_config("tiny-k31"));
  ASSERT_TRUE(r31.ok()) << r31.status().message();
  EXPECT_EQ(r31->family, Family::k3_1);
  EXPECT_TRUE(r31->dsa.enabled);
  EXPECT_EQ(r31->dsa.n_head, 2);
  EXPECT_EQ(r31->dsa.d_head, 16);
  EXPECT_EQ(r31->dsa.topk, 8);
  EXPECT_EQ(r31->n_layers_of(AttnKind::dsa), 2);
  EXPECT_EQ(r31->n_layers_of(AttnKind::mla), 0);
  EXPECT_EQ(r31->layer_attn[7], AttnKind::dsa);
  EXPECT_EQ(r31->dsa_index_bytes_per_token_per_layer(), 32);
}

TEST(Config, UnsupportedMoeValues) {
  expect_rejected("tiny-kl", [](json& t) { t["num_expert_group"] = 2; },
                  {"num_expert_group = 2", "not supported"});
  expect_rejected("tiny-k3", [](json& t) { t["topk_group"] = 4; }, {"text_config.topk_group = 4"});
  expect_rejected("tiny-kl", [](json& t) { t["moe_router_activation_func"] = "softmax"; },
                  {"moe_router_activation_func", "softmax"});
  expect_rejected("tiny-k3", [](json& t) { t["topk_method"] = "greedy"; },
                  {"text_config.topk_method", "greedy"});
  expect_rejected("tiny-kl", [](json& t) { t["num_experts_per_token"] = 9; },
                  {"num_experts_per_token = 9", "exceeds"});
}

TEST(Config, UnsupportedModelValues) {
  expect_rejected("tiny-kl", [](json& t) { t["tie_word_embeddings"] = true; },
                  {"tie_word_embeddings = true"});
  expect_rejected("tiny-k3", [](json& t) { t["num_nextn_predict_layers"] = 1; },
                  {"text_config.num_nextn_predict_layers = 1", "MTP"});
  expect_rejected("tiny-kl", [](json& t) { t["hidden_act"] = "gelu"; }, {"hidden_act = \"gelu\""});
  expect_rejected("tiny-kl", [](json& t) { t["mla_use_nope"] = false; }, {"mla_use_nope"});
  expect_rejected("tiny-kl", [](json& t) { t["model_type"] = "llama"; }, {"model_type \"llama\""});
  expect_rejected("tiny-kl", [](json& t) { t.erase("hidden_size"); }, {"missing key hidden_size"});
  expect_rejected("tiny-k3", [](json& t) { t["linear_attn_config"].erase("num_heads"); },
                  {"missing key text_config.linear_attn_config.num_heads"});
  expect_rejected("tiny-kl", [](json& t) { t["num_hidden_layers"] = "six"; },
                  {"num_hidden_layers must be an integer"});
  expect_rejected("tiny-kl", [](json& t) { t["hidden_size"] = -4; }, {"hidden_size = -4", "out of range"});
  json j = tiny_config("tiny-k3");
  j["quantization_config"]["format"] = "nvfp4-pack-quantized";
  auto r = parse(j);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("quantization_config.format = nvfp4-pack-quantized"), std::string::npos)
      << r.status().message();
  j = tiny_config("tiny-k3");
  j.erase("text_config");
  r = parse(j);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing key text_config"), std::string::npos) << r.status().message();
}

TEST(Config, LayerListsEachLayerExactlyOnce) {
  expect_rejected("tiny-kl", [](json& t) { t["linear_attn_config"]["kda_layers"].push_back(4); },
                  {"layer 4 (1-based)", "more than one"});
  expect_rejected("tiny-k3", [](json& t) { t["linear_attn_config"]["full_attn_layers"] = {4}; },
                  {"layer 8 (1-based)", "neither"});
  expect_rejected("tiny-kl",
                  [](json& t) {
                    t["linear_attn_config"]["full_attn_layers"] = {4, 7};
                  },
                  {"full_attn_layers entry 7", "[1, 6]"});
}

TEST(Config, DsaConfigRequiredKeysAndValues) {
  for (const char* key : {"dsa_layers", "index_num_heads", "index_head_dim", "index_topk", "index_topk_freq",
                          "index_k_norm_type"})
    expect_rejected("tiny-k31", [&](json& t) { t["dsa_config"].erase(key); },
                    {"missing key text_config.dsa_config.", key});
  expect_rejected("tiny-k31", [](json& t) { t["dsa_config"]["index_topk_freq"] = 2; },
                  {"index_topk_freq = 2"});
  expect_rejected("tiny-k31", [](json& t) { t["dsa_config"]["index_k_norm_type"] = "rmsnorm"; },
                  {"index_k_norm_type = \"rmsnorm\"", "layernorm"});
  expect_rejected("tiny-k31", [](json& t) { t["dsa_config"]["dsa_layers"] = {4}; },
                  {"dsa_config.dsa_layers", "full_attn_layers"});
  // index_skip_topk_offset is logged, not rejected.
  json j = tiny_config("tiny-k31");
  j["text_config"]["dsa_config"]["index_skip_topk_offset"] = 3;
  EXPECT_TRUE(parse(j).ok());
}

TEST(Config, BadJsonAndMissingFile) {
  auto r = parse_hf_config("{\"model_type\": \"kimi_linear\",", "cfg.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cfg.json: not valid JSON"), std::string::npos) << r.status().message();
  r = parse_hf_config(R"({"model_type": "kimi_linear", "model_type": "kimi_k3"})", "cfg.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("duplicate key \"model_type\""), std::string::npos);
  r = load_hf_config("/nonexistent/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::not_found);
}

}  // namespace
}  // namespace k3
