// k3 chat: interactive chat in the checkpoint's own format (K2 for Kimi Linear, XTML for K3/K3.1;
// src/io/chat.h), with history.
//
//   k3 chat -m DIR [--system TEXT] [--no-think] [-n N] [-c CTX] [--stop STR]... [sampling flags as k3 run]
//           [--precision fp32|bf16] [-t THREADS] [--show-prompt]
//
// Each stdin line is a user turn; "/exit" or EOF ends. Per turn: render the whole conversation, feed only
// the ids after the prefix the sequence state already holds (the state is rebuilt when the rendering of
// the history differs from what was fed), generate until a stop id (the format's + [EOS]), and parse the
// ids with the format's OutputParser:
//   reasoning  -> stderr, between "[thinking]" and "[/thinking]" lines (dim on a terminal)
//   content    -> stdout, streamed
//   tool call  -> stdout, one line: [tool_call] {"id":..,"name":..,"arguments":{..}}
// The reply (content, reasoning, tool calls) joins the history for the next turn.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "core/log.h"
#include "engine/generate.h"
#include "engine_args.h"
#include "io/chat.h"

namespace k3::cli {
namespace {

struct ChatArgs {
  ModelArgs model;
  SamplingArgs sampling;
  std::string system;
  std::vector<std::string> stop;
  bool no_think = false, show_prompt = false;
  int n_predict = -1;
  int64_t n_ctx = 4096;
};

// Prints parser events: reasoning on stderr inside a [thinking] block, the rest on stdout.
class Display {
 public:
  Display() : dim_(isatty(fileno(stderr))) {}
  void show(const std::vector<ChatEvent>& events) {
    for (const ChatEvent& e : events) {
      if (e.kind == ChatEvent::Kind::reasoning) {
        if (!thinking_) std::fputs(dim_ ? "[thinking]\n\x1b[2m" : "[thinking]\n", stderr);
        thinking_ = true;
        std::fputs(e.text.c_str(), stderr);
        continue;
      }
      end_thinking();
      if (e.kind == ChatEvent::Kind::content) {
        std::fputs(e.text.c_str(), stdout);
      } else {
        nlohmann::ordered_json j = {{"id", e.call.id}, {"name", e.call.name}};
        auto args = nlohmann::ordered_json::parse(e.call.arguments, nullptr, false);
        j["arguments"] = args.is_discarded() ? nlohmann::ordered_json(e.call.arguments) : args;
        std::printf("\n[tool_call] %s\n", j.dump().c_str());
      }
    }
    std::fflush(stdout);
    std::fflush(stderr);
  }
  void end_thinking() {
    if (thinking_) std::fputs(dim_ ? "\x1b[0m\n[/thinking]\n" : "\n[/thinking]\n", stderr);
    thinking_ = false;
  }

 private:
  bool dim_;
  bool thinking_ = false;
};

Status run(const ChatArgs& a) {
  K3_ASSIGN_OR_RETURN(Loaded l, load_model(a.model, /*with_tokenizer=*/true));
  const ModelConfig& cfg = l.model->config();
  K3_ASSIGN_OR_RETURN(SamplerParams sp, sampler_params(a.sampling, cfg.n_vocab));
  K3_ASSIGN_OR_RETURN(auto tmpl, make_chat_template(cfg.chat_format(), *l.tok));
  ChatOptions copt;
  copt.thinking = !a.no_think;
  GenerateOptions go;
  go.n_predict = a.n_predict;
  go.n_ctx = a.n_ctx;
  go.stop_ids = tmpl->stop_ids();
  for (int32_t id : stop_ids(cfg, *l.tok)) go.stop_ids.push_back(id);
  go.stop_strings = a.stop;

  std::vector<Message> history;
  if (!a.system.empty()) history.push_back({.role = "system", .content = a.system});
  auto state = l.model->new_state();
  std::vector<int32_t> fed;  // ids the state holds, in order
  StepFn step = [&](std::span<const int32_t> ids, std::vector<float>* logits) {
    Status s = l.model->forward(*state, ids.data(), int64_t(ids.size()), logits, false);
    if (s.ok()) fed.insert(fed.end(), ids.begin(), ids.end());
    return s;
  };
  Sampler sampler(sp);
  const bool interactive = isatty(fileno(stdin));
  std::string line;
  for (;;) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    history.push_back({.role = "user", .content = line});
    auto rendered = tmpl->render(history, copt);
    if (!rendered.ok()) return rendered.status();
    const std::vector<int32_t>& prompt = rendered.value();
    if (a.show_prompt) {
      auto text = tmpl->render_text(history, copt);
      if (text.ok()) std::fprintf(stderr, "%s\n", text.value().c_str());
    }
    if (int64_t(prompt.size()) >= a.n_ctx) {
      std::fprintf(stderr, "k3 chat: the conversation is %zu tokens, the context -c is %lld: turn dropped\n",
                   prompt.size(), (long long)a.n_ctx);
      history.pop_back();
      continue;
    }
    go.n_cached = int64_t(fed.size());
    if (fed.size() >= prompt.size() || !std::equal(fed.begin(), fed.end(), prompt.begin())) {
      state->reset();
      fed.clear();
      go.n_cached = 0;
    }
    K3_LOG_DEBUG("k3 chat: prompt %zu ids, %lld already in the state", prompt.size(), (long long)go.n_cached);
    auto parser = tmpl->make_parser(copt);
    Display display;
    std::vector<ChatEvent> events;
    K3_ASSIGN_OR_RETURN(GenerateResult r,
                        generate(step, *l.tok, prompt, go, sampler, [&](int32_t id, std::string_view) {
                          events.clear();
                          if (id >= 0) parser->push(id, events);
                          display.show(events);
                          return true;
                        }));
    events.clear();
    parser->finish(events);
    display.show(events);
    display.end_thinking();
    std::printf("\n");
    std::fflush(stdout);
    if (r.finish == FinishReason::length)
      std::fprintf(stderr, "k3 chat: reply cut at %zu tokens (-n or the context)\n", r.tokens.size());
    const ParsedOutput& out = parser->result();
    history.push_back({.role = "assistant",
                       .content = out.content,
                       .reasoning = out.reasoning,
                       .tool_calls = out.tool_calls});
  }
  return ok_status();
}

}  // namespace

void add_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  auto* cmd = app.add_subcommand("chat", "interactive chat in the model's chat format (stdin lines, /exit)");
  add_model_options(cmd, &a->model);
  add_sampling_options(cmd, &a->sampling);
  cmd->add_option("--system", a->system, "system message");
  cmd->add_flag("--no-think", a->no_think, "thinking off (K3: the reply starts in the response channel)");
  cmd->add_option("-n,--n-predict", a->n_predict,
                  "most tokens per reply; -1 = until a stop or the context is full");
  cmd->add_option("-c,--ctx-size", a->n_ctx, "context size in tokens (default 4096)");
  cmd->add_option("--stop", a->stop, "stop string (repeatable)");
  cmd->add_flag("--show-prompt", a->show_prompt, "print each rendered prompt (markers by name) to stderr");
  cmd->callback([a] {
    Status s = run(*a);
    if (!s.ok()) fail("chat", s);
  });
}

}  // namespace k3::cli
