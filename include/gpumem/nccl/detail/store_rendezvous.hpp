// gpumem — NCCL's unique id through c10d's TCPStore (LibTorch), the way PyTorch's env://
// initialisation shares its own: rank 0 sets a key, every other rank waits for it. No port besides
// MASTER_PORT.
//
// Who serves the store follows PyTorch: under torchrun with TORCHELASTIC_USE_AGENT_STORE=True the
// agent already runs it on MASTER_ADDR:MASTER_PORT, and every rank (rank 0 too) is a client;
// otherwise rank 0 starts it. Keys carry gpumem's own prefix with torchrun's run id and a
// per-process sequence number (a second communicator must not read the first one's id).
//
// torchrun's store outlives a restart, so an attempt that failed half-way can leave its id behind
// (torchrun's restart count cannot tell attempts apart: it differs between nodes). So rank 0 tags
// its id with a fresh random round, every rank counts itself under that round and waits for rank
// 0's "go" under it — which a dead rank 0 never gives — and a rank still waiting re-reads the id
// now and then: when the live rank 0 has replaced a left-over id, it switches. Rank 0 deletes the
// id before its "go", so a finished round's id is never taken, and returns (closing a store it
// serves) only once every rank saw the "go"; then it deletes the round's keys.
//
// The store is c10d's and as open as PyTorch's own (no authentication: whoever reaches MASTER_PORT
// can read its keys, PyTorch's own NCCL ids included). A server gpumem starts listens only on
// MASTER_ADDR's address (PyTorch's listens on all), except where that would lock other hosts out
// (bind_store_to_master_addr).
#pragma once

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpumem/nccl/detail/tcp_rendezvous.hpp"

namespace gpumem::nccl::detail {

namespace store_value {
// magic | version | round | size | payload: a value someone else left under the key is refused.
inline constexpr unsigned char magic[8] = {'g', 'p', 'u', 'm', 'e', 'm', 'I', 'D'};
inline constexpr std::uint32_t version = 1;
using round_id = tcp_protocol::nonce;
inline constexpr std::size_t header_size = sizeof magic + 4 + sizeof(round_id) + 4;

inline std::vector<std::uint8_t> encode(const round_id& round, const std::vector<char>& payload) {
  std::vector<std::uint8_t> v(std::begin(magic), std::end(magic));
  std::vector<unsigned char> ints;
  tcp_protocol::put_u32(ints, version);
  v.insert(v.end(), ints.begin(), ints.end());
  v.insert(v.end(), round.begin(), round.end());
  ints.clear();
  tcp_protocol::put_u32(ints, static_cast<std::uint32_t>(payload.size()));
  v.insert(v.end(), ints.begin(), ints.end());
  for (const char c : payload) v.push_back(static_cast<std::uint8_t>(c));
  return v;
}

/// Reads `v` into `round` and `payload` if it is gpumem's value with payload.size() bytes; else
/// false (and neither is changed).
inline bool decode(const std::vector<std::uint8_t>& v, round_id& round,
                   std::vector<char>& payload) {
  const std::uint8_t* size = v.data() + sizeof magic + 4 + sizeof(round_id);
  if (v.size() != header_size + payload.size() || std::memcmp(v.data(), magic, sizeof magic) != 0 ||
      tcp_protocol::get_u32(v.data() + sizeof magic) != version ||
      tcp_protocol::get_u32(size) != payload.size()) {
    return false;
  }
  std::memcpy(round.data(), v.data() + sizeof magic + 4, round.size());
  std::memcpy(payload.data(), v.data() + header_size, payload.size());
  return true;
}

inline std::string hex(const round_id& round) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (const unsigned char c : round) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}
}  // namespace store_value

/// Time left until `deadline`, at least 1 ms: c10d reads 0 as "wait forever".
inline std::chrono::milliseconds store_time_left(rendezvous_clock::time_point deadline) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - rendezvous_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

/// c10d's errors (c10::Error: DistStoreError, DistNetworkError, ...) as rendezvous errors with
/// `what` in front and without c10's backtrace.
template <typename F>
auto store_call(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    rendezvous_error(what + ": " + e.what_without_backtrace());
  }
}

