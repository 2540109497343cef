// test_chat_parse.cpp: the incremental K3 output parser (FORMATS.md §2.2 "Parsing"): round trip through
// the renderer, streaming = whole output for every chunking, UTF-8 / marker hold-back, reasoning end.
#include <gtest/gtest.h>

#include "chat_test_util.h"
#include "io/chat_k3.h"

namespace k3 {
namespace {

using test::msg;
using test::FakeTokenizer;
using test::parse_chunked;
using test::spell;

class K3Parse : public ::testing::Test {
 protected:
  void SetUp() override {
    tmpl = std::move(make_chat_template(ChatFormat::k3_xtml, tok).value());
    opt.tool_call_id_seed = 7;
  }
  // Output ids = rendering of `reply` after the prompt of `history` (the prompt must be its prefix).
  std::vector<int32_t> reply_ids(const std::vector<Message>& history, const Message& reply) {
    std::vector<int32_t> prompt = tmpl->render(history, opt).value();
    ChatOptions full_opt = opt;
    full_opt.add_generation_prompt = false;
    auto all = history;
    all.push_back(reply);
    std::vector<int32_t> full = tmpl->render(all, full_opt).value();
    EXPECT_TRUE(full.size() > prompt.size() && std::equal(prompt.begin(), prompt.end(), full.begin()));
    return std::vector<int32_t>(full.begin() + prompt.size(), full.end());
  }
  ParsedOutput parse_every_way(const std::vector<int32_t>& ids) { return test::parse_every_way(*tmpl, opt, ids); }
  FakeTokenizer tok{"k3"};
  std::unique_ptr<ChatTemplate> tmpl;
  ChatOptions opt;
};

TEST_F(K3Parse, RoundTripThroughRenderer) {
  opt.tools = ojson::parse(R"([{"type":"function","function":{"name":"get_weather"}}])");
  Message reply = msg("assistant", "Answer: 42 🚀 \"quoted\" <b>");
  reply.reasoning = "Let me think… é中 about it";
  std::string args = R"({"city": "東京", "days": 3, "flag": true, "opts": {"a": [1, 2.5]}, "none": null})";
  reply.tool_calls = {{"x", "get_weather", args}, {"y", "no&op\"", ""}};
  std::vector<int32_t> out = reply_ids({msg("user", "q")}, reply);
  ParsedOutput p = parse_every_way(out);
  EXPECT_EQ(p.reasoning, reply.reasoning);
  EXPECT_EQ(p.content, reply.content);
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.tool_calls[0].arguments, args);  // Python json.dumps spacing, emitted key order
  EXPECT_EQ(p.tool_calls[1].name, "no&op\"");
  EXPECT_EQ(p.tool_calls[1].arguments, "{}");
  EXPECT_EQ(p.tool_calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(p.tool_calls[0].id.size(), 5u + 24u);
  EXPECT_NE(p.tool_calls[0].id, p.tool_calls[1].id);
  EXPECT_EQ(p.finish_reason_hint(), "tool_calls");
  EXPECT_GT(p.n_reasoning_tokens, 0);
}

TEST_F(K3Parse, ThinkingOffAndFallbackArguments) {
  opt.thinking = false;
  Message reply = msg("assistant", "plain answer");
  reply.tool_calls = {{"c", "f", "{broken"}};
  ParsedOutput p = parse_every_way(reply_ids({msg("user", "q")}, reply));
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "plain answer");
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, "{broken");
}

TEST_F(K3Parse, TypedArgumentsMalformedAndTruncated) {
  // A number that is not JSON falls back to its raw text; an unfinished second call is dropped.
  std::vector<int32_t> out = spell(tok, {
      "<|close|>", "think", "<|sep|>", "<|open|>", "tools", "<|sep|>", "<|open|>", "call", " tool=\"f\"", " index=\"1\"",
      "<|sep|>", "<|open|>", "argument", " key=\"n\"", " type=\"number\"", "<|sep|>", "1e", "<|close|>", "argument",
      "<|sep|>", "<|open|>", "argument", " key=\"s\"", " type=\"string\"", "<|sep|>", "x<|open|>y", "<|close|>",
      "argument", "<|sep|>", "<|close|>", "call", "<|sep|>", "<|open|>", "call", " tool=\"g\"", "<|sep|>", "<|open|>",
      "argu"});
  ParsedOutput p = parse_every_way(out);
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"n": "1e", "s": "x<|open|>y"})");
}

TEST_F(K3Parse, MarkersAndUtf8AreHeldBack) {
  // "é" is two byte-tokens; a marker's tag spans several tokens. Neither may leak half-way.
  std::vector<int32_t> out = spell(tok, {"ré", "<|close|>", "think", "<|sep|>", "<|open|>", "response", "<|sep|>",
                                         "中文", "<|close|>", "response", "<|sep|>", "<|close|>", "message", "<|sep|>",
                                         "<|end_of_msg|>", "ignored after the end"});
  auto r = parse_chunked(*tmpl, opt, out, 0);
  std::vector<std::string> reasoning_deltas;
  for (const auto& e : r.events) {
    if (e.kind == ChatEvent::Kind::reasoning) reasoning_deltas.push_back(e.text);
  }
  ASSERT_EQ(reasoning_deltas.size(), 2u);  // "r", then "é" once both of its bytes arrived
  EXPECT_EQ(reasoning_deltas[1], "é");
  EXPECT_EQ(r.parser->result().content, "中文");
  EXPECT_TRUE(r.parser->reasoning_ended());
  parse_every_way(out);
}

TEST_F(K3Parse, UnclosedThinkIsAllReasoning) {
  std::vector<int32_t> out = spell(tok, {"still thinking ", "<|close|>", "thi"});
  auto r = parse_chunked(*tmpl, opt, out, 0);
  EXPECT_EQ(r.parser->result().reasoning, "still thinking ");
  EXPECT_EQ(r.parser->result().content, "");
  EXPECT_FALSE(r.parser->reasoning_ended());
  EXPECT_EQ(r.parser->result().finish_reason_hint(), "");
  parse_every_way(out);
}

TEST_F(K3Parse, ReasoningEndedIsTheLastThinkMarker) {
  auto* k3t = dynamic_cast<K3Template*>(tmpl.get());
  ASSERT_NE(k3t, nullptr);
  Message a = msg("assistant", "4");
  a.reasoning = "r";
  std::vector<int32_t> ids = tmpl->render({msg("user", "2+2"), a, msg("user", "3+3")}, opt).value();
  EXPECT_FALSE(k3t->reasoning_ended(ids));  // history has a closed think, but the newest is open
  std::vector<int32_t> more = spell(tok, {"hmm", "<|close|>", "think", "<|sep|>"});
  ids.insert(ids.end(), more.begin(), more.end());
  EXPECT_TRUE(k3t->reasoning_ended(ids));
  EXPECT_FALSE(k3t->reasoning_ended(spell(tok, {"<|close|>", "thinking", "<|sep|>"})));
}

TEST_F(K3Parse, StrayTextAndBrokenMarkers) {
  // Text outside channels is content; an OPEN cut by another special is no marker (its text is kept).
  std::vector<int32_t> out = spell(tok, {"r", "<|close|>", "think", "<|sep|>", "lead ", "<|open|>", "oops",
                                         "<|open|>", "response", "<|sep|>", "body", "<|close|>", "response", "<|sep|>"});
  ParsedOutput p = parse_every_way(out);
  EXPECT_EQ(p.reasoning, "r");
  EXPECT_EQ(p.content, "lead oopsbody");
}

}  // namespace
}  // namespace k3
