// runner.cpp: forward calls through the prefix cache (runner.h).
#include "engine/runner.h"

namespace k3 {

Status feed(Model& model, PrefixCache* cache, SeqSlot seq, std::span<const int32_t> ids, std::vector<float>* logits) {
  SeqState& st = *seq.state;
  if (!cache) return model.forward(st, ids.data(), int64_t(ids.size()), logits, false);
  const int64_t th = cache->options().hash_tokens;
  while (!ids.empty()) {
    const int64_t n0 = st.n_past(), n1 = n0 + int64_t(ids.size());
    int64_t cut = (n1 - 1) / th * th;  // the last aligned position strictly before n1
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
