// Test helpers for the rendezvous tests: free loopback ports, a "stranger" connecting to one,
// which addresses listen on a port (from /proc/net), and environment variables set for a scope.
// Loopback only: nothing here reaches another host.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gpumem_test {

/// A port nobody listens on now: the kernel's pick for a socket bound to port 0 (tests run in
/// parallel processes, so fixed or pid-derived ports collide).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw std::runtime_error("cannot find a free port");
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

/// A blocking TCP socket to 127.0.0.1:port, retrying until something listens there (up to
/// `patience`); receives time out after `receive_timeout`. Throws when nothing listens in time.
inline int connect_loopback(int port, std::chrono::seconds patience = std::chrono::seconds(20),
                            std::chrono::seconds receive_timeout = std::chrono::seconds(20)) {
  const auto give_up = std::chrono::steady_clock::now() + patience;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
      timeval tv{static_cast<time_t>(receive_timeout.count()), 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      return fd;
    }
    if (fd >= 0) ::close(fd);
    if (std::chrono::steady_clock::now() > give_up) {
      throw std::runtime_error("nothing listens on 127.0.0.1:" + std::to_string(port));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// Everything `fd` receives until the peer closes or a receive times out.
inline std::string receive_until_closed(int fd) {
  std::string got;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) return got;
    got.append(buffer, static_cast<std::size_t>(n));
  }
}

/// The local addresses of the TCP sockets listening on `port`, from /proc/net/tcp and tcp6
/// (numeric, e.g. "127.0.0.1", "::1", "0.0.0.0"); nullopt where /proc/net is not readable.
inline std::optional<std::vector<std::string>> listening_addresses(int port) {
  std::vector<std::string> found;
  bool readable = false;
  for (const auto& [path, family] : {std::pair<const char*, int>{"/proc/net/tcp", AF_INET},
                                     std::pair<const char*, int>{"/proc/net/tcp6", AF_INET6}}) {
    std::ifstream in(path);
    if (!in) continue;
    readable = true;
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.find(':');
      if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
      if (std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
      // The address is printed as the raw 32-bit words of the in_addr / in6_addr.
      const std::string hex = local.substr(0, colon);
      unsigned char raw[16] = {};
      for (std::size_t word = 0; word * 8 < hex.size() && word < 4; ++word) {
        const auto v = static_cast<std::uint32_t>(std::stoul(hex.substr(word * 8, 8), nullptr, 16));
        std::memcpy(raw + 4 * word, &v, 4);
      }
      char text[INET6_ADDRSTRLEN] = {};
      ::inet_ntop(family, raw, text, sizeof text);
      found.emplace_back(text);
    }
  }
  if (!readable) return std::nullopt;
  return found;
}

/// Waits (up to 20 s) until something listens on `port`; its addresses, as above.
inline std::optional<std::vector<std::string>> wait_for_listener(int port) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    auto found = listening_addresses(port);
    if (!found || !found->empty() || std::chrono::steady_clock::now() > give_up) return found;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// Sets (or, with nullptr, unsets) environment variables for its lifetime; restores them after.
class env_guard {
 public:
  explicit env_guard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value != nullptr) {
        ::setenv(name, value, 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  env_guard(const env_guard&) = delete;
  env_guard& operator=(const env_guard&) = delete;
  ~env_guard() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        ::unsetenv(it->first.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace gpumem_test
