// gpumem — the smallest rendezvous that starts NCCL without c10d: rank 0 hands a few bytes
// (ncclUniqueId) to every other rank over TCP. POSIX sockets; IPv4 and IPv6.
//
// Rank 0 listens only on the addresses MASTER_ADDR resolves to (never on all interfaces) and
// hands the bytes only to peers that complete a handshake (protocol v1, big-endian integers):
//
//   rank 0 -> peer   magic "gpumemRV" | version | nonce0 (16 bytes)
//   peer -> rank 0   magic | version | world size | rank | nonce1 (16) | HMAC(token, client label,
//                    nonce0, nonce1, world size, rank)
//   rank 0 -> peer   status 0 | size | payload | HMAC(token, server label, nonce0, nonce1, world
//                    size, rank, size, payload)          or   status 1..3 (refused) | 0
//
// So both sides prove they know the job's token without sending it, the answer is bound to this
// connection (the nonces) and cannot be replayed or forged, and a stranger (a port scanner, another
// program, another job) gets neither the payload nor the token. Rank 0 serves peers concurrently,
// drops strangers and keeps waiting for the genuine ranks until its deadline; every other rank
// has a deadline on connecting, sending and receiving. The payload itself is not encrypted (NCCL's
// own traffic is not either).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpumem/nccl/detail/hmac_sha256.hpp"

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
  /// Gives up ownership (the caller closes the descriptor).
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

[[noreturn]] inline void rendezvous_error(const std::string& what) {
  throw std::runtime_error("gpumem::nccl rendezvous: " + what);
}

using rendezvous_clock = std::chrono::steady_clock;

namespace tcp_protocol {
inline constexpr unsigned char magic[8] = {'g', 'p', 'u', 'm', 'e', 'm', 'R', 'V'};
inline constexpr std::uint32_t version = 1;
inline constexpr std::size_t nonce_size = 16;
inline constexpr std::size_t mac_size = sizeof(sha256_digest);
inline constexpr std::size_t server_hello_size = sizeof magic + 4 + nonce_size;
inline constexpr std::size_t client_hello_size = sizeof magic + 4 + 4 + 4 + nonce_size + mac_size;
inline constexpr std::size_t reply_header_size = 4 + 4;
inline constexpr std::uint32_t max_payload = 1u << 16;
/// Rank 0's answer to a peer's hello.
enum status : std::uint32_t { accepted = 0, wrong_world_size = 1, wrong_rank = 2, wrong_token = 3 };
/// A peer that has not finished its handshake by then is dropped (genuine ranks take
/// milliseconds; a dropped genuine rank reconnects).
inline constexpr std::chrono::seconds handshake_timeout{10};
/// At most this many unfinished handshakes; the oldest goes first, so a flood of silent
/// connections cannot starve the genuine ranks.
inline constexpr std::size_t max_pending = 512;
/// A rank that cannot connect yet retries after this long.
inline constexpr std::chrono::milliseconds retry_delay{100};

using nonce = std::array<unsigned char, nonce_size>;

inline void put_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<unsigned char>(v >> shift));
}
inline std::uint32_t get_u32(const unsigned char* p) noexcept {
  return static_cast<std::uint32_t>(p[0]) << 24 | static_cast<std::uint32_t>(p[1]) << 16 |
         static_cast<std::uint32_t>(p[2]) << 8 | static_cast<std::uint32_t>(p[3]);
}

/// 16 bytes from std::random_device (the kernel's generator on Linux).
inline nonce random_nonce() {
  std::random_device device;
  nonce n{};
  for (std::size_t i = 0; i < n.size(); i += 4) {
    const unsigned int v = device();
    for (std::size_t j = 0; j < 4; ++j) n[i + j] = static_cast<unsigned char>(v >> (8 * j));
  }
  return n;
}

