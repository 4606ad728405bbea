// gpumem-replay — one configuration replayed on gpumem's own allocator, in this process.
#pragma once

#include "config_run.hpp"
#include "gpumem/trace/replay.hpp"
#include "options.hpp"

namespace gpumem_replay {

/// Replays `compiled` under run.config: fills run.result, and when it runs out of memory the
/// configurations close to it that would complete (run.completes_with); with --find-min-memory
/// the smallest device on which it completes. A progress bar on stderr as --progress says.
void run_gpumem(const options& o, config_run& run, const gpumem::compiled_trace& compiled);

}  // namespace gpumem_replay
