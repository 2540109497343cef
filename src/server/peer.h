// peer.h: has the client of a (non-streaming) request hung up?
//
// cpp-httplib 0.11 (Debian 12) gives a handler the peer's address but not its socket. find_socket()
// finds the connection's descriptor by matching getpeername / getsockname against the request's
// (remote, local) address and port among this process's sockets; peer_closed() then polls it without
// consuming anything: POLLRDHUP / POLLHUP / POLLERR, or a zero-byte peek (FIN) mean the client is gone.
// A pipelined next request (readable bytes) does not count as gone.
#pragma once

#include <string>

namespace k3::server {

// -1 when no socket matches.
int find_socket(const std::string& remote_addr, int remote_port, const std::string& local_addr,
                int local_port);
bool peer_closed(int fd);

}  // namespace k3::server
