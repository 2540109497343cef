// rendezvous.h: the bootstrap of a multi-process communicator (comm.h, NcclRendezvous): rank 0 listens on
// addr:port and sends `n` bytes (an ncclUniqueId) to each of the world_size - 1 other ranks, which connect
// (retrying for up to timeout_s) and receive them. World size 1 does nothing.
#pragma once

#include <cstddef>

#include "dist/comm.h"

namespace k3 {

Status rendezvous_broadcast(const NcclRendezvous& rv, void* data, size_t n, int timeout_s = 120);

}  // namespace k3
