// binder.h: reading canonical checkpoint tensors (docs/tiny-models.md) into block weight structs.
//
// Large matrices stay in the mmapped checkpoint: a LinearWeight is a view (bf16/f16/f32/fp8, or MXFP4 when
// the checkpoint holds `<name>.weight_packed` + `<name>.weight_scale`; MODEL.md §9: dispatch on the suffix).
// Small vectors (norm gains, biases, dt_bias, A_log, conv taps) are copied to fp32; bf16 values convert
// exactly, so the copy changes nothing numerically.
//
// Binder collects the first error (missing tensor, wrong shape, bad dtype, E8M0 byte 255) with the tensor
// name, so a block binder reads as a list of tensors and checks the status once at the end.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/checkpoint.h"
#include "ops/linear.h"

namespace k3 {

class Binder {
 public:
  Binder(const Checkpoint& ckpt, std::string prefix) : ckpt_(ckpt), prefix_(std::move(prefix)) {}

  bool has(const std::string& name) const;            // `prefix + name` or its `.weight_packed` form
  const TensorView* tensor(const std::string& name);  // records not_found when absent
  // `name` is the module name without ".weight" ("self_attn.q_proj"); out/in < 0: accept any.
  LinearWeight linear(const std::string& name, int64_t out, int64_t in);
  // Full tensor `name` (with suffix) as fp32; numel < 0: accept any size.
  std::vector<float> vec(const std::string& name, int64_t numel);
  void fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
  }
  const Status& status() const { return status_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const Checkpoint& ckpt_;
  std::string prefix_;
  Status status_;
};

// Copies element i..i+n of a tensor (f32/bf16/f16) to fp32.
void read_f32(const TensorView& t, int64_t offset, int64_t n, float* out);

}  // namespace k3
