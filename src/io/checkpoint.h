// checkpoint.h: a Hugging Face checkpoint directory, opened zero-copy.
//
//   DIR/config.json                      -> ModelConfig (validated, io/hf_config.h)
//   DIR/model.safetensors                or shards listed in model.safetensors.index.json (mmapped)
//   DIR/tiktoken.model, tokenizer_config.json   (io/tokenizer.h)
//
// Tensor names are canonicalized on open so model code sees one spelling for every family:
//   "language_model.model.X" and "language_model.X" -> "model.X";  "language_model.lm_head.weight" ->
//   "lm_head.weight". Vision tensors (vision_tower.*, mm_projector.*) are skipped with one log line.
// open() checks presence, shape and dtype of every tensor the config implies before anything runs.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "k3/config.h"

namespace k3 {

struct CheckpointOptions {
  bool validate = true;             // check the expected-tensor manifest (tests may turn it off)
  bool progress = false;            // progress bar on stderr while shards are mapped
};

class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir, const CheckpointOptions& opt = {});
  virtual ~Checkpoint() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const std::string& dir() const = 0;
  // nullptr when the (canonical) name is absent.
  virtual const TensorView* find(std::string_view name) const = 0;
  // Every canonical name, sorted.
  virtual std::vector<std::string> names() const = 0;
};

}  // namespace k3
