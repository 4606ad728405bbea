// gpumem-replay — one configuration replayed on gpumem's own allocator: the replay, what would
// have completed instead, the smallest device, and the progress bar they draw.
#include "gpumem_run.hpp"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gpumem/config.hpp"

namespace gpumem_replay {

namespace {

/// A one-line bar on stderr, drawn only once a replay has run for a second (or always).
class progress_bar {
 public:
  progress_bar(progress_mode mode, std::string label)
      : enabled_(mode == progress_mode::always ||
                 (mode == progress_mode::automatic && ::isatty(STDERR_FILENO) == 1)),
        always_(mode == progress_mode::always),
        label_(std::move(label)) {}
  ~progress_bar() {
    if (drawn_) std::fprintf(stderr, "\r%*s\r", 79, "");
  }
  progress_bar(const progress_bar&) = delete;
  progress_bar& operator=(const progress_bar&) = delete;

  void operator()(std::size_t done, std::size_t total) {
    if (!enabled_) return;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (!always_ && elapsed < 1.0) return;
    constexpr int width = 30;
    const double fraction =
        total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
    const int filled = static_cast<int>(fraction * width);
    const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed / 1e6 : 0.0;
    std::fprintf(stderr, "\r%-22.22s [%s%s] %3d%% %zu/%zu events %.1fM/s", label_.c_str(),
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - filled), '.').c_str(),
                 static_cast<int>(fraction * 100), done, total, rate);
    std::fflush(stderr);
    drawn_ = true;
  }

 private:
  bool enabled_;
  bool always_;
  std::string label_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// The configurations close to `run`'s that complete where it ran out of memory, found by
/// replaying: its own with the largest max_split_size_mb that completes (classic, when unset),
/// then with the expandable and the stitch policy. As configuration strings.
std::vector<std::string> find_completing(const options& o, const config_run& run,
                                         const gpumem::compiled_trace& c) {
  std::vector<std::string> found;
  auto completes = [&](const gpumem::allocator_config& cfg) {
    gpumem::replay_options ro;
    ro.device_memory = o.device_memory;
    ro.config = cfg;
    ro.steps = std::max<std::size_t>(o.steps, 1);
    if (!o.costs) ro.costs = gpumem::cost_model{};
    return gpumem::replay_trace(c, ro).completed;
  };
  const gpumem::allocator_config& base = run.config;
  const bool classic = run.result.policy == "classic";
  if (classic && base.max_split_size == std::numeric_limits<std::size_t>::max()) {
    for (std::size_t mb : {1024, 512, 256, 128, 64, 32, 21}) {
      gpumem::allocator_config cfg = base;
      cfg.max_split_size = mb << 20;
      if (completes(cfg)) {
        found.push_back(cfg.to_string());
        break;
      }
    }
  }
  for (const auto policy :
       {gpumem::allocator_policy::expandable, gpumem::allocator_policy::stitch}) {
    if (run.result.policy == gpumem::to_string(policy)) continue;
    gpumem::allocator_config cfg = base;
    cfg.policy = policy;
    if (completes(cfg)) found.push_back(cfg.to_string());
  }
  return found;
}

}  // namespace

void run_gpumem(const options& o, config_run& run, const gpumem::compiled_trace& compiled) {
  gpumem::replay_options ro;
  ro.device_memory = o.device_memory;
  ro.config = run.config;
  if (!o.costs) ro.costs = gpumem::cost_model{};
  ro.record_samples = !o.plot_path.empty() || !o.timeline_path.empty();
  ro.steps = std::max<std::size_t>(o.steps, 1);
  progress_bar bar(o.progress, run.text.empty() ? "(default)" : run.text);
  ro.progress = [&bar](std::size_t done, std::size_t total) { bar(done, total); };
  run.result = gpumem::replay_trace(compiled, ro);
  if (!run.result.completed) run.completes_with = find_completing(o, run, compiled);
  if (o.find_min_memory) {
    run.min_searched = true;
    progress_bar search_bar(o.progress, "min memory " + run.text);
    std::size_t probes = 0;
    run.min_device_memory =
        gpumem::find_min_device_memory(compiled, ro, o.min_memory_limit, std::size_t{1} << 20,
                                       [&](std::size_t, bool) { search_bar(++probes, 40); });
  }
}

}  // namespace gpumem_replay
