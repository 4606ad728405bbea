// from_environment's rendezvous with LibTorch: NCCL's unique id through c10d's TCPStore on
// MASTER_PORT — rank 0's own store, or torchrun's agent store with every rank a client — and the
// tcp method chosen through the options. No GPU: the id is just bytes here. Loopback only.
#include <gtest/gtest.h>

#include <netdb.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../support/loopback.hpp"
#include "gpumem/nccl/communicator.hpp"

#if !GPUMEM_NCCL_TCPSTORE
#error "these tests need c10d's TCPStore (LibTorch with torch.distributed)"
#endif

namespace {

using gpumem::nccl::rendezvous_method;
using gpumem::nccl::rendezvous_options;
using gpumem::nccl::torchrun_environment;
using gpumem::nccl::detail::elastic_environment;
using gpumem_test::free_port;

constexpr auto generous = std::chrono::seconds(30);

std::vector<char> id_bytes(int seed) {
  std::vector<char> v(128);
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<char>(i * 13 + static_cast<std::size_t>(seed));
  }
  return v;
}

torchrun_environment env_of(int rank, int world, int port) {
  torchrun_environment e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

elastic_environment torchrun_agent(const std::string& run_id) {
  elastic_environment e;
  e.present = true;
  e.agent_store = true;
  e.run_id = run_id;
  return e;
}

// Ranks 0..world-1 as threads calling share_unique_id; payloads[0] holds rank 0's id. Returns
// each rank's error ("" when none).
std::vector<std::string> share(int world, int port, const elastic_environment& elastic,
                               const rendezvous_options& options, std::uint64_t sequence,
                               std::vector<std::vector<char>>& payloads, int first = 0) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = first; r < world; ++r) {
    ranks.emplace_back([&, r] {
      try {
        gpumem::nccl::detail::share_unique_id(env_of(r, world, port), elastic, options, sequence,
                                              payloads[static_cast<std::size_t>(r)]);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

rendezvous_options store_options(std::chrono::milliseconds timeout = generous) {
  rendezvous_options o;
  o.method = rendezvous_method::tcp_store;
  o.timeout = timeout;
  return o;
}

// The store torchrun's agent would run: not multi-tenant, so a rank that tried to serve the port
// itself would fail instead of sharing it.
c10::intrusive_ptr<c10d::TCPStore> agent_store(int port) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = std::chrono::seconds(30);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

// Rank 0's store goes when rank 0 returns: the others must be done with it by then (repeated:
// a race there shows only now and then).
TEST(TcpStoreRendezvous, WithoutTorchrunRankZeroServesTheStoreAndEveryRankGetsTheId) {
  for (int world : {2, 4, 8, 2, 4, 8, 2, 4, 8, 2, 4, 8}) {
    SCOPED_TRACE(world);
    const int port = free_port();
    std::vector<std::vector<char>> payloads(static_cast<std::size_t>(world),
                                            std::vector<char>(128, 0));
    payloads[0] = id_bytes(world);
    const auto errors = share(world, port, elastic_environment{}, store_options(), 0, payloads);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(errors[static_cast<std::size_t>(r)], "");
      EXPECT_EQ(payloads[static_cast<std::size_t>(r)], payloads[0]) << "rank " << r;
    }
  }
}

// Under torchrun the agent's store is on MASTER_PORT: every rank is its client, keys are gpumem's
// and per call, and rank 0 removes them once every rank is done with them.
TEST(TcpStoreRendezvous, UnderTorchrunEveryRankIsAClientOfTheAgentsStore) {
  const int port = free_port();
  const auto store = agent_store(port);
  store->set("someone/else", std::vector<std::uint8_t>{1});
  const int64_t keys_before = store->getNumKeys();
  const int world = 3;
  const elastic_environment elastic = torchrun_agent("job42");
  for (std::uint64_t call = 0; call < 2; ++call) {
    SCOPED_TRACE(call);
    std::vector<std::vector<char>> payloads(world, std::vector<char>(128, 0));
    payloads[0] = id_bytes(static_cast<int>(call));
    const auto errors = share(world, port, elastic, store_options(), call, payloads);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(errors[static_cast<std::size_t>(r)], "");
      EXPECT_EQ(payloads[static_cast<std::size_t>(r)], payloads[0]) << "rank " << r;
    }
    const std::string prefix = gpumem::nccl::detail::store_key_prefix(elastic, call);
    EXPECT_EQ(prefix.rfind("gpumem/nccl/unique_id/job42/", 0), 0u) << prefix;
    EXPECT_FALSE(store->check({prefix + "/id"}));  // a finished round leaves no id behind
  }
  EXPECT_EQ(store->getNumKeys(), keys_before);  // gpumem's keys are gone again
  EXPECT_TRUE(store->check({"someone/else"}));  // others' keys untouched
}

// torchrun's store outlives a failed attempt, and with it an id that attempt's rank 0 published:
// ranks that read it before the new rank 0 replaced it still end up with the new id.
TEST(TcpStoreRendezvous, AnIdAFailedAttemptLeftBehindIsReplaced) {
  namespace d = gpumem::nccl::detail;
  const int port = free_port();
  const auto store = agent_store(port);
  const std::string prefix = d::store_key_prefix(torchrun_agent("job"), 0);
  // Half of an earlier attempt: its rank 0 published, one rank took it, then it died.
  const d::store_value::round_id old_round = d::tcp_protocol::random_nonce();
  store->set(prefix + "/id", d::store_value::encode(old_round, id_bytes(99)));
  store->add(prefix + "/" + d::store_value::hex(old_round) + "/taken", 1);
  const int world = 3;
  std::vector<std::vector<char>> payloads(world, std::vector<char>(128, 0));
  payloads[0] = id_bytes(7);
  std::vector<std::string> errors(world);
  const auto deadline = d::rendezvous_clock::now() + generous;
  auto run = [&](int r) {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(port);
    o.timeout = generous;
    c10d::TCPStore client("127.0.0.1", o);
    try {
      d::store_exchange(client, prefix, r, world, payloads[static_cast<std::size_t>(r)], deadline,
                        generous, "here", std::chrono::milliseconds(200));
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  };
  // Ranks 1 and 2 first: they find the old id.
  std::thread rank1(run, 1), rank2(run, 2);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (store->add(prefix + "/" + d::store_value::hex(old_round) + "/taken", 0) < 3 &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  run(0);
  rank1.join();
  rank2.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "");
    EXPECT_EQ(payloads[static_cast<std::size_t>(r)], payloads[0]) << "rank " << r;
  }
}

TEST(TcpStoreRendezvous, ASilentRankZeroFailsTheRankByItsDeadline) {
  const int port = free_port();
  const auto store = agent_store(port);
  std::vector<char> payload(128, 0);
  auto rank1 = std::async(std::launch::async, [&] {
    return error_of([&] {
      gpumem::nccl::detail::share_unique_id(env_of(1, 2, port), torchrun_agent("job"),
                                            store_options(std::chrono::milliseconds(1000)), 0,
                                            payload);
    });
  });
  ASSERT_EQ(rank1.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const std::string error = rank1.get();
  EXPECT_NE(error.find("rank 1: no NCCL id from rank 0 within 1000 ms"), std::string::npos)
      << error;
  EXPECT_EQ(payload, std::vector<char>(128, 0));
}

TEST(TcpStoreRendezvous, NoStoreAtAllFailsTheRankByItsDeadline) {
  std::vector<char> payload(128, 0);
  const std::string error = error_of([&] {
    gpumem::nccl::detail::share_unique_id(env_of(1, 2, free_port()), elastic_environment{},
                                          store_options(std::chrono::milliseconds(1000)), 0,
                                          payload);
  });
  EXPECT_NE(error.find("rank 1 cannot connect to the TCPStore at 127.0.0.1:"), std::string::npos)
      << error;
}

TEST(TcpStoreRendezvous, AValueThatIsNotGpumemsIdIsRefused) {
  const int port = free_port();
  const auto store = agent_store(port);
  const elastic_environment elastic = torchrun_agent("job");
  store->set(gpumem::nccl::detail::store_key_prefix(elastic, 0) + "/id",
             std::vector<std::uint8_t>(128, 'G'));
  std::vector<char> payload(128, 0);
  const std::string error = error_of([&] {
    gpumem::nccl::detail::share_unique_id(env_of(1, 2, port), elastic, store_options(), 0, payload);
  });
  EXPECT_NE(error.find("not gpumem's NCCL id of 128 bytes: refused"), std::string::npos) << error;
  EXPECT_EQ(payload, std::vector<char>(128, 0));
}

// Ranks 0 and 1 of 3 (rank 2 never comes): both fail by their deadlines, saying why.
TEST(TcpStoreRendezvous, WithARankMissingRankZeroAndTheOthersFailByTheirDeadlines) {
  const int port = free_port();
  const auto store = agent_store(port);
  std::vector<std::vector<char>> payloads(3, std::vector<char>(128, 0));
  payloads[0] = id_bytes(1);
  std::string error0;
  std::thread rank0([&] {
    error0 = error_of([&] {
      gpumem::nccl::detail::share_unique_id(env_of(0, 3, port), torchrun_agent("job"),
                                            store_options(std::chrono::milliseconds(2000)), 0,
                                            payloads[0]);
    });
  });
  const std::string error1 = error_of([&] {
    gpumem::nccl::detail::share_unique_id(env_of(1, 3, port), torchrun_agent("job"),
                                          store_options(std::chrono::milliseconds(3000)), 0,
                                          payloads[1]);
  });
  rank0.join();
  EXPECT_NE(error0.find("rank 0 waited 2000 ms"), std::string::npos) << error0;
  EXPECT_NE(error0.find("1 of 2 ranks took the NCCL id"), std::string::npos) << error0;
  EXPECT_NE(error1.find("rank 1: took the NCCL id but rank 0 did not see every rank take it "
                        "within 3000 ms"),
            std::string::npos)
      << error1;
}

// When rank 0 serves the store and gives up, the others learn at once, not at their deadline.
TEST(TcpStoreRendezvous, WhenRankZerosStoreGoesTheOthersFailAtOnce) {
  const int port = free_port();
  std::vector<std::vector<char>> payloads(3, std::vector<char>(128, 0));
  payloads[0] = id_bytes(2);
  std::thread rank0([&] {
    (void)error_of([&] {
      gpumem::nccl::detail::share_unique_id(env_of(0, 3, port), elastic_environment{},
                                            store_options(std::chrono::milliseconds(2000)), 0,
                                            payloads[0]);
    });
  });
  const auto started = std::chrono::steady_clock::now();
  const std::string error1 = error_of([&] {
    gpumem::nccl::detail::share_unique_id(env_of(1, 3, port), elastic_environment{},
                                          store_options(std::chrono::seconds(120)), 0, payloads[1]);
  });
  rank0.join();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(60));
  EXPECT_NE(error1.find("lost the TCPStore"), std::string::npos) << error1;
}

// The store rank 0 starts listens where MASTER_ADDR points, not on every interface.
TEST(TcpStoreRendezvous, RankZerosStoreListensOnlyOnMasterAddr) {
  const int port = free_port();
  const auto store = gpumem::nccl::detail::open_tcp_store(
      "127.0.0.1", port, 0, true, gpumem::nccl::detail::rendezvous_clock::now() + generous);
  // It works: a client reaches it.
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.timeout = std::chrono::seconds(30);
  c10d::TCPStore client("127.0.0.1", o);
  client.set("k", std::vector<std::uint8_t>{7});
  EXPECT_EQ(store->get("k"), std::vector<std::uint8_t>{7});
  const auto listening = gpumem_test::listening_addresses(port);
  if (!listening) GTEST_SKIP() << "/proc/net/tcp is not readable here";
  ASSERT_FALSE(listening->empty());
  for (const std::string& a : *listening) EXPECT_EQ(a, "127.0.0.1");
}

// Numeric addresses and "localhost" are bound as given; a host name that resolves to loopback
// here (how Debian's /etc/hosts maps a host's own name) is left to c10d, as PyTorch does, since
// other hosts may reach this one by that name under another address.
TEST(TcpStoreRendezvous, WhichMasterAddrsTheStoreIsBoundTo) {
  using gpumem::nccl::detail::bind_store_to_master_addr;
  EXPECT_TRUE(bind_store_to_master_addr("127.0.0.1"));
  EXPECT_TRUE(bind_store_to_master_addr("::1"));
  EXPECT_TRUE(bind_store_to_master_addr("localhost"));
  EXPECT_TRUE(bind_store_to_master_addr("10.1.2.3"));  // numeric: nothing is resolved or sent
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name, nullptr, &hints, &found) != 0)
    GTEST_SKIP() << name << " does not resolve";
  bool loopback = false;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    loopback = loopback || gpumem::nccl::detail::is_loopback(*a);
  }
  ::freeaddrinfo(found);
  if (!loopback) GTEST_SKIP() << "this host's name " << name << " does not resolve to loopback";
  EXPECT_FALSE(bind_store_to_master_addr(name)) << name;
}

