// The TCP rendezvous that hands NCCL's unique id from rank 0 to the others (no NCCL needed).
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "gpumem/nccl/detail/tcp_rendezvous.hpp"

namespace {

using gpumem::nccl::detail::exchange;

// A port nobody listens on now: the kernel's pick for a socket bound to port 0 (tests run in
// parallel processes, so fixed or pid-derived ports collide).
int free_port() {
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

TEST(TcpRendezvous, RankZeroHandsItsBytesToEveryRank) {
  for (int world : {1, 2, 4}) {
    SCOPED_TRACE(world);
    const int port = free_port();
    std::vector<std::vector<char>> payloads(static_cast<std::size_t>(world),
                                            std::vector<char>(128, 0));
    for (std::size_t i = 0; i < 128; ++i) payloads[0][i] = static_cast<char>(i * 7 + 1);
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        try {
          exchange(r, world, "127.0.0.1", port, payloads[static_cast<std::size_t>(r)],
                   std::chrono::seconds(20));
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(errors[static_cast<std::size_t>(r)], "");
      EXPECT_EQ(payloads[static_cast<std::size_t>(r)], payloads[0]) << "rank " << r;
    }
  }
}

TEST(TcpRendezvous, ARankWithoutRankZeroTimesOutWithAClearError) {
  std::vector<char> payload(16);
  try {
    exchange(1, 2, "127.0.0.1", free_port(), payload, std::chrono::milliseconds(200));
    FAIL() << "connected to nobody";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach rank 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(exchange(2, 2, "127.0.0.1", 1234, payload, std::chrono::milliseconds(10)),
               std::runtime_error);
  EXPECT_THROW(exchange(0, 2, "127.0.0.1", 70000, payload, std::chrono::milliseconds(10)),
               std::runtime_error);
}

}  // namespace
