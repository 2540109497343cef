// runner.cpp: forward calls through the prefix cache (runner.h).
#include "engine/runner.h"

#include <algorithm>

namespace k3 {

Status feed(Model& model, PrefixCache* cache, SeqSlot seq, std::span<const int32_t> ids,
            std::vector<float>* logits) {
  SeqState& st = *seq.state;
  if (!cache) return model.forward(st, ids.data(), int64_t(ids.size()), logits, false);
  const int64_t th = cache->options().hash_tokens;
  while (!ids.empty()) {
    const int64_t n0 = st.n_past(), n1 = n0 + int64_t(ids.size());
    int64_t cut = (n1 - 1) / th * th;  // the last aligned position strictly before n1
    if (cache->options().dense_checkpoints) cut = std::min(n1, (n0 / th + 1) * th);  // every boundary
    if (cut <= n0) cut = n1;
    std::span<const int32_t> piece = ids.subspan(0, size_t(cut - n0));
    K3_RETURN_IF_ERROR(cache->reserve(*seq.cache_seq, piece));
    K3_RETURN_IF_ERROR(model.forward(st, piece.data(), int64_t(piece.size()), logits, false));
    K3_RETURN_IF_ERROR(cache->commit(*seq.cache_seq, st));
    ids = ids.subspan(piece.size());
  }
  return ok_status();
}

Status decode_batch(Model& model, PrefixCache* cache, std::span<SeqSlot> seqs, std::span<const int32_t> ids,
                    std::vector<std::vector<float>>* last_logits, int* failed) {
  *failed = -1;
  std::vector<SeqState*> states;
  std::vector<std::span<const int32_t>> tok;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (cache && int64_t(seqs[i].cache_seq->tokens.size()) == seqs[i].state->n_past()) {  // not yet reserved
      Status s = cache->reserve(*seqs[i].cache_seq, ids.subspan(i, 1));
      if (!s.ok()) {
        *failed = int(i);
        return s;
      }
    }
    states.push_back(seqs[i].state);
    tok.push_back(ids.subspan(i, 1));
  }
  K3_RETURN_IF_ERROR(model.forward_batch(states, tok, last_logits));
  if (cache)
    for (SeqSlot& s : seqs) K3_RETURN_IF_ERROR(cache->commit(*s.cache_seq, *s.state));
  return ok_status();
}

}  // namespace k3

namespace k3 {

Result<int64_t> ModelBackend::start(Request& r) {
  r.state = model_.new_state();
  r.cache_seq = SeqCache{};
  if (!cache_) return int64_t(0);
  return cache_->admit(r.cache_seq, std::span<const int32_t>(r.tokens).subspan(0, size_t(r.n_prefill)),
                       *r.state);
}

Status ModelBackend::prefill(Request& r, std::span<const int32_t> ids) {
  return feed(model_, cache_, {r.state.get(), &r.cache_seq}, ids, &r.logits);
}

Status ModelBackend::decode(std::span<Request*> rs, int* failed) {
  std::vector<SeqSlot> slots;
  std::vector<int32_t> ids;
  for (Request* r : rs) {
    slots.push_back({r->state.get(), &r->cache_seq});
    ids.push_back(r->tokens.back());
  }
  std::vector<std::vector<float>> logits;
  K3_RETURN_IF_ERROR(decode_batch(model_, cache_, slots, ids, &logits, failed));
  for (size_t i = 0; i < rs.size(); ++i) rs[i]->logits = std::move(logits[i]);
  return ok_status();
}

void ModelBackend::stop(Request& r, bool finished) {
  if (cache_) cache_->release(r.cache_seq, finished);
  r.state.reset();
}

void ModelBackend::end_step(std::span<Request*> running) {
  if (!cache_) return;
  std::vector<SeqCache*> seqs;
  for (Request* r : running) seqs.push_back(&r->cache_seq);
  cache_->end_step(seqs);
}

}  // namespace k3
