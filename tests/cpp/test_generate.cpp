// Generation loop and stop strings, driven by a scripted "model" (StepFn) and a table tokenizer.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/generate.h"

namespace k3 {
namespace {

// Ids map to fixed byte strings; 8 and 9 are the two halves of "é" (C3 A9).
class TableTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view, bool) const override { return {}; }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids) s += token_bytes(id);
    return s;
  }
  std::string token_bytes(int32_t id) const override {
    static const std::map<int32_t, std::string> t = {{0, "<eos>"}, {1, "Hel"}, {2, "lo"}, {3, " Wo"},
                                                     {4, "rld"},   {5, "!"},   {6, "\n"}, {7, "ab"},
                                                     {8, "\xC3"},  {9, "\xA9"}};
    auto it = t.find(id);
    return it == t.end() ? "?" : it->second;
  }
  int32_t n_vocab() const override { return 10; }
  int32_t n_base() const override { return 10; }
  bool is_special(int32_t id) const override { return id == 0; }
  std::optional<int32_t> special_id(std::string_view) const override { return std::nullopt; }
};

// A model that emits `script` in order (one-hot logits), recording every step's ids.
struct ScriptedModel {
  std::vector<int32_t> script;
  std::vector<std::vector<int32_t>> calls;
  size_t next = 0;
  StepFn fn() {
    return [this](std::span<const int32_t> ids, std::vector<float>* logits) {
      calls.emplace_back(ids.begin(), ids.end());
      logits->assign(10, 0.f);
      (*logits)[size_t(next < script.size() ? script[next] : 5)] = 10.f;
      ++next;
      return ok_status();
    };
  }
};

Sampler greedy() {
  SamplerParams p;
  p.temperature = 0.f;
  return Sampler(p);
}

TEST(StopMatcher, MatchesAcrossPiecesAndExcludesTheStop) {
  StopMatcher m({"o W"});
  std::string out = m.push("Hel");
  out += m.push("lo");  // "o" could start the stop string: held back
  EXPECT_EQ(out, "Hell");
  out += m.push(" Wo");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "o W");
  EXPECT_EQ(out, "Hell");
  EXPECT_EQ(m.push("rld"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, ReleasesHeldTextThatTurnsOutNotToMatch) {
  StopMatcher m({"abc", ""});
  EXPECT_EQ(m.push("xa"), "x");
  EXPECT_EQ(m.push("b"), "");
  EXPECT_EQ(m.push("d"), "abd");
  EXPECT_EQ(m.push("ab"), "");
  EXPECT_EQ(m.flush(), "ab");  // end of stream: the held prefix is ordinary text
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestStopWinsAndStopAtTheStart) {
  StopMatcher m({"world", "lo"});
  EXPECT_EQ(m.push("hello world"), "hel");
  EXPECT_EQ(m.matched(), "lo");
  StopMatcher first({"\n"});
  EXPECT_EQ(first.push("\nrest"), "");
  EXPECT_TRUE(first.stopped());
  StopMatcher none({});
  EXPECT_EQ(none.push("anything"), "anything");
}

TEST(Generate, StopsOnAStopIdWithoutShowingIt) {
  TableTokenizer tok;
  ScriptedModel model{{1, 2, 5, 0, 3}};
  Sampler s = greedy();
  GenerateOptions opt;
  opt.stop_ids = {0};
  std::string shown;
  auto r = generate(model.fn(), tok, std::vector<int32_t>{7, 7}, opt, s, [&](int32_t, std::string_view t) {
    shown += t;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(r->finish, FinishReason::stop);
  EXPECT_EQ(r->stop_id, 0);
  EXPECT_EQ(shown, "Hello!");
  EXPECT_EQ(r->text, "Hello!");
  // Prefill with the whole prompt, then each generated id fed back once; the stop id never fed.
  ASSERT_EQ(model.calls.size(), 4u);
  EXPECT_EQ(model.calls[0], (std::vector<int32_t>{7, 7}));
  EXPECT_EQ(model.calls[3], (std::vector<int32_t>{5}));
  EXPECT_EQ(r->n_prompt_eval, 2);
  EXPECT_EQ(r->n_decode_eval, 3);
}

TEST(Generate, StopStringAcrossTokensIsExcluded) {
  TableTokenizer tok;
  ScriptedModel model{{1, 2, 3, 4, 5}};
  Sampler s = greedy();
  GenerateOptions opt;
  opt.stop_strings = {"o W"};
  auto r = generate(model.fn(), tok, std::vector<int32_t>{7}, opt, s, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "Hell");
  EXPECT_EQ(r->finish, FinishReason::stop);
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{1, 2, 3}));
}

TEST(Generate, NPredictAndContextGiveLength) {
  TableTokenizer tok;
  {
    ScriptedModel model{{1, 2, 3, 4}};
    Sampler s = greedy();
    GenerateOptions opt;
    opt.n_predict = 2;
    auto r = generate(model.fn(), tok, std::vector<int32_t>{7}, opt, s, nullptr);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->tokens, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(r->finish, FinishReason::length);
    EXPECT_EQ(model.calls.size(), 2u);  // the last sampled id is not fed: nothing would use its logits
  }
  {
    ScriptedModel model{{1, 2, 3, 4}};
    Sampler s = greedy();
    GenerateOptions opt;
    opt.n_ctx = 4;  // prompt 2 + 2 fed back; the third sampled id has no room
    auto r = generate(model.fn(), tok, std::vector<int32_t>{7, 7}, opt, s, nullptr);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->tokens, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(r->finish, FinishReason::length);
  }
}

TEST(Generate, SplitUtf8IsShownWhole) {
  TableTokenizer tok;
  ScriptedModel model{{8, 9, 0}};
  Sampler s = greedy();
  GenerateOptions opt;
  opt.stop_ids = {0};
  std::vector<std::string> pieces;
  auto r = generate(model.fn(), tok, std::vector<int32_t>{7}, opt, s, [&](int32_t, std::string_view t) {
    pieces.emplace_back(t);
    return true;
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "\xC3\xA9"}));
}

