// gpumem-replay — its command line: the options it takes, their parsing and --help.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "command_line.hpp"
#include "gpumem/config.hpp"

namespace gpumem_replay {

inline constexpr std::string_view tool_name = "gpumem-replay";

/// "gpumem-replay: message (see --help)" on stderr, exit status 2: a bad command line (or a
/// setting found bad once the trace is read).
[[noreturn]] inline void usage_error(const std::string& message) {
  gpumem_tools::usage_error(std::string(tool_name), message);
}

enum class progress_mode { automatic, always, never };

struct options {
  std::string trace_path;                // the one being replayed
  std::vector<std::string> trace_paths;  // as given (several: one replay each, then a summary)
  bool all_devices = false;              // --snapshot-device all
  std::vector<int> devices_with_data;    // of a PyTorch snapshot, for the header
  std::string allocator = "gpumem";      // gpumem, pytorch or cub
  // The memory the allocator may use: --device-memory (or the recording's, or 80 GiB) minus
  // --overhead, once run() has read the trace.
  std::size_t device_memory = std::size_t{80} << 30;
  bool device_memory_given = false;
  std::size_t overhead = 0;          // --overhead: what the allocator does not see
  std::string device_memory_source;  // where the size came from, for the header
  std::vector<std::string> configs;  // as given, in order ("recorded": the snapshot's settings)
  // The same, parsed (--allocator gpumem); "recorded" is resolved once the trace is read.
  std::vector<gpumem::allocator_config> parsed_configs;
  bool config_given = false;  // --config or --compare with configurations
  bool compare = false;
  bool compare_defaulted = false;  // --compare alone
  bool find_min_memory = false;
  std::size_t steps = 0;  // --steps N: replay as N training steps (0: once, no step figures)
  std::size_t min_memory_limit = std::size_t{1} << 40;
  std::string plot_path;
  std::string convert_path;
  std::string export_path;
  std::string timeline_path;       // --timeline FILE.csv|FILE.json
  std::string recorded_effective;  // what "recorded" stands for, once the trace is read
  bool json = false;
  bool verbose = false;
  bool costs = true;
  int snapshot_device = 0;
  bool snapshot_device_given = false;  // else a snapshot with one device's data replays that one
  progress_mode progress = progress_mode::automatic;
};

/// The options of `argv`; exits 0 after --help or --version, 2 (usage_error) when they are bad.
options parse_command_line(int argc, char** argv);

/// What --config recorded stands for: the snapshot's settings on the classic policy (PyTorch's
/// own allocator; expandable when they set expandable_segments:True). Exits 2 when gpumem cannot
/// run them.
gpumem::allocator_config recorded_config(const std::string& settings);

}  // namespace gpumem_replay
