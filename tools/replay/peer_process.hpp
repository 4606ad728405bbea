// gpumem-replay — --allocator pytorch|cub: the replays run by gpumem-replay-peer, one child
// process per replay, and what they print read back as a config_run.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "config_run.hpp"
#include "gpumem/trace/replay.hpp"
#include "options.hpp"

namespace gpumem_replay {

inline constexpr std::string_view peer_name = "gpumem-replay-peer";

/// gpumem-replay-peer next to this executable (GPUMEM_REPLAY_PEER overrides the path).
std::string peer_path();

/// Checks that gpumem-replay-peer is there and has the allocator built in (exits 2 otherwise).
void check_peer(const options& o, const std::string& path);

/// One replay by the peer: fills run.result and run.peer_fields. Throws when the peer failed.
void run_peer(const options& o, const std::string& path, std::size_t device_memory,
              config_run& run);

/// The smallest device (to 1 MiB) on which the peer's replay completes; the search of
/// gpumem::find_min_device_memory, one child process per probe.
std::optional<std::size_t> find_min_memory_peer(const options& o, const std::string& path,
                                                const config_run& run,
                                                const gpumem::compiled_trace& c);

}  // namespace gpumem_replay
