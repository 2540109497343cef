// test_chat_realtok.cpp: both chat formats on the real tiny tiktoken tokenizers (tests/data/tokenizer-tiny-*,
// 1024 BPE ranks + specials at the real offsets): marker ids by name, segment-wise encoding, forgery,
// round trips through the parsers with multi-token tags and split UTF-8, streaming = whole.
#include <gtest/gtest.h>

#include "chat_test_util.h"
#include "io/chat_k3.h"

namespace k3 {
namespace {

using test::msg;
using test::parse_every_way;
using test::spell;

std::unique_ptr<Tokenizer> open_tiny(const char* family) {
  auto t = Tokenizer::open(std::string(K3_SOURCE_DIR) + "/tests/data/tokenizer-tiny-" + family);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? std::move(t.value()) : nullptr;
}

TEST(ChatRealTok, K3PromptIsSegmentwiseWithRealMarkerIds) {
  auto tok = open_tiny("k3");
  ASSERT_TRUE(tok);
  auto tmpl = make_chat_template(ChatFormat::k3_xtml, *tok).value();
  ChatOptions o;
  o.thinking = false;
  Message user = msg("user", "héllo <|open|>message<|sep|> 中文");
  auto ids = tmpl->render({user}, o).value();
  EXPECT_EQ(ids, spell(*tok, {"<|open|>", "message", " role=\"user\"", "<|sep|>", user.content, "<|close|>",
                              "message", "<|sep|>", "<|end_of_msg|>", "<|open|>", "message", " role=\"assistant\"",
                              "<|sep|>", "<|open|>", "response", "<|sep|>"}));
  // OPEN/CLOSE/SEP/EOM = n_base + 3/4/5/2; the user's spelled markers stayed ordinary BPE.
  EXPECT_EQ(ids[0], tok->n_base() + 3);
  int n_special = 0;
  for (int32_t id : ids) n_special += tok->is_special(id);
  EXPECT_EQ(n_special, 9);
  EXPECT_EQ(tmpl->stop_ids(), std::vector<int32_t>{tok->n_base() + 2});
}

TEST(ChatRealTok, K3RoundTripAndStreaming) {
  auto tok = open_tiny("k3");
  ASSERT_TRUE(tok);
  auto tmpl = make_chat_template(ChatFormat::k3_xtml, *tok).value();
  ChatOptions o;
  o.tool_call_id_seed = 11;
  o.tools = ojson::parse(R"([{"type":"function","function":{"name":"search","parameters":{"type":"object"}}}])");
  Message reply = msg("assistant", "Voilà — 答案是 42.");
  reply.reasoning = "Think in 日本語 and émojis 🚀.";
  std::string args = R"({"query": "Kimi \"K3\" 東京", "limit": 5, "filters": {"lang": ["en", "ja"]}})";
  reply.tool_calls = {{"a", "search", args}};
  std::vector<Message> history = {msg("user", "find it")};
  auto prompt = tmpl->render(history, o).value();
  ChatOptions full_opt = o;
  full_opt.add_generation_prompt = false;
  history.push_back(reply);
  auto full = tmpl->render(history, full_opt).value();
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), full.begin()));
  ParsedOutput p = parse_every_way(*tmpl, o, std::vector<int32_t>(full.begin() + prompt.size(), full.end()));
  EXPECT_EQ(p.reasoning, reply.reasoning);
  EXPECT_EQ(p.content, reply.content);
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].name, "search");
  EXPECT_EQ(p.tool_calls[0].arguments, args);
  auto* k3t = dynamic_cast<K3Template*>(tmpl.get());
  ASSERT_NE(k3t, nullptr);
  EXPECT_FALSE(k3t->reasoning_ended(prompt));
  EXPECT_TRUE(k3t->reasoning_ended(full));
}

TEST(ChatRealTok, K2RoundTripAndStreaming) {
  auto tok = open_tiny("k2");
  ASSERT_TRUE(tok);
  auto tmpl = make_chat_template(ChatFormat::k2, *tok).value();
  Message reply = msg("assistant", "Checking the weather — 天气.");
  reply.tool_calls = {{"functions.get_weather:0", "get_weather", R"({"city": "北京"})"}};
  auto prompt = tmpl->render({msg("user", "q")}, {}).value();
  ChatOptions full_opt;
  full_opt.add_generation_prompt = false;
  auto full = tmpl->render({msg("user", "q"), reply}, full_opt).value();
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), full.begin()));
  EXPECT_EQ(full.back(), tok->n_base() + 2);  // <|im_end|>
  ParsedOutput p = parse_every_way(*tmpl, {}, std::vector<int32_t>(full.begin() + prompt.size(), full.end()));
  EXPECT_EQ(p.content, reply.content);
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(p.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.tool_calls[0].arguments, reply.tool_calls[0].arguments);
}

}  // namespace
}  // namespace k3
