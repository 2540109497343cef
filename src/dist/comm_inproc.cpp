// comm_inproc.cpp: the in-process communicator (comm.h): threads as ranks, shared memory as the wire.
//
// A collective is two rendezvous: every rank posts its buffer pointers and waits (so every input is
// readable), computes its own output from the others' inputs, and waits again (so no input is reused
// before everyone has read it). Sums run in rank order, identically on every rank. send/recv go through one
// FIFO mailbox per (sender, receiver) pair; send copies and returns at once.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

#include "dist/comm.h"

namespace k3 {

namespace {

struct World {
  explicit World(int n) : n(n), posted(static_cast<size_t>(n)), boxes(size_t(n) * size_t(n)) {}
  const int n;

  // generation barrier
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  void wait() {
    std::unique_lock<std::mutex> lk(mu);
    const uint64_t gen = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lk, [&] { return generation != gen; });
    }
  }

  struct Post {
    const void* in = nullptr;
    std::span<const int64_t> counts;  // per-rank byte counts (all_gatherv, all_to_allv send side)
  };
  std::vector<Post> posted;

  struct Box {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::vector<uint8_t>> q;
  };
  std::vector<Box> boxes;  // [from * n + to]
};

// memcpy that accepts empty buffers (whose pointers may be null).
void copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, size_t(bytes));
}

class InProcComm final : public Comm {
 public:
  InProcComm(std::shared_ptr<World> w, int rank) : w_(std::move(w)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return w_->n; }
  const char* kind() const override { return "inproc"; }

  Status all_reduce_sum(float* x, int64_t n) override {
    post(x);
    std::vector<float> acc(static_cast<size_t>(n), 0.f);
    for (int r = 0; r < w_->n; ++r) {
      const float* in = static_cast<const float*>(w_->posted[size_t(r)].in);
      for (int64_t i = 0; i < n; ++i) acc[size_t(i)] += in[i];
    }
    w_->wait();
    copy(x, acc.data(), n * int64_t(sizeof(float)));
    return ok_status();
  }

  Status all_gather(const void* in, int64_t bytes, void* out) override {
    post(in);
    for (int r = 0; r < w_->n; ++r)
      copy(static_cast<uint8_t*>(out) + size_t(r) * size_t(bytes), w_->posted[size_t(r)].in, bytes);
    w_->wait();
    return ok_status();
  }

  Status all_gatherv(const void* in, std::span<const int64_t> bytes, void* out) override {
    if (int(bytes.size()) != w_->n) return error(Code::invalid_argument, "all_gatherv: one count per rank");
    post(in);
    size_t off = 0;
    for (int r = 0; r < w_->n; ++r) {
      copy(static_cast<uint8_t*>(out) + off, w_->posted[size_t(r)].in, bytes[size_t(r)]);
      off += size_t(bytes[size_t(r)]);
    }
    w_->wait();
    return ok_status();
  }

  Status reduce_scatter_sum(const float* in, float* out, int64_t n) override {
    post(in);
    std::vector<float> acc(static_cast<size_t>(n), 0.f);
    for (int r = 0; r < w_->n; ++r) {
      const float* src = static_cast<const float*>(w_->posted[size_t(r)].in) + int64_t(rank_) * n;
      for (int64_t i = 0; i < n; ++i) acc[size_t(i)] += src[i];
    }
    w_->wait();
    copy(out, acc.data(), n * int64_t(sizeof(float)));
    return ok_status();
  }

  Status all_to_allv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                     std::span<const int64_t> recv_bytes) override {
    const int n = w_->n;
    if (int(send_bytes.size()) != n || int(recv_bytes.size()) != n)
      return error(Code::invalid_argument, "all_to_allv: one count per rank");
    post(send, send_bytes);
    Status st;
    size_t off = 0;
    for (int r = 0; r < n; ++r) {  // rank r's block for me starts after its blocks for ranks < rank_
      const World::Post& p = w_->posted[size_t(r)];
      size_t src = 0;
      for (int j = 0; j < rank_; ++j) src += size_t(p.counts[size_t(j)]);
      const int64_t nb = p.counts[size_t(rank_)];
      if (nb != recv_bytes[size_t(r)] && st.ok())
        st = error(Code::invalid_argument, "all_to_allv: rank " + std::to_string(r) + " sends " +
                                               std::to_string(nb) + " bytes, rank " + std::to_string(rank_) +
                                               " expects " + std::to_string(recv_bytes[size_t(r)]));
      if (st.ok()) copy(static_cast<uint8_t*>(recv) + off, static_cast<const uint8_t*>(p.in) + src, nb);
      off += size_t(recv_bytes[size_t(r)]);
    }
    w_->wait();
    return st;
  }

  Status send(const void* buf, int64_t bytes, int peer) override {
    if (peer < 0 || peer >= w_->n)
      return error(Code::invalid_argument, "send: bad peer " + std::to_string(peer));
    World::Box& b = w_->boxes[size_t(rank_) * size_t(w_->n) + size_t(peer)];
    const uint8_t* p = static_cast<const uint8_t*>(buf);
    {
      std::lock_guard<std::mutex> lk(b.mu);
      b.q.emplace_back(p, p + bytes);
    }
    b.cv.notify_all();
    return ok_status();
  }

  Status recv(void* buf, int64_t bytes, int peer) override {
    if (peer < 0 || peer >= w_->n)
      return error(Code::invalid_argument, "recv: bad peer " + std::to_string(peer));
    World::Box& b = w_->boxes[size_t(peer) * size_t(w_->n) + size_t(rank_)];
    std::unique_lock<std::mutex> lk(b.mu);
    b.cv.wait(lk, [&] { return !b.q.empty(); });
    std::vector<uint8_t> m = std::move(b.q.front());
    b.q.pop_front();
    if (int64_t(m.size()) != bytes)
      return error(Code::invalid_argument, "recv: message of " + std::to_string(m.size()) +
                                               " bytes from rank " + std::to_string(peer) + ", expected " +
                                               std::to_string(bytes));
    copy(buf, m.data(), bytes);
    return ok_status();
  }

  Status barrier() override {
    w_->wait();
    return ok_status();
  }

 private:
  // Publishes this rank's input, then waits until every rank has.
  void post(const void* in, std::span<const int64_t> counts = {}) {
    w_->posted[size_t(rank_)] = {in, counts};
    w_->wait();
  }
  std::shared_ptr<World> w_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Comm>> make_inproc_comms(int n) {
  K3_ASSERT(n >= 1);
  auto w = std::make_shared<World>(n);
  std::vector<std::unique_ptr<Comm>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<InProcComm>(w, r));
  return out;
}

}  // namespace k3