/// Whether rank 0's store listens on MASTER_ADDR's addresses only: yes for a numeric address or
/// "localhost" (what was asked for is what is bound) and for a name that resolves to addresses
/// that are not loopback. No for a name that resolves to loopback here (Debian's /etc/hosts maps
/// a host's own name to 127.0.1.1) while other hosts may reach this one by it under another
/// address: c10d binds as for PyTorch then. Never throws except std::bad_alloc.
inline bool bind_store_to_master_addr(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* numeric = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &numeric) == 0) {
    ::freeaddrinfo(numeric);
    return true;
  }
  if (host == "localhost") return true;
  std::string error;
  const auto found = resolve(host, 1, error);
  if (!found) return false;
  for (const addrinfo* a = found.get(); a != nullptr; a = a->ai_next) {
    if (is_loopback(*a)) return false;
  }
  return true;
}

/// c10d's TCPStore at host:port for `rank` (in messages), as its server (which also is a client)
/// or as a client, connecting (retrying) until `deadline`. A server listens only on `host`'s
/// address where bind_store_to_master_addr says so and that address is one of this host's; else
/// (a NAT or service address), or when this process already serves that port (PyTorch's own
/// store: shared, multiTenant), c10d binds as it does for PyTorch. Throws std::runtime_error
/// (rendezvous_error) with c10d's reason.
inline c10::intrusive_ptr<c10d::Store> open_tcp_store(const std::string& host, int port, int rank,
                                                      bool server,
                                                      rendezvous_clock::time_point deadline) {
  if (port <= 0 || port > 65535) rendezvous_error("MASTER_PORT " + std::to_string(port));
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = server;
  // No worker count: c10d would count connections under its own "init/" key, which a shared
  // (multi-tenant or torchrun) store also counts for PyTorch. gpumem counts takers itself.
  options.numWorkers = std::nullopt;
  options.waitWorkers = false;
  options.timeout = store_time_left(deadline);
  options.multiTenant = true;  // as PyTorch's env:// store: one server per port and process
  if (server && bind_store_to_master_addr(host)) {
    try {
      std::vector<socket_fd> listeners = listen_on(host, port, SOMAXCONN);
      // c10d takes the descriptor over (closes it), blocking as a Python listening socket is.
      const int fd = listeners.front().release();
      const int flags = ::fcntl(fd, F_GETFL, 0);
      if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      options.masterListenFd = fd;
    } catch (const std::runtime_error&) {
      // Not an address of this host, or the port is taken: c10d decides (see above).
    }
  }
  const std::string where = host + ":" + std::to_string(port);
  return store_call(
      "rank " + std::to_string(rank) + (server ? " cannot start" : " cannot connect to") +
          " the TCPStore at " + where,
      [&] {
        return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::TCPStore>(host, options));
      });
}

