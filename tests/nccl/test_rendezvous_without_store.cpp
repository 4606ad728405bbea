// communicator.hpp compiled without c10d's TCPStore (GPUMEM_NCCL_TCPSTORE=0, as for a LibTorch
// without torch.distributed): from_environment's rendezvous is the tcp way. Loopback only.
#define GPUMEM_NCCL_TCPSTORE 0

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../support/loopback.hpp"
#include "gpumem/nccl/communicator.hpp"

namespace {

using gpumem::nccl::rendezvous_method;
using gpumem::nccl::rendezvous_options;
using gpumem::nccl::detail::elastic_environment;
using gpumem::nccl::detail::share_unique_id;

gpumem::nccl::torchrun_environment env_of(int rank, int world, int port) {
  gpumem::nccl::torchrun_environment e;
  e.rank = rank;
  e.world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

TEST(RendezvousWithoutTcpStore, TheDefaultIsTheTcpWay) {
  gpumem_test::env_guard env({{"GPUMEM_RENDEZVOUS", nullptr},
                              {"GPUMEM_RENDEZVOUS_PORT", nullptr},
                              {"GPUMEM_RENDEZVOUS_TOKEN", "job-secret"}});
  rendezvous_options o;
  o.timeout = std::chrono::seconds(30);
  std::vector<char> bytes(128);
  try {
    share_unique_id(env_of(1, 2, 29500), elastic_environment{}, o, 0, bytes);
    FAIL() << "the tcp way ran without a port";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("GPUMEM_RENDEZVOUS_PORT"), std::string::npos);
  }
  o.tcp_port = gpumem_test::free_port();
  const int world = 3;
  std::vector<std::vector<char>> payloads(world, std::vector<char>(128, 0));
  for (std::size_t i = 0; i < 128; ++i) payloads[0][i] = static_cast<char>(i + 1);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      try {
        share_unique_id(env_of(r, world, 1), elastic_environment{}, o, 0,
                        payloads[static_cast<std::size_t>(r)]);
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

TEST(RendezvousWithoutTcpStore, TheStoreWayIsRefusedWithAReason) {
  rendezvous_options o;
  o.method = rendezvous_method::tcp_store;
  std::vector<char> bytes(128);
  try {
    share_unique_id(env_of(1, 2, 29500), elastic_environment{}, o, 0, bytes);
    FAIL() << "asked for a TCPStore this build left out";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("GPUMEM_NCCL_TCPSTORE=0"), std::string::npos);
  }
}

}  // namespace