// The labels keep the two directions apart: rank 0 cannot be fooled into accepting its own MAC.
inline sha256_digest client_mac(const std::string& token, const nonce& n0, const nonce& n1,
                                std::uint32_t world_size, std::uint32_t rank) {
  std::vector<unsigned char> ints;
  put_u32(ints, world_size);
  put_u32(ints, rank);
  hmac_sha256 h(token);
  h.update(std::string("gpumem rendezvous v1: rank to rank 0"));
  h.update(n0.data(), n0.size());
  h.update(n1.data(), n1.size());
  h.update(ints.data(), ints.size());
  return h.finish();
}

inline sha256_digest server_mac(const std::string& token, const nonce& n0, const nonce& n1,
                                std::uint32_t world_size, std::uint32_t rank, const char* payload,
                                std::uint32_t size) {
  std::vector<unsigned char> ints;
  put_u32(ints, world_size);
  put_u32(ints, rank);
  put_u32(ints, size);
  hmac_sha256 h(token);
  h.update(std::string("gpumem rendezvous v1: rank 0 to rank"));
  h.update(n0.data(), n0.size());
  h.update(n1.data(), n1.size());
  h.update(ints.data(), ints.size());
  h.update(payload, size);
  return h.finish();
}

inline std::vector<unsigned char> server_hello(const nonce& n0) {
  std::vector<unsigned char> m(std::begin(magic), std::end(magic));
  put_u32(m, version);
  m.insert(m.end(), n0.begin(), n0.end());
  return m;
}

inline std::vector<unsigned char> client_hello(const std::string& token, const nonce& n0,
                                               const nonce& n1, std::uint32_t world_size,
                                               std::uint32_t rank) {
  std::vector<unsigned char> m(std::begin(magic), std::end(magic));
  put_u32(m, version);
  put_u32(m, world_size);
  put_u32(m, rank);
  m.insert(m.end(), n1.begin(), n1.end());
  const sha256_digest mac = client_mac(token, n0, n1, world_size, rank);
  m.insert(m.end(), mac.begin(), mac.end());
  return m;
}

inline std::vector<unsigned char> server_accept(const std::string& token, const nonce& n0,
                                                const nonce& n1, std::uint32_t world_size,
                                                std::uint32_t rank,
                                                const std::vector<char>& payload) {
  const auto size = static_cast<std::uint32_t>(payload.size());
  std::vector<unsigned char> m;
  put_u32(m, accepted);
  put_u32(m, size);
  for (const char ch : payload) m.push_back(static_cast<unsigned char>(ch));
  const sha256_digest mac = server_mac(token, n0, n1, world_size, rank, payload.data(), size);
  m.insert(m.end(), mac.begin(), mac.end());
  return m;
}

inline std::vector<unsigned char> server_refuse(status why) {
  std::vector<unsigned char> m;
  put_u32(m, why);
  put_u32(m, 0);
  return m;
}
}  // namespace tcp_protocol

/// Milliseconds until `deadline` for poll(): at least 0, rounded up, at most INT_MAX.
inline int poll_timeout(rendezvous_clock::time_point deadline) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - rendezvous_clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

inline bool set_nonblocking(int fd) noexcept {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 &&
         ::fcntl(fd, F_SETFD, FD_CLOEXEC) == 0;
}

inline std::string address_text(const sockaddr* address, socklen_t length) {
  char host[NI_MAXHOST] = "?";
  char service[NI_MAXSERV] = "?";
  ::getnameinfo(address, length, host, sizeof host, service, sizeof service,
                NI_NUMERICHOST | NI_NUMERICSERV);
  return address->sa_family == AF_INET6 ? "[" + std::string(host) + "]:" + service
                                        : std::string(host) + ":" + service;
}

inline std::unique_ptr<addrinfo, void (*)(addrinfo*)> resolve(const std::string& host, int port,
                                                              std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    error = "cannot resolve " + host + ": " + ::gai_strerror(rc);
    found = nullptr;
  }
  return {found, ::freeaddrinfo};
}

