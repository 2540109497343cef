// status.h: recoverable failures travel as values to the edge (CLI, server), where they become a
// clear message or an OpenAI-style error. Invariants inside ops use K3_ASSERT (file:line, abort).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace k3 {

enum class Code { ok, invalid_argument, not_found, bad_file, unsupported, out_of_range, out_of_memory,
                  internal };

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  bool ok() const { return code_ == Code::ok; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // Prepends context: "loading model.safetensors: " + message.
  Status with_context(const std::string& ctx) const {
    return ok() ? *this : Status(code_, ctx + ": " + message_);
  }

 private:
  Code code_ = Code::ok;
  std::string message_;
};

inline Status ok_status() { return {}; }
inline Status error(Code c, std::string msg) { return {c, std::move(msg)}; }

// A value or the Status that explains why there is none.
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status s) : v_(std::move(s)) {
    if (std::get<Status>(v_).ok()) v_ = Status(Code::internal, "Result built from an ok Status");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "k3: assertion failed: %s at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace k3

#define K3_ASSERT(x) ((x) ? (void)0 : ::k3::assert_fail(#x, __FILE__, __LINE__))

// Returns the Status from the enclosing function when `expr` (a Status) is not ok.
#define K3_RETURN_IF_ERROR(expr)          \
  do {                                    \
    ::k3::Status k3_st_ = (expr);         \
    if (!k3_st_.ok()) return k3_st_;      \
  } while (0)

#define K3_CONCAT_INNER(a, b) a##b
#define K3_CONCAT(a, b) K3_CONCAT_INNER(a, b)
// K3_ASSIGN_OR_RETURN(auto x, f()): unwraps a Result or returns its Status.
#define K3_ASSIGN_OR_RETURN(decl, expr) K3_ASSIGN_OR_RETURN_IMPL(K3_CONCAT(k3_r_, __LINE__), decl, expr)
#define K3_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  decl = std::move(tmp).value()
