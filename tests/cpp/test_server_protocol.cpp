// OpenAI request parsing (server/protocol.h): logprobs per endpoint, lists of prompts, the choice limit,
// and the 400s that name the offending field.
#include <gtest/gtest.h>

#include "server/protocol.h"

namespace k3::server {
namespace {

constexpr int32_t kVocab = 1000;

json chat_body(json extra) {
  json b = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

TEST(ServerProtocol, ChatLogprobsNeedTheFlagAndStayInRange) {
  ChatRequest r;
  ASSERT_FALSE(parse_chat(chat_body({{"logprobs", true}, {"top_logprobs", 5}}), kVocab, &r));
  EXPECT_TRUE(r.gen.logprobs);
  EXPECT_EQ(r.gen.top_logprobs, 5);
  EXPECT_EQ(r.gen.sampling.n_top_logprobs, 5);
  ChatRequest bad;
  auto e = parse_chat(chat_body({{"top_logprobs", 2}}), kVocab, &bad);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "top_logprobs");
  e = parse_chat(chat_body({{"logprobs", true}, {"top_logprobs", 21}}), kVocab, &bad);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http, 400);
  e = parse_chat(chat_body({{"logprobs", 3}}), kVocab, &bad);  // chat's logprobs is a boolean
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "logprobs");
}

TEST(ServerProtocol, CompletionPromptShapes) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion({{"prompt", "one"}}, kVocab, &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "one");
  EXPECT_EQ(r.gen.max_tokens, 16);
  CompletionRequest ids;
  ASSERT_FALSE(parse_completion({{"prompt", {1, 2, 3}}}, kVocab, &ids));
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_EQ(*ids.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  CompletionRequest many;
  ASSERT_FALSE(parse_completion({{"prompt", {"a", json::array({4, 5}), "c"}}}, kVocab, &many));
  ASSERT_EQ(many.prompts.size(), 3u);
  EXPECT_EQ(many.prompts[0].text, "a");
  EXPECT_EQ(*many.prompts[1].ids, (std::vector<int32_t>{4, 5}));
  EXPECT_FALSE(many.prompts[2].ids);
  for (json p : {json::array(), json::array({json::array({1}), 2}), json::array({1, kVocab}),
                 json::array({json::array()}), json(3), json(nullptr)}) {
    CompletionRequest bad;
    auto e = parse_completion({{"prompt", p}}, kVocab, &bad);
    ASSERT_TRUE(e) << p.dump();
    EXPECT_EQ(e->param, "prompt") << p.dump();
  }
}

TEST(ServerProtocol, PromptsTimesNIsLimited) {
  CompletionRequest ok, bad;
  json prompts = json::array();
  for (int i = 0; i < 16; ++i) prompts.push_back("p");
  EXPECT_FALSE(parse_completion({{"prompt", prompts}, {"n", kMaxChoices / 16}}, kVocab, &ok));
  auto e = parse_completion({{"prompt", prompts}, {"n", kMaxChoices / 16 + 1}}, kVocab, &bad);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "n");
}

TEST(ServerProtocol, CompletionLogprobsIsAnIntAndExcludesEcho) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion({{"prompt", "x"}, {"logprobs", 0}}, kVocab, &r));
  EXPECT_TRUE(r.gen.logprobs);  // 0: the chosen token only
  EXPECT_EQ(r.gen.top_logprobs, 0);
  for (json extra :
       {json{{"logprobs", 6}}, json{{"logprobs", true}}, json{{"logprobs", 1}, {"echo", true}}}) {
    CompletionRequest bad;
    json b = {{"prompt", "x"}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    auto e = parse_completion(b, kVocab, &bad);
    ASSERT_TRUE(e) << b.dump();
    EXPECT_TRUE(e->param == "logprobs" || e->param == "echo") << b.dump();
  }
}

}  // namespace
}  // namespace k3::server