/// Whether `a` is a loopback address (127.0.0.0/8, ::1, or 127.x mapped into IPv6). Takes a
/// whole sockaddr_storage: reading an IPv6 address through a sockaddr* is out of bounds when the
/// object is a sockaddr_in.
inline bool is_loopback(const sockaddr_storage& a) noexcept {
  if (a.ss_family == AF_INET) {
    sockaddr_in v4{};
    std::memcpy(&v4, &a, sizeof v4);
    return (ntohl(v4.sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family == AF_INET6) {
    sockaddr_in6 v6{};
    std::memcpy(&v6, &a, sizeof v6);
    return IN6_IS_ADDR_LOOPBACK(&v6.sin6_addr) ||
           (IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr) && v6.sin6_addr.s6_addr[12] == 127);
  }
  return false;
}

/// The same for an address of getaddrinfo's.
inline bool is_loopback(const addrinfo& a) noexcept {
  sockaddr_storage copy{};
  std::memcpy(&copy, a.ai_addr, std::min<std::size_t>(a.ai_addrlen, sizeof copy));
  return is_loopback(copy);
}

/// Listening sockets (non-blocking) on every address `host` resolves to, port `port` — only
/// those addresses, so rank 0 is reachable only where MASTER_ADDR says. Addresses that cannot be
/// bound are skipped; throws std::runtime_error when none can.
inline std::vector<socket_fd> listen_on(const std::string& host, int port, int backlog) {
  std::string error;
  const auto found = resolve(host, port, error);
  if (!found) rendezvous_error("rank 0 " + error);
  std::vector<socket_fd> listeners;
  for (const addrinfo* a = found.get(); a != nullptr; a = a->ai_next) {
    socket_fd s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    const int yes = 1;
    const bool ok = s.get() >= 0 &&
                    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes) == 0 &&
                    (a->ai_family != AF_INET6 ||
                     ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &yes, sizeof yes) == 0) &&
                    ::bind(s.get(), a->ai_addr, a->ai_addrlen) == 0 &&
                    ::listen(s.get(), backlog) == 0 && set_nonblocking(s.get());
    if (!ok) {
      error += (error.empty() ? "" : "; ") + address_text(a->ai_addr, a->ai_addrlen) + ": " +
               std::strerror(errno);
      continue;
    }
    listeners.push_back(std::move(s));
  }
  if (listeners.empty()) {
    rendezvous_error("rank 0 cannot listen on " + host + ":" + std::to_string(port) + " (" + error +
                     "); MASTER_ADDR must be an address of rank 0's host");
  }
  return listeners;
}

enum class io_result { done, closed, timed_out };

/// Moves `size` bytes at `data` through `fd` by `deadline`: `step(data, size)` is one send or
/// recv of what is left; while the socket would block, waits for `ready` (POLLOUT or POLLIN).
template <class Byte, class Step>
io_result transfer_until(int fd, Byte* data, std::size_t size, short ready,
                         rendezvous_clock::time_point deadline, const Step& step) {
  while (size > 0) {
    const ssize_t n = step(data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, ready, 0};
      const int r = ::poll(&p, 1, poll_timeout(deadline));
      if (r == 0) return io_result::timed_out;
      if (r < 0 && errno != EINTR) return io_result::closed;
      continue;
    }
    return io_result::closed;  // 0: orderly close; < 0: reset and the like
  }
  return io_result::done;
}

inline io_result send_until(int fd, const unsigned char* data, std::size_t size,
                            rendezvous_clock::time_point deadline) {
  return transfer_until(
      fd, data, size, POLLOUT, deadline,
      [fd](const unsigned char* d, std::size_t n) { return ::send(fd, d, n, MSG_NOSIGNAL); });
}

inline io_result receive_until(int fd, unsigned char* data, std::size_t size,
                               rendezvous_clock::time_point deadline) {
  return transfer_until(fd, data, size, POLLIN, deadline,
                        [fd](unsigned char* d, std::size_t n) { return ::recv(fd, d, n, 0); });
}

