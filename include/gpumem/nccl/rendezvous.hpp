// gpumem — how the ranks of a job agree on NCCL's unique id before ncclCommInitRank: the settings
// of nccl_communicator::from_environment (communicator.hpp) and the variables they come from.
// Needs no NCCL and no LibTorch; docs/nccl_rendezvous.md describes both ways and their security.
//
// Two ways:
//   tcp_store  c10d's TCPStore at MASTER_ADDR:MASTER_PORT, as PyTorch's env:// initialisation
//              uses it (communicator.hpp compiled with LibTorch's c10d; the default there).
//   tcp        gpumem's own TCP exchange (detail/tcp_rendezvous.hpp) on a port of its own,
//              GPUMEM_RENDEZVOUS_PORT, bound to MASTER_ADDR only, with an authenticated handshake
//              keyed by GPUMEM_RENDEZVOUS_TOKEN.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace gpumem::nccl {

enum class rendezvous_method {
  automatic,  ///< GPUMEM_RENDEZVOUS if set, else tcp_store where compiled in, else tcp
  tcp_store,  ///< c10d's TCPStore on MASTER_ADDR:MASTER_PORT (torchrun's own store under torchrun)
  tcp,        ///< gpumem's TCP exchange on GPUMEM_RENDEZVOUS_PORT with a token handshake
};

/// Settings of nccl_communicator::from_environment. Values left at their defaults come from the
/// environment variables named below.
struct rendezvous_options {
  rendezvous_method method = rendezvous_method::automatic;
  /// How long every rank waits in all (connecting, rank 0's id, the others taking it).
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// tcp: rank 0's port on MASTER_ADDR. 0: GPUMEM_RENDEZVOUS_PORT (required then, for more than
  /// one rank).
  int tcp_port = 0;
  /// tcp: the per-job secret both sides prove they know. Empty: GPUMEM_RENDEZVOUS_TOKEN, else
  /// one derived from torchrun's TORCHELASTIC_RUN_ID (not a secret, but it keeps other jobs
  /// apart), else none.
  std::string tcp_token;
};

namespace detail {

inline const char* env_or_null(const char* name) noexcept {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

/// What torchrun (torch.distributed.elastic) tells its workers beyond RANK, WORLD_SIZE, ...
struct elastic_environment {
  bool present = false;      ///< TORCHELASTIC_RUN_ID is set: started by torchrun
  bool agent_store = false;  ///< TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent runs the
                             ///< TCPStore on MASTER_ADDR:MASTER_PORT, workers are its clients
  std::string run_id;        ///< TORCHELASTIC_RUN_ID
  // Not TORCHELASTIC_RESTART_COUNT: each agent counts its own failures, so after one node's
  // workers failed the nodes disagree on it (a membership change restarts the others uncounted).

  /// Reads them; never throws for missing ones. Not safe against concurrent setenv.
  static elastic_environment read() {
    elastic_environment e;
    if (const char* id = env_or_null("TORCHELASTIC_RUN_ID")) {
      e.present = true;
      e.run_id = id;
    }
    // PyTorch's env:// initialisation compares with str(True).
    const char* agent = env_or_null("TORCHELASTIC_USE_AGENT_STORE");
    e.agent_store = agent != nullptr && std::string(agent) == "True";
    return e;
  }
};

/// options.method, else GPUMEM_RENDEZVOUS ("tcp_store" or "tcp"), else tcp_store where
/// `have_store`, else tcp. Throws std::invalid_argument for another GPUMEM_RENDEZVOUS.
inline rendezvous_method resolve_method(rendezvous_method configured, bool have_store) {
  if (configured != rendezvous_method::automatic) return configured;
  if (const char* v = env_or_null("GPUMEM_RENDEZVOUS")) {
    const std::string s = v;
    if (s == "tcp_store") return rendezvous_method::tcp_store;
    if (s == "tcp") return rendezvous_method::tcp;
    throw std::invalid_argument("gpumem::nccl: GPUMEM_RENDEZVOUS=\"" + s +
                                "\" is neither tcp_store nor tcp");
  }
  return have_store ? rendezvous_method::tcp_store : rendezvous_method::tcp;
}

/// The tcp way's port: `configured` if > 0, else GPUMEM_RENDEZVOUS_PORT. Throws
/// std::invalid_argument when neither gives a port in 1..65535.
inline int resolve_tcp_port(int configured) {
  if (configured > 0 && configured <= 65535) return configured;
  if (configured != 0) {
    throw std::invalid_argument("gpumem::nccl: rendezvous port " + std::to_string(configured) +
                                " is not in 1..65535");
  }
  const char* v = env_or_null("GPUMEM_RENDEZVOUS_PORT");
  if (v == nullptr) {
    throw std::invalid_argument(
        "gpumem::nccl: the tcp rendezvous needs a port: set GPUMEM_RENDEZVOUS_PORT (the same on "
        "every rank; a free port on MASTER_ADDR's host) or rendezvous_options::tcp_port");
  }
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n <= 0 || n > 65535) {
    throw std::invalid_argument("gpumem::nccl: GPUMEM_RENDEZVOUS_PORT=\"" + std::string(v) +
                                "\" is not a port (1..65535)");
  }
  return static_cast<int>(n);
}

/// The tcp way's token: `configured`, else GPUMEM_RENDEZVOUS_TOKEN, else derived from torchrun's
/// run id, else empty (the handshake then only keeps strangers and other protocols
/// out; it authenticates nothing). Never throws except std::bad_alloc.
inline std::string resolve_tcp_token(const std::string& configured,
                                     const elastic_environment& elastic) {
  if (!configured.empty()) return configured;
  if (const char* v = env_or_null("GPUMEM_RENDEZVOUS_TOKEN")) return v;
  if (elastic.present) return "torchelastic:" + elastic.run_id;
  return {};
}

/// The tcp_store way's keys: unique to gpumem, to the torchrun run and to the `sequence`-th
/// communicator this process starts. (An id a failed earlier attempt left in torchrun's store,
/// which outlives restarts, is told apart by the exchange itself: store_rendezvous.hpp.)
inline std::string store_key_prefix(const elastic_environment& elastic, std::uint64_t sequence) {
  return "gpumem/nccl/unique_id/" + (elastic.present ? elastic.run_id : std::string("-")) + "/" +
         std::to_string(sequence);
}

}  // namespace detail
}  // namespace gpumem::nccl
