// comm_nccl.cu: the NCCL communicator (comm.h): one rank per GPU, multi-GPU and multi-node. Buffers are
// device pointers; every call is enqueued on the communicator's stream and synchronized before it returns
// (simple blocking semantics, like the in-process one). all_gatherv is a group of broadcasts, all_to_allv a
// group of send/recv pairs. Built only with -DK3_CUDA=ON -DK3_NCCL=ON.
#ifdef K3_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include "core/cuda_check.h"
#include "dist/comm.h"
#include "dist/rendezvous.h"

#define K3_NCCL_CHECK(call)                                                                             \
  do {                                                                                                  \
    ncclResult_t k3_nr_ = (call);                                                                       \
    if (k3_nr_ != ncclSuccess)                                                                          \
      return ::k3::Status(::k3::Code::internal, std::string(#call) +                                    \
                                                    " failed: " + ncclGetErrorString(k3_nr_) + " at " + \
                                                    __FILE__ + ":" + std::to_string(__LINE__));         \
  } while (0)

namespace k3 {

namespace {

class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t c, cudaStream_t s, int rank, int size, int device)
      : comm_(c), stream_(s), rank_(rank), size_(size), device_(device) {}
  ~NcclComm() override {
    cudaSetDevice(device_);
    if (scratch_) cudaFree(scratch_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "nccl"; }

  Status all_reduce_sum(float* x, int64_t n) override {
    K3_CUDA_CHECK(cudaSetDevice(device_));
    K3_NCCL_CHECK(ncclAllReduce(x, x, size_t(n), ncclFloat, ncclSum, comm_, stream_));
    return sync();
  }
  Status all_gather(const void* in, int64_t bytes, void* out) override {
    K3_CUDA_CHECK(cudaSetDevice(device_));
    K3_NCCL_CHECK(ncclAllGather(in, out, size_t(bytes), ncclChar, comm_, stream_));
    return sync();
  }
  Status all_gatherv(const void* in, std::span<const int64_t> bytes, void* out) override {
    if (int(bytes.size()) != size_) return error(Code::invalid_argument, "all_gatherv: one count per rank");
    K3_CUDA_CHECK(cudaSetDevice(device_));
    K3_NCCL_CHECK(ncclGroupStart());
    size_t off = 0;
    for (int r = 0; r < size_; ++r) {
      K3_NCCL_CHECK(ncclBroadcast(in, static_cast<char*>(out) + off, size_t(bytes[size_t(r)]), ncclChar, r,
                                  comm_, stream_));
      off += size_t(bytes[size_t(r)]);
    }
    K3_NCCL_CHECK(ncclGroupEnd());
    return sync();
  }
  Status reduce_scatter_sum(const float* in, float* out, int64_t n) override {
    K3_CUDA_CHECK(cudaSetDevice(device_));
    K3_NCCL_CHECK(ncclReduceScatter(in, out, size_t(n), ncclFloat, ncclSum, comm_, stream_));
    return sync();
  }
  Status all_to_allv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                     std::span<const int64_t> recv_bytes) override {
    if (int(send_bytes.size()) != size_ || int(recv_bytes.size()) != size_)
      return error(Code::invalid_argument, "all_to_allv: one count per rank");
    K3_CUDA_CHECK(cudaSetDevice(device_));
    K3_NCCL_CHECK(ncclGroupStart());
    size_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      if (send_bytes[size_t(r)] > 0)
        K3_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + so, size_t(send_bytes[size_t(r)]), ncclChar,
                               r, comm_, stream_));
      if (recv_bytes[size_t(r)] > 0)
        K3_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + ro, size_t(recv_bytes[size_t(r)]), ncclChar, r,
                               comm_, stream_));
      so += size_t(send_bytes[size_t(r)]);
      ro += size_t(recv_bytes[size_t(r)]);
    }
    K3_NCCL_CHECK(ncclGroupEnd());
    return sync();
  }
  Status send(const void* buf, int64_t bytes, int peer) override {
    K3_CUDA_CHECK(cudaSetDevice(device_));
    K3_NCCL_CHECK(ncclSend(buf, size_t(bytes), ncclChar, peer, comm_, stream_));
    return sync();
  }
  Status recv(void* buf, int64_t bytes, int peer) override {
    K3_CUDA_CHECK(cudaSetDevice(device_));
    K3_NCCL_CHECK(ncclRecv(buf, size_t(bytes), ncclChar, peer, comm_, stream_));
    return sync();
  }
  Status barrier() override {
    K3_CUDA_CHECK(cudaSetDevice(device_));
    if (!scratch_) K3_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    K3_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_));
    return sync();
  }

 private:
  Status sync() {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return ok_status();
  }
  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_, size_, device_;
  float* scratch_ = nullptr;
};

Status init(NcclRendezvous& rv, ncclComm_t* comm, cudaStream_t* stream) {
  K3_RETURN_IF_ERROR(rv.resolve());
  K3_CUDA_CHECK(cudaSetDevice(rv.local_rank));
  ncclUniqueId id;
  if (rv.rank == 0) K3_NCCL_CHECK(ncclGetUniqueId(&id));
  K3_RETURN_IF_ERROR(rendezvous_broadcast(rv, &id, sizeof id));
  K3_NCCL_CHECK(ncclCommInitRank(comm, rv.world_size, id, rv.rank));
  K3_CUDA_CHECK(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking));
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<Comm>> make_nccl_comm(const NcclRendezvous& rv_in) {
  NcclRendezvous rv = rv_in;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  K3_RETURN_IF_ERROR(init(rv, &comm, &stream));
  return std::unique_ptr<Comm>(new NcclComm(comm, stream, rv.rank, rv.world_size, rv.local_rank));
}

bool nccl_available() {
  return true;
}

}  // namespace k3

#endif  // K3_HAVE_NCCL