// With a store this process serves already (PyTorch's own, from init_process_group), rank 0
// shares it instead of failing on the taken port.
TEST(TcpStoreRendezvous, RankZeroSharesAStoreThisProcessAlreadyServes) {
  const int port = free_port();
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = true;
  o.multiTenant = true;
  o.waitWorkers = false;
  o.timeout = std::chrono::seconds(30);
  const auto pytorchs = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  std::vector<std::vector<char>> payloads(2, std::vector<char>(128, 0));
  payloads[0] = id_bytes(5);
  const auto errors = share(2, port, elastic_environment{}, store_options(), 0, payloads);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(payloads[1], payloads[0]);
}

// The tcp method through the same entry point: GPUMEM_RENDEZVOUS_PORT-style port and a token.
TEST(TcpRendezvousFromOptions, TheTcpMethodNeedsAPortAndExchangesTheId) {
  gpumem_test::env_guard env({{"GPUMEM_RENDEZVOUS_PORT", nullptr},
                              {"GPUMEM_RENDEZVOUS_TOKEN", nullptr},
                              {"GPUMEM_RENDEZVOUS", nullptr}});
  rendezvous_options o;
  o.method = rendezvous_method::tcp;
  o.timeout = generous;
  std::vector<char> payload(128);
  EXPECT_THROW(
      gpumem::nccl::detail::share_unique_id(env_of(1, 2, 1), elastic_environment{}, o, 0, payload),
      std::invalid_argument);
  o.tcp_port = free_port();
  o.tcp_token = "secret";
  std::vector<std::vector<char>> payloads(3, std::vector<char>(128, 0));
  payloads[0] = id_bytes(8);
  const auto errors = share(3, free_port(), elastic_environment{}, o, 0, payloads);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "");
    EXPECT_EQ(payloads[static_cast<std::size_t>(r)], payloads[0]) << "rank " << r;
  }
  // A single rank needs no rendezvous (and no port).
  rendezvous_options none;
  none.method = rendezvous_method::tcp;
  EXPECT_NO_THROW(gpumem::nccl::detail::share_unique_id(env_of(0, 1, 1), elastic_environment{},
                                                        none, 0, payload));
}

}  // namespace
