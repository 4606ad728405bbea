// The steady state of a training loop: each trace replayed as twelve steps in a row (what is live
// at the end of a step is freed, as a training loop frees its last step's tensors) on an 80 GiB
// simulated device, under classic, expandable and stitch. Prints a Markdown table.
//
//   gpumem_bench_stitch_steps [--steps N] [--stitch-config KEYS] [--breakdown] TRACE...
//
// --breakdown prints, instead, where step 1's simulated driver time goes: per policy, the calls of
// each kind that the cost model charges and their fixed cost (calls × the kind's per-call cost),
// then the per-byte part of creating, mapping and allocating memory, and the total.
// --stitch-config adds configuration keys to stitch's (e.g. stitch_settle_limit:0.01) to measure
// its thresholds (bench/README.md, "Stitch in the steady state").
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <string>
#include <vector>

#include "command_line.hpp"
#include "gpumem/trace/replay.hpp"
#include "gpumem/trace/trace_io.hpp"

int main(int argc, char** argv) {
  std::size_t steps = 12;
  std::string stitch_config;
  bool breakdown = false;
  std::vector<std::string> paths;
  gpumem_tools::command_line cl(argc, argv, "gpumem_bench_stitch_steps");
  while (cl.next()) {
    if (cl.is("--help") || cl.is("-h")) {
      cl.no_value();
      std::printf(
          "usage: gpumem_bench_stitch_steps [--steps N>=4] [--stitch-config KEYS] [--breakdown] "
          "TRACE...\n");
      return 0;
    } else if (cl.is("--steps")) {
      steps = static_cast<std::size_t>(cl.unsigned_value(1000000));
      if (steps < 4) cl.fail("--steps must be at least 4");
    } else if (cl.is("--stitch-config")) {
      stitch_config = "," + cl.value();
    } else if (cl.is("--breakdown")) {
      cl.no_value();
      breakdown = true;
    } else if (cl.positional()) {
      paths.push_back(cl.arg());
    } else {
      cl.unknown();
    }
  }
  if (paths.empty()) cl.fail("no TRACE given");
  const gpumem::cost_model costs = gpumem::replay_options{}.costs;
  // The kinds a first step spends its time in, in the order printed.
  constexpr gpumem::call_kind kinds[] = {
      gpumem::call_kind::malloc,          gpumem::call_kind::free,
      gpumem::call_kind::address_reserve, gpumem::call_kind::mem_create,
      gpumem::call_kind::mem_map,         gpumem::call_kind::set_access,
      gpumem::call_kind::mem_unmap,       gpumem::call_kind::mem_release};
  if (breakdown) {
    std::printf("| trace | policy |");
    for (gpumem::call_kind k : kinds) {
      std::printf(" %s |", std::string(gpumem::call_kind_name(k)).c_str());
    }
    std::printf(" other calls | per byte | step 1: simulated time |\n| --- | --- |");
    for (std::size_t i = 0; i < std::size(kinds) + 3; ++i) std::printf(" ---: |");
    std::printf("\n");
  } else {
    std::printf(
        "| trace | policy | reserved ÷ peak requested, step 1 | after %zu steps | last step with "
        "device calls | device calls, last 3 steps | host waits, last 3 steps | stream waits, "
        "last 3 steps | step 1: device calls | step 1: simulated time |\n"
        "| --- | --- | ---: | ---: | ---: | --- | --- | --- | ---: | ---: |\n",
        steps);
  }
  try {
    for (const std::string& path : paths) {
      const gpumem::compiled_trace trace = gpumem::compile_trace(gpumem::read_trace(path));
      const std::string name = path.substr(path.find_last_of('/') + 1);
      for (const char* policy : {"classic", "expandable", "stitch"}) {
        gpumem::replay_options o;
        o.config = gpumem::allocator_config::parse(
            std::string("policy:") + policy +
            (std::strcmp(policy, "stitch") == 0 ? stitch_config : std::string()));
        o.steps = steps;
        const gpumem::replay_result r = gpumem::replay_trace(trace, o);
        if (!r.completed) {
          std::printf("| %s | %s | out of memory in step %zu |\n", name.c_str(), policy,
                      r.oom_step + 1);
          continue;
        }
        if (breakdown) {
          const gpumem::step_figures& first = r.steps.front();
          std::printf("| %s | %s |", name.c_str(), policy);
          double fixed = 0;
          for (gpumem::call_kind k : kinds) {
            const double ms = static_cast<double>(first.calls[k]) * costs.seconds(k) * 1e3;
            fixed += ms;
            std::printf(" %zu: %.2f ms |", first.calls[k], ms);
          }
          double other = 0;
          for (gpumem::call_kind k : gpumem::all_call_kinds) {
            if (std::find(std::begin(kinds), std::end(kinds), k) == std::end(kinds)) {
              other += static_cast<double>(first.calls[k]) * costs.seconds(k) * 1e3;
            }
          }
          const double total = first.simulated_seconds * 1e3;
          std::printf(" %.2f ms | %.2f ms | %.2f ms |\n", other, total - fixed - other, total);
          continue;
        }
        const auto peak = static_cast<double>(r.peak_requested);
        std::size_t last_with_calls = 0;
        for (std::size_t s = 0; s < r.steps.size(); ++s) {
          if (r.steps[s].device_calls() > 0) last_with_calls = s + 1;
        }
        auto last3 = [&](auto figure) {
          std::string text;
          for (std::size_t s = r.steps.size() - 3; s < r.steps.size(); ++s) {
            text += (text.empty() ? "" : ", ") + std::to_string(figure(r.steps[s]));
          }
          return text;
        };
        std::printf(
            "| %s | %s | %.4f | %.4f | %zu | %s | %s | %s | %zu | %.2f ms |\n", name.c_str(),
            policy, static_cast<double>(r.steps.front().peak_reserved) / peak,
            static_cast<double>(r.peak_reserved) / peak, last_with_calls,
            last3([](const gpumem::step_figures& f) { return f.device_calls(); }).c_str(),
            last3([](const gpumem::step_figures& f) { return f.host_synchronizations(); }).c_str(),
            last3([](const gpumem::step_figures& f) { return f.stream_waits(); }).c_str(),
            r.steps.front().device_calls(), r.steps.front().simulated_seconds * 1e3);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem_bench_stitch_steps: %s\n", e.what());
    return 1;
  }
  return 0;
}
