// gpumem-replay — what one configuration's replay gave (config_run) and one input's replays
// (replayed_input): filled in by the replays, read by the output.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "gpumem/config.hpp"
#include "gpumem/trace/replay.hpp"
#include "json_text.hpp"

namespace gpumem_replay {

struct config_run {
  std::string text;       // as given
  std::string effective;  // what runs: text, or for "recorded" the settings it stands for
  gpumem::allocator_config config;
  gpumem::replay_result result;
  std::optional<std::size_t> min_device_memory;
  bool min_searched = false;
  /// A peer's replay (--allocator pytorch|cub): no simulated time; the record it printed (a JSON
  /// object, keys in its order), whose fields --json carries too.
  bool peer = false;
  json peer_fields = json::object();
  /// Out of memory: configurations close to this one that the replay shows would complete
  /// (max_split_size_mb found by trying, expandable segments, stitch).
  std::vector<std::string> completes_with;
};

/// One input of several, replayed: what the summary table shows of it.
struct replayed_input {
  std::string label;
  std::vector<config_run> runs;
  std::size_t device_memory = 0;                  // what the allocator had
  std::optional<std::size_t> recorded_oom_event;  // the recording ran out of memory there
};

}  // namespace gpumem_replay