/// Rank 0 sets `prefix`/id to `payload` and returns once the world_size - 1 other ranks took it;
/// the others wait for the key, copy it into `payload` (which must have the size rank 0's has)
/// and return once rank 0 saw every rank take it; rank 0 returns once every rank saw that (see
/// the top of the file; a rank re-reads the id every `recheck` while it waits). All by `deadline`;
/// `timeout` and `where` (the store) are for messages. Throws std::runtime_error (rendezvous_error)
/// for a deadline, a store error or a value that is not gpumem's.
inline void store_exchange(c10d::Store& store, const std::string& prefix, int rank, int world_size,
                           std::vector<char>& payload, rendezvous_clock::time_point deadline,
                           std::chrono::milliseconds timeout, const std::string& where,
                           std::chrono::milliseconds recheck = std::chrono::seconds(10)) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    rendezvous_error("rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  }
  if (world_size == 1) return;
  using store_value::round_id;
  const std::string id_key = prefix + "/id";
  auto key = [&](const round_id& round, const char* what) {
    return prefix + "/" + store_value::hex(round) + "/" + what;
  };
  const std::string waited = std::to_string(timeout.count()) + " ms";
  if (rank == 0) {
    const round_id round = tcp_protocol::random_nonce();
    store_call("rank 0 cannot set " + id_key + " in the TCPStore at " + where, [&] {
      store.setTimeout(store_time_left(deadline));
      store.set(id_key, store_value::encode(round, payload));
    });
    try {
      store.wait({key(round, "all_taken")}, store_time_left(deadline));
    } catch (const c10::Error& e) {
      std::string taken = "?";
      try {
        store.setTimeout(std::chrono::seconds(1));
        taken = std::to_string(store.add(key(round, "taken"), 0));
        store.deleteKey(id_key);  // the next attempt need not tell it apart
      } catch (const c10::Error&) {
      }
      rendezvous_error("rank 0 waited " + waited + " at the TCPStore " + where + ": " + taken +
                       " of " + std::to_string(world_size - 1) + " ranks took the NCCL id (" +
                       e.what_without_backtrace() + ")");
    }
    store_call("rank 0 cannot finish at the TCPStore at " + where, [&] {
      store.setTimeout(store_time_left(deadline));
      store.deleteKey(id_key);  // before "go": a finished round's id is never taken
      store.set(key(round, "go"), std::vector<std::uint8_t>{1});
    });
    // A store rank 0 serves goes with it: not before every rank saw "go".
    try {
      store.wait({key(round, "all_gone")}, store_time_left(deadline));
    } catch (const c10::Error& e) {
      rendezvous_error("rank 0 waited " + waited + " at the TCPStore " + where +
                       ": every rank took the NCCL id, but not every rank saw rank 0 see that (" +
                       e.what_without_backtrace() + ")");
    }
    // Tidy up: torchrun's store lives on. Best effort: every rank is done with these keys.
    try {
      for (const char* what : {"taken", "all_taken", "go", "gone", "all_gone"}) {
        store.deleteKey(key(round, what));
      }
    } catch (const c10::Error&) {
    }
    return;
  }
  const std::string who = "rank " + std::to_string(rank) + ": ";
  round_id round{};
  bool counted = false;
  // Takes the value under id_key; counts this rank under its round when the round is new.
  auto take = [&](const std::vector<std::uint8_t>& value) {
    round_id seen{};
    std::vector<char> bytes(payload.size());
    if (!store_value::decode(value, seen, bytes)) {
      rendezvous_error(who + "key " + id_key + " of the TCPStore at " + where + " holds " +
                       std::to_string(value.size()) + " bytes that are not gpumem's NCCL id of " +
                       std::to_string(payload.size()) + " bytes: refused");
    }
    if (counted && seen == round) return;
    round = seen;
    payload = std::move(bytes);
    counted = true;
    store_call(who + "cannot tell rank 0 it took the NCCL id (TCPStore at " + where + ")", [&] {
      store.setTimeout(store_time_left(deadline));
      if (store.add(key(round, "taken"), 1) == world_size - 1) {
        store.set(key(round, "all_taken"), std::vector<std::uint8_t>{1});
      }
    });
  };
  take(store_call(who + "no NCCL id from rank 0 within " + waited + " (key " + id_key +
                      " of the TCPStore at " + where + ")",
                  [&] {
                    store.setTimeout(store_time_left(deadline));
                    return store.get(id_key);
                  }));
  for (;;) {
    const auto slice = std::min(recheck, store_time_left(deadline));
    const auto started = rendezvous_clock::now();
    try {
      store.wait({key(round, "go")}, slice);
    } catch (const c10::Error& e) {
      // A timeout (DistStoreError, after the slice) means wait on; anything else (the store went
      // away: DistNetworkError) would only come back at once.
      const bool timed_out = dynamic_cast<const c10::DistStoreError*>(&e) != nullptr &&
                             rendezvous_clock::now() - started >= slice / 2;
      if (!timed_out) {
        rendezvous_error(who + "took the NCCL id, then lost the TCPStore at " + where +
                         " while waiting for rank 0: " + e.what_without_backtrace());
      }
      if (rendezvous_clock::now() >= deadline) {
        rendezvous_error(
            who + "took the NCCL id but rank 0 did not see every rank take it within " + waited +
            " (TCPStore at " + where + "; a rank missing?): " + e.what_without_backtrace());
      }
      // Rank 0 may have replaced an id a failed attempt left behind. Gone: rank 0 finished, "go"
      // is there. A short get: the key may go between check and get.
      try {
        store.setTimeout(std::min(std::chrono::milliseconds(1000), store_time_left(deadline)));
        if (store.check({id_key})) take(store.get(id_key));
      } catch (const c10::Error&) {
      }
      continue;
    }
    store_call(who + "cannot tell rank 0 it saw its go (TCPStore at " + where + ")", [&] {
      store.setTimeout(store_time_left(deadline));
      if (store.add(key(round, "gone"), 1) == world_size - 1) {
        store.set(key(round, "all_gone"), std::vector<std::uint8_t>{1});
      }
    });
    return;
  }
}

}  // namespace gpumem::nccl::detail