/// A non-blocking socket connected to `a` by `deadline`, or an invalid one with `why` set.
inline socket_fd connect_until(const addrinfo* a, rendezvous_clock::time_point deadline,
                               std::string& why) {
  socket_fd s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
  if (s.get() < 0 || !set_nonblocking(s.get())) {
    why = std::strerror(errno);
    return socket_fd();
  }
  if (::connect(s.get(), a->ai_addr, a->ai_addrlen) == 0) return s;
  if (errno != EINPROGRESS && errno != EINTR) {
    why = std::strerror(errno);
    return socket_fd();
  }
  pollfd p{s.get(), POLLOUT, 0};
  int r = 0;
  do {
    r = ::poll(&p, 1, poll_timeout(deadline));
  } while (r < 0 && errno == EINTR);
  if (r == 0) {
    why = "connecting timed out";
    return socket_fd();
  }
  int error = 0;
  socklen_t length = sizeof error;
  if (r < 0 || ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
    why = std::strerror(r < 0 ? errno : error);
    return socket_fd();
  }
  return s;
}

/// One rank's side of the handshake on a connected socket. Returns false when rank 0 closed the
/// connection (the caller reconnects); throws when rank 0 stays silent past `deadline`, answers
/// with something that is not this protocol, refuses this rank or fails authentication.
inline bool receive_from_rank0(int fd, int rank, int world_size, const std::string& token,
                               std::vector<char>& payload, rendezvous_clock::time_point deadline,
                               const std::string& where, std::chrono::milliseconds timeout) {
  namespace p = tcp_protocol;
  const std::string who = "rank " + std::to_string(rank) + ": ";
  const std::string waited = " within " + std::to_string(timeout.count()) + " ms";
  unsigned char hello[p::server_hello_size];
  switch (receive_until(fd, hello, sizeof hello, deadline)) {
    case io_result::closed:
      return false;
    case io_result::timed_out:
      rendezvous_error(who + where + " accepted the connection but did not start the handshake" +
                       waited + " (rank 0 stalled, or another program holds the port)");
    case io_result::done:
      break;
  }
  if (std::memcmp(hello, p::magic, sizeof p::magic) != 0) {
    rendezvous_error(who + where +
                     " does not speak gpumem's rendezvous (another program holds the port?)");
  }
  if (const std::uint32_t v = p::get_u32(hello + sizeof p::magic); v != p::version) {
    rendezvous_error(who + "rank 0 at " + where + " speaks rendezvous protocol " +
                     std::to_string(v) + ", this rank " + std::to_string(p::version) +
                     ": every rank needs the same gpumem");
  }
  p::nonce n0{};
  std::memcpy(n0.data(), hello + sizeof p::magic + 4, n0.size());
  const p::nonce n1 = p::random_nonce();
  const auto w = static_cast<std::uint32_t>(world_size);
  const auto r = static_cast<std::uint32_t>(rank);
  const std::vector<unsigned char> mine = p::client_hello(token, n0, n1, w, r);
  switch (send_until(fd, mine.data(), mine.size(), deadline)) {
    case io_result::closed:
      return false;
    case io_result::timed_out:
      rendezvous_error(who + "rank 0 at " + where + " did not take this rank's hello" + waited);
    case io_result::done:
      break;
  }
  unsigned char head[p::reply_header_size];
  switch (receive_until(fd, head, sizeof head, deadline)) {
    case io_result::closed:
      return false;
    case io_result::timed_out:
      rendezvous_error(who + "rank 0 at " + where + " did not answer this rank's hello" + waited);
    case io_result::done:
      break;
  }
  switch (const std::uint32_t status = p::get_u32(head); status) {
    case p::accepted:
      break;
    case p::wrong_token:
      rendezvous_error(who + "rank 0 at " + where +
                       " refused this rank's token: every rank needs the same "
                       "GPUMEM_RENDEZVOUS_TOKEN (or TORCHELASTIC_RUN_ID)");
    case p::wrong_world_size:
      rendezvous_error(who + "rank 0 at " + where + " refused WORLD_SIZE " +
                       std::to_string(world_size) + ": its own differs");
    case p::wrong_rank:
      rendezvous_error(who + "rank 0 at " + where + " refused rank " + std::to_string(rank));
    default:
      rendezvous_error(who + "rank 0 at " + where + " answered with unknown status " +
                       std::to_string(status));
  }
  if (const std::uint32_t size = p::get_u32(head + 4); size != payload.size()) {
    rendezvous_error(who + "rank 0 at " + where + " sent " + std::to_string(size) +
                     " bytes, expected " + std::to_string(payload.size()) +
                     ": refused (not this job's rank 0?)");
  }
  std::vector<unsigned char> rest(payload.size() + p::mac_size);
  switch (receive_until(fd, rest.data(), rest.size(), deadline)) {
    case io_result::closed:
      return false;
    case io_result::timed_out:
      rendezvous_error(who + "rank 0 at " + where + " stopped in the middle of its answer" +
                       waited);
    case io_result::done:
      break;
  }
  const sha256_digest expected =
      p::server_mac(token, n0, n1, w, r, reinterpret_cast<const char*>(rest.data()),
                    static_cast<std::uint32_t>(payload.size()));
  if (!digests_equal(expected.data(), rest.data() + payload.size())) {
    rendezvous_error(who + "the answer from " + where +
                     " failed authentication: refused (not this job's rank 0, or another "
                     "GPUMEM_RENDEZVOUS_TOKEN)");
  }
  std::memcpy(payload.data(), rest.data(), payload.size());
  return true;
}

