// Stitch in the steady state: each trace replayed as one training step after another on an 80 GiB
// simulated device, with the device calls of every step. Prints a Markdown table.
//
//   gpumem_bench_stitch_steps [--steps=N] TRACE...      (bench/README.md, "Stitch in the steady
//   state")
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "gpumem/gpumem.hpp"
// clang-format off
#include "gpumem/device/simulated_device.hpp"
// clang-format on
#include "gpumem/trace/replay.hpp"
#include "gpumem/trace/trace_io.hpp"

namespace {

using allocator = gpumem::caching_allocator<gpumem::simulated_device>;

}  // namespace

int main(int argc, char** argv) {
  int steps = 12;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--steps=", 8) == 0) {
      steps = std::atoi(argv[i] + 8);
    } else {
      paths.emplace_back(argv[i]);
    }
  }
  if (paths.empty() || steps < 2) {
    std::fprintf(stderr, "usage: gpumem_bench_stitch_steps [--steps=N>=2] TRACE...\n");
    return 2;
  }
  std::printf(
      "| trace | reserved ÷ peak requested, step 1 | after %d steps | last step with device calls "
      "| device calls in each of the last 3 steps |\n| --- | --- | --- | --- | --- |\n",
      steps);
  try {
    for (const std::string& path : paths) {
      const auto trace = gpumem::read_trace(path);
      gpumem::simulated_device dev{std::size_t{80} << 30};
      allocator a(dev, gpumem::allocator_config::parse("policy:stitch"));
      double first = 0;
      int last_with_calls = 0;
      std::vector<std::size_t> calls;
      gpumem::step_replayer step(trace);
      for (int s = 1; s <= steps; ++s) {
        const std::size_t before = dev.counters().memory_calls();
        step.run(a);
        calls.push_back(dev.counters().memory_calls() - before);
        if (calls.back() > 0) last_with_calls = s;
        const auto st = a.stats();
        const double ratio = static_cast<double>(st.reserved_bytes[0].peak) /
                             static_cast<double>(st.requested_bytes[0].peak);
        if (s == 1) first = ratio;
        if (s == steps) {
          const std::string name = path.substr(path.find_last_of('/') + 1);
          std::printf("| %s | %.4f | %.4f | %d | %zu, %zu, %zu |\n", name.c_str(), first, ratio,
                      last_with_calls, calls[calls.size() - 3], calls[calls.size() - 2],
                      calls.back());
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem_bench_stitch_steps: %s\n", e.what());
    return 1;
  }
  return 0;
}
