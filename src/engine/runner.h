// runner.h: one sequence's forward calls through the prefix cache.
//
//   feed(ids):  pieces = ids cut at the last hash-aligned position p (p % T_h == 0) strictly inside them
//               per piece: cache.reserve(piece) -> model.forward(state, piece) -> cache.commit(state)
// (with CacheOptions::dense_checkpoints: at every aligned position inside them)
// so every forward that crosses a hash boundary ends on one and leaves a KDA checkpoint there (the
// model itself knows nothing about pages: it reads and appends to the contiguous SeqState). Without a
// cache, feed() is a plain forward. An out_of_memory Status from reserve() leaves state and cache as
// they were (the scheduler preempts and retries); other errors leave the sequence unusable.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/prefix_index.h"
#include "core/status.h"
#include "model/model.h"

namespace k3 {

// The sequence's view of the cache: null cache = no caching.
struct SeqSlot {
  SeqState* state = nullptr;
  SeqCache* cache_seq = nullptr;
};

Status feed(Model& model, PrefixCache* cache, SeqSlot seq, std::span<const int32_t> ids,
            std::vector<float>* logits);

// One decode token for each of several sequences: reserve all, Model::forward_batch, commit all.
// last_logits[i]: [n_vocab]. A reserve failure names the sequence in `failed`; the sequences before it
// stay reserved, and a retry (without the failed one) does not reserve them twice.
Status decode_batch(Model& model, PrefixCache* cache, std::span<SeqSlot> seqs, std::span<const int32_t> ids,
                    std::vector<std::vector<float>>* last_logits, int* failed);

}  // namespace k3

#include "engine/scheduler.h"

namespace k3 {

// The scheduler's backend on a real Model, with the prefix cache (or none: cache = null).
class ModelBackend : public StepBackend {
 public:
  ModelBackend(Model& model, PrefixCache* cache) : model_(model), cache_(cache) {}
  int32_t n_vocab() const override { return model_.config().n_vocab; }
  Result<int64_t> start(Request& r) override;
  Status prefill(Request& r, std::span<const int32_t> ids) override;
  Status decode(std::span<Request*> rs, int* failed) override;
  void stop(Request& r, bool finished) override;
  void end_step(std::span<Request*> running) override;

 private:
  Model& model_;
  PrefixCache* cache_;
};

}  // namespace k3
