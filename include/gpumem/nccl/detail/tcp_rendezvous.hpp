// gpumem — the smallest rendezvous that starts NCCL: rank 0 hands a few bytes (ncclUniqueId) to
// every other rank over TCP. POSIX sockets; IPv4 and IPv6.
#pragma once

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gpumem::nccl::detail {

class socket_fd {
 public:
  explicit socket_fd(int fd = -1) noexcept : fd_(fd) {}
  socket_fd(socket_fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  socket_fd& operator=(socket_fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  socket_fd(const socket_fd&) = delete;
  socket_fd& operator=(const socket_fd&) = delete;
  ~socket_fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

[[noreturn]] inline void rendezvous_error(const std::string& what) {
  throw std::runtime_error("gpumem::nccl rendezvous: " + what);
}

inline void send_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) rendezvous_error(std::string("send failed: ") + std::strerror(errno));
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

inline void receive_all(int fd, char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::recv(fd, data, size, 0);
    if (n <= 0) rendezvous_error("the connection to rank 0 closed before its data arrived");
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

/// Rank 0 listens on `port` and sends `payload` to the world_size - 1 other ranks; the others
/// connect to host:port (retrying until `timeout`) and receive payload.size() bytes into it.
/// Throws std::runtime_error naming what failed.
inline void exchange(int rank, int world_size, const std::string& host, int port,
                     std::vector<char>& payload, std::chrono::milliseconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    rendezvous_error("rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  }
  if (port <= 0 || port > 65535) rendezvous_error("port " + std::to_string(port));
  if (world_size == 1) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (rank == 0) hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc =
          ::getaddrinfo(rank == 0 ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    rendezvous_error("cannot resolve " + host + ": " + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
  if (rank == 0) {
    socket_fd listener(::socket(found->ai_family, found->ai_socktype, found->ai_protocol));
    const int yes = 1;
    ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (listener.get() < 0 || ::bind(listener.get(), found->ai_addr, found->ai_addrlen) != 0 ||
        ::listen(listener.get(), world_size) != 0) {
      rendezvous_error("rank 0 cannot listen on port " + service + ": " + std::strerror(errno));
    }
    for (int served = 1; served < world_size; ++served) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      timeval tv{static_cast<time_t>(std::max<long long>(left.count(), 1) / 1000),
                 static_cast<suseconds_t>(std::max<long long>(left.count(), 1) % 1000 * 1000)};
      ::setsockopt(listener.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      socket_fd peer(::accept(listener.get(), nullptr, nullptr));
      if (peer.get() < 0) {
        rendezvous_error("rank 0 waited " + std::to_string(timeout.count()) + " ms; " +
                         std::to_string(served - 1) + " of " + std::to_string(world_size - 1) +
                         " ranks connected");
      }
      send_all(peer.get(), payload.data(), payload.size());
    }
    return;
  }
  for (;;) {
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      socket_fd s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (s.get() >= 0 && ::connect(s.get(), a->ai_addr, a->ai_addrlen) == 0) {
        receive_all(s.get(), payload.data(), payload.size());
        return;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      rendezvous_error("rank " + std::to_string(rank) + " could not reach rank 0 at " + host + ":" +
                       service + " within " + std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace gpumem::nccl::detail
