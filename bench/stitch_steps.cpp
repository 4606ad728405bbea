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
#include <unordered_map>
#include <vector>

#include "gpumem/gpumem.hpp"
// clang-format off
#include "gpumem/device/simulated_device.hpp"
// clang-format on
#include "gpumem/trace/trace_io.hpp"

namespace {

using allocator = gpumem::caching_allocator<gpumem::simulated_device>;

/// One step: the trace's allocations and frees (free_completed where it has them, else
/// free_requested), then whatever is still live is freed.
void run_step(const gpumem::allocation_trace& trace, allocator& a) {
  bool has_completed = false;
  for (const auto& e : trace.events) {
    has_completed = has_completed || e.kind == gpumem::trace_event_kind::free_completed;
  }
  const auto free_kind = has_completed ? gpumem::trace_event_kind::free_completed
                                       : gpumem::trace_event_kind::free_requested;
  std::unordered_map<std::uint64_t, void*> live;
  for (const auto& e : trace.events) {
    if (e.kind == gpumem::trace_event_kind::alloc) {
      auto it = live.find(e.address);
      if (it != live.end()) a.deallocate(it->second);
      live[e.address] = a.allocate(static_cast<std::size_t>(e.size));
    } else if (e.kind == free_kind) {
      auto it = live.find(e.address);
      if (it == live.end()) continue;
      a.deallocate(it->second);
      live.erase(it);
    }
  }
  for (auto& [address, p] : live) a.deallocate(p);
}

std::size_t memory_calls(const gpumem::call_counters& c) {
  return c.mem_create + c.mem_release + c.mem_map + c.mem_unmap + c.set_access + c.address_reserve +
         c.address_free + c.event_synchronize + c.device_synchronize;
}

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
      for (int s = 1; s <= steps; ++s) {
        const std::size_t before = memory_calls(dev.counters());
        run_step(trace, a);
        calls.push_back(memory_calls(dev.counters()) - before);
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
