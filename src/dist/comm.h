// comm.h: a communicator among n ranks, the only way parallel code talks across ranks (docs/parallel.md).
//
//   all_reduce_sum   x[n] <- sum_r x_r[n]                       every rank gets the same bits
//   all_gather       out[size, bytes] <- concat_r in_r[bytes]
//   all_gatherv      out <- concat_r in_r[bytes_r]               bytes_r known to every rank
//   reduce_scatter   out[n] <- sum_r in_r[rank*n .. (rank+1)*n)
//   all_to_allv      rank r sends send_bytes[j] bytes (packed in rank order) to rank j and receives
//                    recv_bytes[j] bytes from rank j (packed in rank order into recv)
//   send / recv      point to point, ordered per (sender, receiver) pair
//   barrier
// Collectives are ordinary ops (CTranslate2 ops/nccl_ops.h): every rank calls them in the same order with
// matching sizes. Buffers are host memory for the in-process communicator, device memory for NCCL.
// Sums are fp32; the in-process one adds in rank order, so a replicated activation stays bit-identical.
//
// Implementations: make_inproc_comms (threads as ranks: every parallel path is tested on the CPU) and
// make_nccl_comm (comm_nccl.cu, only with -DK3_CUDA=ON -DK3_NCCL=ON; torchrun-style rendezvous).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace k3 {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* kind() const = 0;  // "inproc" | "nccl"

  virtual Status all_reduce_sum(float* x, int64_t n) = 0;
  virtual Status all_gather(const void* in, int64_t bytes, void* out) = 0;
  virtual Status all_gatherv(const void* in, std::span<const int64_t> bytes, void* out) = 0;
  virtual Status reduce_scatter_sum(const float* in, float* out, int64_t n) = 0;
  virtual Status all_to_allv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                             std::span<const int64_t> recv_bytes) = 0;
  virtual Status send(const void* buf, int64_t bytes, int peer) = 0;
  virtual Status recv(void* buf, int64_t bytes, int peer) = 0;
  virtual Status barrier() = 0;
};

// n communicators sharing one in-process world: comms[r] is rank r, to be driven by its own thread.
std::vector<std::unique_ptr<Comm>> make_inproc_comms(int n);

// Rendezvous for NCCL, torchrun style: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK for the
// device) from the environment, unless set explicitly (CLI flags).
struct NcclRendezvous {
  int rank = -1, world_size = -1, local_rank = -1;  // -1: read RANK / WORLD_SIZE / LOCAL_RANK
  std::string addr;                                 // empty: MASTER_ADDR (default 127.0.0.1)
  int port = 0;                                     // 0: MASTER_PORT (default 29500)
  // Completes every field left unset from the environment; invalid_argument names the bad variable.
  Status resolve();
};

// Only in builds with NCCL (K3_HAVE_NCCL); otherwise `unsupported`. Rank 0 listens on addr:port and hands the
// ncclUniqueId to the others over TCP; the device is local_rank.
Result<std::unique_ptr<Comm>> make_nccl_comm(const NcclRendezvous& rv);
bool nccl_available();

}  // namespace k3