/// Rank 0's side: serves every peer that completes the handshake until each of ranks
/// 1..world_size-1 got `payload`; strangers are dropped. Throws at `deadline` with what it saw.
inline void serve_ranks(int world_size, const std::string& host, int port, const std::string& token,
                        const std::vector<char>& payload, rendezvous_clock::time_point deadline,
                        std::chrono::milliseconds timeout) {
  namespace p = tcp_protocol;
  const std::vector<socket_fd> listeners =
      listen_on(host, port, std::min(std::max(world_size, 16), SOMAXCONN));
  // Where rank 0 listens, for its error: a host name that resolves to loopback here (Debian's
  // /etc/hosts maps a host's own name to 127.0.1.1) is out of reach of other hosts.
  std::string listening;
  bool loopback_only = true;
  for (const socket_fd& l : listeners) {
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    if (::getsockname(l.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) continue;
    listening += (listening.empty() ? "" : ", ") +
                 address_text(reinterpret_cast<const sockaddr*>(&bound), length);
    loopback_only = loopback_only && is_loopback(bound);
  }
  struct peer {
    socket_fd fd;
    rendezvous_clock::time_point deadline;
    p::nonce n0{};
    std::vector<unsigned char> out;
    std::size_t sent = 0;
    std::array<unsigned char, p::client_hello_size> in{};
    std::size_t received = 0;
    bool reading = false;  // else sending `out`
    bool final = false;    // `out` is the answer: done once sent
    int rank = -1;         // accepted rank, once the hello checked out
  };
  std::vector<peer> peers;
  std::vector<bool> served(static_cast<std::size_t>(world_size), false);
  int served_count = 0;
  // What rank 0 dropped, for the error at its deadline.
  int silent = 0, foreign = 0, bad_token = 0, bad_world = 0, bad_rank = 0;
  const auto w = static_cast<std::uint32_t>(world_size);

  // Advances one peer; false when it is finished (served or dropped).
  auto step = [&](peer& c) {
    if (!c.reading) {
      const ssize_t n =
          ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
      if (n <= 0) {
        ++silent;
        return false;
      }
      c.sent += static_cast<std::size_t>(n);
      if (c.sent < c.out.size()) return true;
      if (c.final) {
        if (c.rank > 0 && !served[static_cast<std::size_t>(c.rank)]) {
          served[static_cast<std::size_t>(c.rank)] = true;
          ++served_count;
        }
        return false;
      }
      c.reading = true;
      return true;
    }
    const ssize_t n = ::recv(c.fd.get(), c.in.data() + c.received, c.in.size() - c.received, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    if (n <= 0) {
      ++silent;
      return false;
    }
    c.received += static_cast<std::size_t>(n);
    // Something else (an HTTP probe, say) shows itself in the first bytes: no need to wait.
    if (std::memcmp(c.in.data(), p::magic, std::min(c.received, sizeof p::magic)) != 0) {
      ++foreign;
      return false;
    }
    if (c.received < c.in.size()) return true;
    const unsigned char* h = c.in.data() + sizeof p::magic;
    if (p::get_u32(h) != p::version) {
      ++foreign;
      return false;
    }
    const std::uint32_t their_world = p::get_u32(h + 4);
    const std::uint32_t their_rank = p::get_u32(h + 8);
    p::nonce n1{};
    std::memcpy(n1.data(), h + 12, n1.size());
    const sha256_digest mac = p::client_mac(token, c.n0, n1, their_world, their_rank);
    c.reading = false;
    c.final = true;
    c.sent = 0;
    // The token first: a peer that does not know it learns nothing else.
    if (!digests_equal(mac.data(), h + 12 + p::nonce_size)) {
      ++bad_token;
      c.out = p::server_refuse(p::wrong_token);
    } else if (their_world != w) {
      ++bad_world;
      c.out = p::server_refuse(p::wrong_world_size);
    } else if (their_rank == 0 || their_rank >= w) {
      ++bad_rank;
      c.out = p::server_refuse(p::wrong_rank);
    } else {
      c.rank = static_cast<int>(their_rank);
      c.out = p::server_accept(token, c.n0, n1, w, their_rank, payload);
    }
    return true;
  };

  std::vector<pollfd> polled;
  while (served_count < world_size - 1) {
    const auto now = rendezvous_clock::now();
    if (now >= deadline) {
      std::string missing;
      int listed = 0;
      for (int r = 1; r < world_size && listed < 8; ++r) {
        if (!served[static_cast<std::size_t>(r)]) {
          missing += (listed++ == 0 ? "" : ", ") + std::to_string(r);
        }
      }
      if (world_size - 1 - served_count > listed) missing += ", ...";
      rendezvous_error(
          "rank 0 waited " + std::to_string(timeout.count()) + " ms on " + host + " (" + listening +
          (loopback_only ? ", loopback: out of reach of other hosts" : "") +
          "): " + std::to_string(served_count) + " of " + std::to_string(world_size - 1) +
          " ranks took the NCCL id (missing ranks " + missing + "); dropped connections: " +
          std::to_string(silent) + " silent or closed, " + std::to_string(foreign) +
          " not gpumem's rendezvous, " + std::to_string(bad_token) + " with a wrong token, " +
          std::to_string(bad_world) + " with another world size, " + std::to_string(bad_rank) +
          " with a bad rank; " + std::to_string(peers.size()) + " still in the handshake");
    }
    // Unfinished handshakes past their own deadline go.
    const auto before = peers.size();
    peers.erase(std::remove_if(peers.begin(), peers.end(),
                               [&](const peer& c) { return c.deadline <= now; }),
                peers.end());
    silent += static_cast<int>(before - peers.size());
    auto wake = deadline;
    polled.clear();
    for (const socket_fd& l : listeners) polled.push_back({l.get(), POLLIN, 0});
    for (const peer& c : peers) {
      polled.push_back({c.fd.get(), static_cast<short>(c.reading ? POLLIN : POLLOUT), 0});
      wake = std::min(wake, c.deadline);
    }
    const int r = ::poll(polled.data(), static_cast<nfds_t>(polled.size()), poll_timeout(wake));
    if (r < 0 && errno != EINTR) rendezvous_error(std::string("poll: ") + std::strerror(errno));
    if (r <= 0) continue;
    std::vector<peer> kept;
    kept.reserve(peers.size());
    for (std::size_t i = 0; i < peers.size(); ++i) {
      const short ev = polled[listeners.size() + i].revents;
      if (ev == 0 || step(peers[i])) kept.push_back(std::move(peers[i]));
    }
    peers = std::move(kept);
    for (std::size_t i = 0; i < listeners.size(); ++i) {
      if ((polled[i].revents & POLLIN) == 0) continue;
      for (;;) {
        socket_fd s(::accept(listeners[i].get(), nullptr, nullptr));
        if (s.get() < 0) {
          // Out of descriptors: make room by dropping the oldest unfinished handshake.
          if ((errno == EMFILE || errno == ENFILE) && !peers.empty()) {
            peers.erase(peers.begin());
            ++silent;
          }
          break;  // EAGAIN: none left; ECONNABORTED and the like: the next poll tells
        }
        if (!set_nonblocking(s.get())) continue;
        if (peers.size() >= p::max_pending) {
          peers.erase(peers.begin());
          ++silent;
        }
        peer c;
        c.fd = std::move(s);
        c.deadline = std::min(deadline, rendezvous_clock::now() + p::handshake_timeout);
        c.n0 = p::random_nonce();
        c.out = p::server_hello(c.n0);
        peers.push_back(std::move(c));
      }
    }
  }
}

/// Rank 0 sends `payload` to the world_size - 1 other ranks; each other rank connects to
/// host:port and receives payload.size() bytes into `payload`. Rank 0 listens only on the
/// addresses `host` resolves to (so `host` must be one of its own) and gives the payload only to
/// peers that prove they know `token` (and it proves the same to them); see the top of the file.
/// Every rank gives up after `timeout`. Any thread may call it (each call has its own sockets).
/// Throws std::runtime_error naming what failed (a bad argument, rank 0 cannot listen, the
/// deadline, a refused or unauthenticated answer).
inline void exchange(int rank, int world_size, const std::string& host, int port,
                     std::vector<char>& payload, std::chrono::milliseconds timeout,
                     const std::string& token = {}) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    rendezvous_error("rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  }
  if (port <= 0 || port > 65535) rendezvous_error("port " + std::to_string(port));
  if (payload.size() > tcp_protocol::max_payload) {
    rendezvous_error("payload of " + std::to_string(payload.size()) + " bytes");
  }
  if (world_size == 1) return;
  const auto deadline = rendezvous_clock::now() + timeout;
  if (rank == 0) {
    serve_ranks(world_size, host, port, token, payload, deadline, timeout);
    return;
  }
  std::string last = "nothing tried";
  for (;;) {
    std::string error;
    const auto found = resolve(host, port, error);
    for (const addrinfo* a = found.get(); a != nullptr; a = a->ai_next) {
      const std::string where = address_text(a->ai_addr, a->ai_addrlen);
      // One unreachable address must not use up the time of the next one.
      const auto attempt = std::min(deadline, rendezvous_clock::now() + std::chrono::seconds(10));
      socket_fd s = connect_until(a, attempt, error);
      if (s.get() < 0) {
        error = where + ": " + error;
        continue;
      }
      if (receive_from_rank0(s.get(), rank, world_size, token, payload, deadline, where, timeout)) {
        return;
      }
      error = where + " closed the connection during the handshake";
    }
    if (!error.empty()) last = error;
    const auto now = rendezvous_clock::now();
    if (now >= deadline) {
      rendezvous_error("rank " + std::to_string(rank) + " could not reach rank 0 at " + host + ":" +
                       std::to_string(port) + " within " + std::to_string(timeout.count()) +
                       " ms (last: " + last + ")");
    }
    std::this_thread::sleep_for(
        std::min<rendezvous_clock::duration>(tcp_protocol::retry_delay, deadline - now));
  }
}

}  // namespace gpumem::nccl::detail
