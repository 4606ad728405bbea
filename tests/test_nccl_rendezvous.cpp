// The TCP rendezvous that hands NCCL's unique id from rank 0 to the others (no NCCL needed): the
// handshake, strangers on the port, deadlines, where rank 0 listens, and the settings it reads.
// Loopback addresses only.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "gpumem/nccl/detail/hmac_sha256.hpp"
#include "gpumem/nccl/detail/tcp_rendezvous.hpp"
#include "gpumem/nccl/rendezvous.hpp"
#include "support/loopback.hpp"

namespace {

using gpumem::nccl::detail::exchange;
using gpumem_test::connect_loopback;
using gpumem_test::free_port;

constexpr auto generous = std::chrono::seconds(20);

std::vector<char> pattern(std::size_t size, int seed) {
  std::vector<char> v(size);
  for (std::size_t i = 0; i < size; ++i)
    v[i] = static_cast<char>(i * 7 + static_cast<std::size_t>(seed));
  return v;
}

bool contains(const std::string& haystack, const std::vector<char>& needle) {
  return std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end()) !=
         haystack.end();
}

std::string hex(const gpumem::nccl::detail::sha256_digest& d) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : d) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

// Ranks first..world-1 as threads, each with its own payload (rank 0's holds `sent`); returns
// each rank's error ("" when none).
std::vector<std::string> run_ranks(int first, int world, int port,
                                   std::vector<std::vector<char>>& payloads,
                                   const std::string& token = "") {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = first; r < world; ++r) {
    ranks.emplace_back([&, r] {
      try {
        exchange(r, world, "127.0.0.1", port, payloads[static_cast<std::size_t>(r)], generous,
                 token);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

TEST(HmacSha256, MatchesPublishedVectors) {
  using gpumem::nccl::detail::hmac_sha256;
  using gpumem::nccl::detail::sha256;
  auto digest = [](const std::string& s) {
    sha256 h;
    h.update(s);
    return hex(h.finish());
  };
  // FIPS 180-4 examples.
  EXPECT_EQ(digest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(digest(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(digest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  sha256 million;
  const std::string a(1000, 'a');
  for (int i = 0; i < 1000; ++i) {
    million.update(a.data(), 997);  // pieces that straddle blocks
    million.update(a.data(), 3);
  }
  EXPECT_EQ(hex(million.finish()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // RFC 4231 test cases 1, 2 and 6 (a key longer than a block).
  auto mac = [](const std::string& key, const std::string& data) {
    hmac_sha256 h(key);
    h.update(data);
    return hex(h.finish());
  };
  EXPECT_EQ(mac(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(mac("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(mac(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(mac("", ""), "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

TEST(TcpRendezvous, RankZeroHandsItsBytesToEveryRank) {
  for (int world : {1, 2, 4, 8}) {
    for (const std::string token : {"", "job-secret"}) {
      SCOPED_TRACE(std::to_string(world) + " ranks, token \"" + token + "\"");
      const int port = free_port();
      std::vector<std::vector<char>> payloads(static_cast<std::size_t>(world),
                                              std::vector<char>(128, 0));
      payloads[0] = pattern(128, 1);
      const auto errors = run_ranks(0, world, port, payloads, token);
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(errors[static_cast<std::size_t>(r)], "");
        EXPECT_EQ(payloads[static_cast<std::size_t>(r)], payloads[0]) << "rank " << r;
      }
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

// Rank 0 listens where MASTER_ADDR points, not on every interface.
TEST(TcpRendezvous, RankZeroListensOnlyOnMasterAddr) {
  const int port = free_port();
  std::vector<std::vector<char>> payloads{pattern(32, 3), std::vector<char>(32)};
  std::string error0;
  std::thread rank0([&] {
    try {
      exchange(0, 2, "127.0.0.1", port, payloads[0], generous);
    } catch (const std::exception& e) {
      error0 = e.what();
    }
  });
  const auto listening = gpumem_test::wait_for_listener(port);
  std::string error1;
  try {
    exchange(1, 2, "127.0.0.1", port, payloads[1], generous);
  } catch (const std::exception& e) {
    error1 = e.what();
  }
  rank0.join();
  EXPECT_EQ(error0, "");
  EXPECT_EQ(error1, "");
  if (!listening) GTEST_SKIP() << "/proc/net/tcp is not readable here";
  ASSERT_FALSE(listening->empty());
  for (const std::string& a : *listening) EXPECT_EQ(a, "127.0.0.1");
}

TEST(TcpRendezvous, ListenOnBindsTheResolvedAddressesOnly) {
  using gpumem::nccl::detail::listen_on;
  const int port = free_port();
  const auto listeners = listen_on("127.0.0.1", port, 4);
  ASSERT_EQ(listeners.size(), 1u);
  sockaddr_in bound{};
  socklen_t length = sizeof bound;
  ASSERT_EQ(::getsockname(listeners[0].get(), reinterpret_cast<sockaddr*>(&bound), &length), 0);
  EXPECT_EQ(bound.sin_family, AF_INET);
  EXPECT_EQ(ntohl(bound.sin_addr.s_addr), INADDR_LOOPBACK);
  EXPECT_EQ(ntohs(bound.sin_port), port);
  // An address that is not this host's cannot be listened on (TEST-NET-1; nothing is sent).
  try {
    listen_on("192.0.2.1", free_port(), 4);
    FAIL() << "listened on an address that is not this host's";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR must be an address of rank 0's host"),
              std::string::npos)
        << e.what();
  }
  // IPv6 loopback, where the host has it.
  const int fd6 = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 probe{};
  probe.sin6_family = AF_INET6;
  probe.sin6_addr = in6addr_loopback;
  const bool have_ipv6 =
      fd6 >= 0 && ::bind(fd6, reinterpret_cast<sockaddr*>(&probe), sizeof probe) == 0;
  if (fd6 >= 0) ::close(fd6);
  if (!have_ipv6) return;
  const auto six = listen_on("::1", port, 4);
  ASSERT_EQ(six.size(), 1u);
  sockaddr_in6 bound6{};
  length = sizeof bound6;
  ASSERT_EQ(::getsockname(six[0].get(), reinterpret_cast<sockaddr*>(&bound6), &length), 0);
  EXPECT_EQ(bound6.sin6_family, AF_INET6);
  EXPECT_TRUE(IN6_IS_ADDR_LOOPBACK(&bound6.sin6_addr));
}

TEST(TcpRendezvous, LoopbackAddressesAreRecognised) {
  using gpumem::nccl::detail::is_loopback;
  auto v4 = [](const char* text) {
    sockaddr_storage a{};
    sockaddr_in in{};
    in.sin_family = AF_INET;
    ::inet_pton(AF_INET, text, &in.sin_addr);
    std::memcpy(&a, &in, sizeof in);
    return is_loopback(a);
  };
  auto v6 = [](const char* text) {
    sockaddr_storage a{};
    sockaddr_in6 in{};
    in.sin6_family = AF_INET6;
    ::inet_pton(AF_INET6, text, &in.sin6_addr);
    std::memcpy(&a, &in, sizeof in);
    return is_loopback(a);
  };
  EXPECT_TRUE(v4("127.0.0.1"));
  EXPECT_TRUE(v4("127.0.1.1"));
  EXPECT_FALSE(v4("10.1.2.3"));
  EXPECT_FALSE(v4("0.0.0.0"));
  EXPECT_TRUE(v6("::1"));
  EXPECT_TRUE(v6("::ffff:127.0.0.1"));
  EXPECT_FALSE(v6("::"));
  EXPECT_FALSE(v6("fe80::1"));
}

// A port scanner that connects first and says nothing: it must not get the id, and the genuine
// ranks must still start.
TEST(TcpRendezvous, ASilentStrangerFirstGetsNothingAndTheRanksStillStart) {
  const int port = free_port();
  const int world = 3;
  std::vector<std::vector<char>> payloads(world, std::vector<char>(128, 0));
  payloads[0] = pattern(128, 5);
  std::string error0;
  std::thread rank0([&] {
    try {
      exchange(0, world, "127.0.0.1", port, payloads[0], generous);
    } catch (const std::exception& e) {
      error0 = e.what();
    }
  });
  const int stranger = connect_loopback(port);
  const auto errors = run_ranks(1, world, port, payloads);
  rank0.join();
  EXPECT_EQ(error0, "");
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(payloads[static_cast<std::size_t>(r)], payloads[0]) << "rank " << r;
  }
  const std::string got = gpumem_test::receive_until_closed(stranger);
  ::close(stranger);
  EXPECT_FALSE(contains(got, payloads[0])) << "the stranger got the id";
  EXPECT_LE(got.size(), gpumem::nccl::detail::tcp_protocol::server_hello_size);
}

// Something that talks another protocol (an HTTP probe) gets nothing and is dropped.
TEST(TcpRendezvous, AStrangerSendingGarbageGetsNothingAndTheRanksStillStart) {
  const int port = free_port();
  std::vector<std::vector<char>> payloads{pattern(128, 9), std::vector<char>(128)};
  std::string error0;
  std::thread rank0([&] {
    try {
      exchange(0, 2, "127.0.0.1", port, payloads[0], generous);
    } catch (const std::exception& e) {
      error0 = e.what();
    }
  });
  const int stranger = connect_loopback(port);
  const std::string probe = "GET / HTTP/1.0\r\nHost: x\r\n\r\n" + std::string(200, '\x7f');
  ASSERT_EQ(::send(stranger, probe.data(), probe.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(probe.size()));
  const std::string got = gpumem_test::receive_until_closed(stranger);  // dropped: closes
  ::close(stranger);
  const auto errors = run_ranks(1, 2, port, payloads);
  rank0.join();
  EXPECT_EQ(error0, "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(payloads[1], payloads[0]);
  EXPECT_FALSE(contains(got, payloads[0])) << "the stranger got the id";
}

// A peer that speaks the protocol but has another job's token is refused with a clear error, and
// rank 0 keeps waiting for the genuine rank.
TEST(TcpRendezvous, AWrongTokenOrWorldSizeIsRefusedAndTheRanksStillStart) {
  const int port = free_port();
  std::vector<std::vector<char>> payloads{pattern(128, 11), std::vector<char>(128)};
  std::string error0;
  std::thread rank0([&] {
    try {
      exchange(0, 2, "127.0.0.1", port, payloads[0], generous, "right");
    } catch (const std::exception& e) {
      error0 = e.what();
    }
  });
  std::vector<char> stolen(128);
  try {
    exchange(1, 2, "127.0.0.1", port, stolen, generous, "wrong");
    ADD_FAILURE() << "a wrong token was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("refused this rank's token"), std::string::npos)
        << e.what();
  }
  try {
    exchange(1, 3, "127.0.0.1", port, stolen, generous, "right");
    ADD_FAILURE() << "another world size was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("refused WORLD_SIZE 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(stolen, std::vector<char>(128));
  const auto errors = run_ranks(1, 2, port, payloads, "right");
  rank0.join();
  EXPECT_EQ(error0, "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(payloads[1], payloads[0]);
}

// Rank 0 does not stop at the first comer: it waits for the genuine ranks until its deadline and
// then says who is missing and what it dropped.
TEST(TcpRendezvous, RankZeroWaitsForTheGenuineRanksUntilItsDeadline) {
  const int port = free_port();
  const int world = 3;
  std::vector<std::vector<char>> payloads(world, std::vector<char>(64, 0));
  payloads[0] = pattern(64, 13);
  std::string error0;
  std::thread rank0([&] {
    try {
      exchange(0, world, "127.0.0.1", port, payloads[0], std::chrono::milliseconds(3000));
    } catch (const std::exception& e) {
      error0 = e.what();
    }
  });
  const int stranger = connect_loopback(port);
  std::string error1;
  try {
    exchange(1, world, "127.0.0.1", port, payloads[1], generous);
  } catch (const std::exception& e) {
    error1 = e.what();
  }
  rank0.join();
  ::close(stranger);
  EXPECT_EQ(error1, "");
  EXPECT_EQ(payloads[1], payloads[0]);
  EXPECT_NE(error0.find("1 of 2 ranks took the NCCL id (missing ranks 2)"), std::string::npos)
      << error0;
  EXPECT_NE(error0.find("1 still in the handshake"), std::string::npos) << error0;  // the stranger
  // Where it listened, and that other hosts could not reach that.
  EXPECT_NE(error0.find("127.0.0.1:" + std::to_string(port) + ", loopback"), std::string::npos)
      << error0;
}

// A "rank 0" that accepts and stays silent: the rank fails by its deadline, saying so. (The
// listener never accepts; the kernel completes the connection.)
TEST(TcpRendezvous, ASilentRankZeroFailsTheRankByItsDeadline) {
  const int port = free_port();
  const auto listeners = gpumem::nccl::detail::listen_on("127.0.0.1", port, 4);
  auto rank1 = std::async(std::launch::async, [port] {
    std::vector<char> payload(128);
    try {
      exchange(1, 2, "127.0.0.1", port, payload, std::chrono::milliseconds(500));
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  if (rank1.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "the rank kept waiting for a silent rank 0";
    ::shutdown(listeners[0].get(), SHUT_RDWR);  // lets it go
  }
  const std::string error = rank1.get();
  EXPECT_NE(error.find("did not start the handshake within 500 ms"), std::string::npos) << error;
}

// A "rank 0" that answers with bytes that are not the protocol: refused at once, nothing copied.
TEST(TcpRendezvous, GarbageFromRankZeroIsRefused) {
  const int port = free_port();
  const auto listeners = gpumem::nccl::detail::listen_on("127.0.0.1", port, 4);
  std::thread fake([&] {
    pollfd p{listeners[0].get(), POLLIN, 0};
    if (::poll(&p, 1, 20000) != 1) return;
    const int fd = ::accept(listeners[0].get(), nullptr, nullptr);
    const std::string garbage(300, 'X');
    (void)::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
    char sink[256];
    while (::recv(fd, sink, sizeof sink, 0) > 0) {
    }
    ::close(fd);
  });
  std::vector<char> payload(128, 0);
  std::string error = "no error";
  try {
    exchange(1, 2, "127.0.0.1", port, payload, generous);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  fake.join();
  EXPECT_NE(error.find("does not speak gpumem's rendezvous"), std::string::npos) << error;
  EXPECT_EQ(payload, std::vector<char>(128, 0));
}

// A "rank 0" that speaks the protocol but does not know the token cannot plant an id.
TEST(TcpRendezvous, AnAnswerThatFailsAuthenticationIsRefused) {
  namespace p = gpumem::nccl::detail::tcp_protocol;
  const int port = free_port();
  const auto listeners = gpumem::nccl::detail::listen_on("127.0.0.1", port, 4);
  std::thread fake([&] {
    pollfd pl{listeners[0].get(), POLLIN, 0};
    if (::poll(&pl, 1, 20000) != 1) return;
    const int fd = ::accept(listeners[0].get(), nullptr, nullptr);
    const p::nonce n0 = p::random_nonce();
    const auto hello = p::server_hello(n0);
    (void)::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    unsigned char theirs[p::client_hello_size];
    std::size_t got = 0;
    while (got < sizeof theirs) {
      const ssize_t n = ::recv(fd, theirs + got, sizeof theirs - got, 0);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    p::nonce n1{};
    std::memcpy(n1.data(), theirs + 20, n1.size());
    const auto answer = p::server_accept("guessed", n0, n1, 2, 1, std::vector<char>(128, 'E'));
    (void)::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL);
    ::close(fd);
  });
  std::vector<char> payload(128, 0);
  std::string error = "no error";
  try {
    exchange(1, 2, "127.0.0.1", port, payload, generous, "the job's token");
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  fake.join();
  EXPECT_NE(error.find("failed authentication"), std::string::npos) << error;
  EXPECT_EQ(payload, std::vector<char>(128, 0));
}

// --- Settings --------------------------------------------------------------------------------

TEST(RendezvousSettings, PortComesFromTheOptionsOrGpumemRendezvousPort) {
  using gpumem::nccl::detail::resolve_tcp_port;
  gpumem_test::env_guard env({{"GPUMEM_RENDEZVOUS_PORT", nullptr}});
  EXPECT_EQ(resolve_tcp_port(1234), 1234);
  try {
    resolve_tcp_port(0);
    FAIL() << "no port was needed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("set GPUMEM_RENDEZVOUS_PORT"), std::string::npos);
  }
  EXPECT_THROW(resolve_tcp_port(70000), std::invalid_argument);
  gpumem_test::env_guard port({{"GPUMEM_RENDEZVOUS_PORT", "29999"}});
  EXPECT_EQ(resolve_tcp_port(0), 29999);
  EXPECT_EQ(resolve_tcp_port(1234), 1234);
  gpumem_test::env_guard bad({{"GPUMEM_RENDEZVOUS_PORT", "29999x"}});
  EXPECT_THROW(resolve_tcp_port(0), std::invalid_argument);
}

TEST(RendezvousSettings, TokenComesFromTheOptionsTheEnvironmentOrTorchrunsRunId) {
  using gpumem::nccl::detail::elastic_environment;
  using gpumem::nccl::detail::resolve_tcp_token;
  gpumem_test::env_guard env({{"GPUMEM_RENDEZVOUS_TOKEN", nullptr},
                              {"TORCHELASTIC_RUN_ID", nullptr},
                              {"TORCHELASTIC_RESTART_COUNT", nullptr},
                              {"TORCHELASTIC_USE_AGENT_STORE", nullptr}});
  EXPECT_EQ(resolve_tcp_token("", elastic_environment::read()), "");
  {
    gpumem_test::env_guard run({{"TORCHELASTIC_RUN_ID", "run7"},
                                {"TORCHELASTIC_RESTART_COUNT", "2"},
                                {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
    const auto elastic = elastic_environment::read();
    EXPECT_TRUE(elastic.present);
    EXPECT_TRUE(elastic.agent_store);
    EXPECT_EQ(elastic.run_id, "run7");
    const std::string derived = resolve_tcp_token("", elastic);
    EXPECT_NE(derived.find("run7"), std::string::npos);
    // Not from the restart count: nodes disagree on it after one node's workers failed.
    {
      gpumem_test::env_guard other_node({{"TORCHELASTIC_RESTART_COUNT", "0"}});
      EXPECT_EQ(resolve_tcp_token("", elastic_environment::read()), derived);
    }
    elastic_environment other_job = elastic;
    other_job.run_id = "run8";
    EXPECT_NE(resolve_tcp_token("", other_job), derived);
    gpumem_test::env_guard secret({{"GPUMEM_RENDEZVOUS_TOKEN", "s3cret"}});
    EXPECT_EQ(resolve_tcp_token("", elastic), "s3cret");
    EXPECT_EQ(resolve_tcp_token("mine", elastic), "mine");
  }
  gpumem_test::env_guard no_agent({{"TORCHELASTIC_USE_AGENT_STORE", "False"}});
  EXPECT_FALSE(elastic_environment::read().agent_store);
  EXPECT_FALSE(elastic_environment::read().present);
}

TEST(RendezvousSettings, MethodComesFromTheOptionsOrGpumemRendezvous) {
  using gpumem::nccl::rendezvous_method;
  using gpumem::nccl::detail::resolve_method;
  gpumem_test::env_guard env({{"GPUMEM_RENDEZVOUS", nullptr}});
  EXPECT_EQ(resolve_method(rendezvous_method::automatic, true), rendezvous_method::tcp_store);
  EXPECT_EQ(resolve_method(rendezvous_method::automatic, false), rendezvous_method::tcp);
  EXPECT_EQ(resolve_method(rendezvous_method::tcp, true), rendezvous_method::tcp);
  gpumem_test::env_guard tcp({{"GPUMEM_RENDEZVOUS", "tcp"}});
  EXPECT_EQ(resolve_method(rendezvous_method::automatic, true), rendezvous_method::tcp);
  EXPECT_EQ(resolve_method(rendezvous_method::tcp_store, true), rendezvous_method::tcp_store);
  gpumem_test::env_guard bad({{"GPUMEM_RENDEZVOUS", "carrier-pigeon"}});
  EXPECT_THROW(resolve_method(rendezvous_method::automatic, true), std::invalid_argument);
}

TEST(RendezvousSettings, StoreKeysDifferPerRunAndCall) {
  using gpumem::nccl::detail::elastic_environment;
  using gpumem::nccl::detail::store_key_prefix;
  gpumem_test::env_guard env({{"TORCHELASTIC_RUN_ID", "run7"},
                              {"TORCHELASTIC_RESTART_COUNT", "1"},
                              {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  const elastic_environment e = elastic_environment::read();
  const std::string first = store_key_prefix(e, 0);
  EXPECT_EQ(first.rfind("gpumem/", 0), 0u) << first;
  EXPECT_NE(store_key_prefix(e, 1), first);
  elastic_environment other = e;
  other.run_id = "run8";
  EXPECT_NE(store_key_prefix(other, 0), first);
  // The same on every node, whatever its restart count.
  gpumem_test::env_guard other_node({{"TORCHELASTIC_RESTART_COUNT", "0"}});
  EXPECT_EQ(store_key_prefix(elastic_environment::read(), 0), first);
  EXPECT_NE(store_key_prefix(elastic_environment{}, 0), first);  // not under torchrun
}

}  // namespace
