// seq_state_access.h: sets SeqState's private n_past after the cache restored its buffers.
//
// SeqState (model/state.h) keeps n_past private (only Model advances it). Restoring a prefix-cache
// hit fills the latent rows, index keys, S and conv windows of a fresh state and must then say how many
// positions they hold. Until state.h offers a setter, this names the private member through an
// explicit template instantiation (access checks do not apply to explicit instantiation arguments,
// [temp.spec.general]/6). Replace with SeqState::set_n_past once it exists.
#pragma once

#include <cstdint>

#include "model/state.h"

namespace k3::detail {

template <auto Member>
struct NPastAccess {
  friend int64_t SeqState::*n_past_member() { return Member; }
};
int64_t SeqState::*n_past_member();
template struct NPastAccess<&SeqState::n_past_>;

inline void set_n_past(SeqState& s, int64_t n) {
  s.*n_past_member() = n;
}

}  // namespace k3::detail