TEST(Generate, CachedPrefixIsNotFedAgainAndCallbackCanAbort) {
  TableTokenizer tok;
  ScriptedModel model{{1, 2, 3}};
  Sampler s = greedy();
  GenerateOptions opt;
  opt.n_cached = 2;
  int seen = 0;
  auto r = generate(model.fn(), tok, std::vector<int32_t>{7, 7, 6}, opt, s,
                    [&](int32_t, std::string_view) { return ++seen < 2; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(model.calls[0], (std::vector<int32_t>{6}));
  EXPECT_EQ(r->finish, FinishReason::aborted);
  EXPECT_EQ(r->tokens.size(), 2u);
}

TEST(Generate, BadInputsAreStatuses) {
  TableTokenizer tok;
  ScriptedModel model{{1}};
  Sampler s = greedy();
  GenerateOptions opt;
  EXPECT_FALSE(generate(model.fn(), tok, std::vector<int32_t>{}, opt, s, nullptr).ok());
  opt.n_cached = 1;
  EXPECT_FALSE(generate(model.fn(), tok, std::vector<int32_t>{7}, opt, s, nullptr).ok());
  opt.n_cached = 0;
  opt.n_ctx = 2;
  EXPECT_FALSE(generate(model.fn(), tok, std::vector<int32_t>{7, 7, 7}, opt, s, nullptr).ok());
  StepFn failing = [](std::span<const int32_t>, std::vector<float>*) {
    return error(Code::invalid_argument, "token id 99 out of range");
  };
  opt.n_ctx = 100;
  auto r = generate(failing, tok, std::vector<int32_t>{7}, opt, s, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("prefill: token id 99"), std::string::npos);
}

TEST(Generate, FitToContext) {
  const std::vector<int32_t> p = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(fit_to_context(p, 11, 5, false).value(), p);
  auto e = fit_to_context(p, 10, 5, false);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("10 tokens"), std::string::npos);
  EXPECT_NE(e.status().message().find("--truncate"), std::string::npos);
  EXPECT_EQ(fit_to_context(p, 8, 3, true).value(), (std::vector<int32_t>{6, 7, 8, 9, 10}));  // keep 8 - 3
  EXPECT_EQ(fit_to_context(p, 8, 100, true).value(),
            (std::vector<int32_t>{7, 8, 9, 10}));  // reserve <= n_ctx/2
  EXPECT_EQ(fit_to_context(p, 8, -1, true).value(), (std::vector<int32_t>{7, 8, 9, 10}));
}

}  // namespace
}  // namespace k3
