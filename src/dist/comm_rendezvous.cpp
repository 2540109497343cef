// comm_rendezvous.cpp: torchrun-style environment, the TCP bootstrap (rendezvous.h), and the stand-in for
// make_nccl_comm in builds without NCCL.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "dist/rendezvous.h"

namespace k3 {

namespace {

Result<int> env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (fallback >= 0) return fallback;
    return error(Code::invalid_argument, std::string(name) + " is not set (torchrun-style rendezvous)");
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end || x < 0 || x > 1 << 30)
    return error(Code::invalid_argument, std::string(name) + "=" + v + " is not a count");
  return int(x);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Status send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k <= 0) return error(Code::internal, std::string("rendezvous send: ") + std::strerror(errno));
    c += k, n -= size_t(k);
  }
  return ok_status();
}

Status recv_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, c, n, 0);
    if (k <= 0) return error(Code::internal, "rendezvous recv: connection closed early");
    c += k, n -= size_t(k);
  }
  return ok_status();
}

}  // namespace

Status NcclRendezvous::resolve() {
  if (rank < 0) {
    K3_ASSIGN_OR_RETURN(rank, env_int("RANK", -1));
  }
  if (world_size < 0) {
    K3_ASSIGN_OR_RETURN(world_size, env_int("WORLD_SIZE", -1));
  }
  if (local_rank < 0) {
    K3_ASSIGN_OR_RETURN(local_rank, env_int("LOCAL_RANK", rank));
  }
  if (addr.empty()) addr = std::getenv("MASTER_ADDR") ? std::getenv("MASTER_ADDR") : "127.0.0.1";
  if (port == 0) {
    K3_ASSIGN_OR_RETURN(port, env_int("MASTER_PORT", 29500));
  }
  if (world_size < 1 || rank >= world_size)
    return error(Code::invalid_argument,
                 "rank " + std::to_string(rank) + " outside world size " + std::to_string(world_size));
  if (port < 1 || port > 65535)
    return error(Code::invalid_argument, "bad rendezvous port " + std::to_string(port));
  return ok_status();
}

Status rendezvous_broadcast(const NcclRendezvous& rv, void* data, size_t n, int timeout_s) {
  if (rv.world_size <= 1) return ok_status();
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(rv.port);
  if (int e = ::getaddrinfo(rv.addr.c_str(), port.c_str(), &hints, &res); e != 0)
    return error(Code::invalid_argument, "rendezvous address " + rv.addr + ": " + gai_strerror(e));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, ::freeaddrinfo);
  if (rv.rank == 0) {
    Fd s{::socket(AF_INET, SOCK_STREAM, 0)};
    int one = 1;
    ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s.fd < 0 || ::bind(s.fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(s.fd, rv.world_size) != 0)
      return error(Code::internal,
                   "rendezvous listen on " + rv.addr + ":" + port + ": " + std::strerror(errno));
    for (int i = 1; i < rv.world_size; ++i) {
      Fd c{::accept(s.fd, nullptr, nullptr)};
      if (c.fd < 0) return error(Code::internal, std::string("rendezvous accept: ") + std::strerror(errno));
      K3_RETURN_IF_ERROR(send_all(c.fd, data, n));
    }
    return ok_status();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    Fd c{::socket(AF_INET, SOCK_STREAM, 0)};
    if (c.fd >= 0 && ::connect(c.fd, res->ai_addr, res->ai_addrlen) == 0) return recv_all(c.fd, data, n);
    if (std::chrono::steady_clock::now() > deadline)
      return error(Code::internal, "rendezvous: no rank 0 at " + rv.addr + ":" + port);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

#ifndef K3_HAVE_NCCL
Result<std::unique_ptr<Comm>> make_nccl_comm(const NcclRendezvous&) {
  return error(Code::unsupported, "this build has no NCCL (configure with -DK3_CUDA=ON -DK3_NCCL=ON)");
}
bool nccl_available() {
  return false;
}
#endif

}  // namespace k3
