// gpumem-replay — its standard output: text (the trace header, the detail of one configuration,
// the table of several, the summary of several traces) and JSON.
#include "output.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/detail/size_units.hpp"
#include "gpumem/detail/utf8.hpp"
#include "json_text.hpp"
#include "peer_process.hpp"

namespace gpumem_replay {

namespace {

std::string device_calls_text(const gpumem::call_counters& calls) {
  std::string out;
  for (gpumem::call_kind k : gpumem::all_call_kinds) {
    if (calls[k] == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", gpumem::cuda_call_name(k), calls[k]);
  }
  return out.empty() ? "none" : out;
}

// One line per step: its device calls, host synchronisations and stream waits (--steps).
void print_steps(const gpumem::replay_result& r) {
  for (std::size_t s = 0; s < r.steps.size(); ++s) {
    const gpumem::step_figures& f = r.steps[s];
    fmt::print(
        "  step {:>3}: {} device calls, {} host synchronisations, {} stream waits; reserved "
        "peak {}\n",
        s + 1, f.device_calls(), f.host_synchronizations(), f.stream_waits(),
        bytes(f.peak_reserved));
  }
}

// What the replay shows would have completed instead (found by trying).
void print_completes_with(const config_run& run) {
  if (run.peer || run.result.completed) return;
  if (run.completes_with.empty()) {
    fmt::print(
        "\ntried: neither a max_split_size_mb, nor expandable segments, nor stitch "
        "completes on this device\n");
    return;
  }
  fmt::print("\ntried: these complete on this device (each replayed):\n");
  for (const std::string& c : run.completes_with) {
    fmt::print("  --config \"{}\"\n", gpumem::detail::printable(c));
  }
}

// How bad a run of one input is, larger is worse: out of memory, then the highest minimum device
// (--find-min-memory), then the least headroom (the device memory the replay left unreserved),
// then the highest peak reserved.
std::tuple<bool, std::uint64_t, std::uint64_t, std::uint64_t> badness(const replayed_input& in,
                                                                      const config_run& run) {
  const gpumem::replay_result& r = run.result;
  const std::uint64_t min = run.min_searched ? run.min_device_memory.value_or(UINT64_MAX) : 0;
  const std::uint64_t headroom =
      r.completed && in.device_memory > r.peak_reserved ? in.device_memory - r.peak_reserved : 0;
  return std::make_tuple(!r.completed, min, UINT64_MAX - headroom, r.peak_reserved);
}

}  // namespace

std::string bytes(std::uint64_t b) {
  return gpumem::format_bytes(static_cast<std::size_t>(b));
}

std::string ratio(std::uint64_t a, std::uint64_t b) {
  return b == 0 ? std::string("-")
                : fmt::format("{:.3f}", static_cast<double>(a) / static_cast<double>(b));
}

void print_trace_header(const options& o, const gpumem::allocation_trace& t,
                        const gpumem::compiled_trace& c) {
  fmt::print("trace:   {} ({}{} events, {} allocations, {} stream{})\n",
             gpumem::detail::printable(o.trace_path),
             t.source.empty() ? "" : gpumem::detail::printable(t.source) + ", ", t.events.size(),
             c.allocations, c.stream_ids.size(), c.stream_ids.size() == 1 ? "" : "s");
  if (t.initial_events != 0) {
    fmt::print("         {} blocks were live before recording began; they are allocated first\n",
               t.initial_events);
  }
  if (!o.devices_with_data.empty()) {
    std::string list;
    for (int d : o.devices_with_data) list += (list.empty() ? "" : ", ") + std::to_string(d);
    fmt::print("         devices with data: {}; this is device {}{}\n", list, o.snapshot_device,
               o.devices_with_data.size() > 1 && !o.all_devices
                   ? " (--snapshot-device N or all for the others)"
                   : "");
  }
  if (o.overhead != 0) {
    fmt::print("device:  simulated, {} for the allocator ({}{} minus {} of overhead)\n",
               bytes(o.device_memory), bytes(o.device_memory + o.overhead),
               o.device_memory_source.empty() ? "" : " " + o.device_memory_source,
               bytes(o.overhead));
  } else {
    fmt::print("device:  simulated, {}{}\n", bytes(o.device_memory),
               o.device_memory_source.empty() ? "" : " " + o.device_memory_source);
  }
  if (std::find(o.configs.begin(), o.configs.end(), "recorded") != o.configs.end()) {
    fmt::print("config:  recorded = \"{}\" (the snapshot's allocator_settings: \"{}\")\n",
               gpumem::detail::printable(o.recorded_effective),
               gpumem::detail::printable(t.recorded_config));
  }
  fmt::print("program: peak requested {} (at event {})\n", bytes(c.peak_requested),
             c.peak_requested_event);
  if (c.recorded_peak_reserved) {
    fmt::print(
        "recorded: the recording allocator reserved {} at its peak ({} × requested; {} "
        "segment allocations, {} frees during the trace)\n",
        bytes(*c.recorded_peak_reserved), ratio(*c.recorded_peak_reserved, c.peak_requested),
        c.recorded_segment_allocs, c.recorded_segment_frees);
  }
  if (c.recorded_oom_event) {
    fmt::print("recorded: the recording ran out of memory after event {}\n", *c.recorded_oom_event);
  }
  fmt::print("\n");
}

void print_detail(const options& o, const config_run& run, const gpumem::compiled_trace& c) {
  const gpumem::replay_result& r = run.result;
  fmt::print("config:  \"{}\" (allocator {}, policy {})\n", gpumem::detail::printable(run.text),
             o.allocator, r.policy);
  if (r.completed) {
    if (o.steps != 0) {
      fmt::print("result:  completed, {} steps of {} events\n", o.steps, c.ops.size());
    } else {
      fmt::print("result:  completed, {} events\n", r.events_replayed);
    }
  } else {
    fmt::print("result:  OUT OF MEMORY at event {} of {}{} (a request of {})\n\n",
               *r.oom_event_index, c.ops.size(),
               o.steps != 0 ? fmt::format(", in step {}", r.oom_step + 1) : std::string(),
               bytes(r.oom_request_bytes));
    fmt::print("{}\n", r.oom_message);
    print_completes_with(run);
    if (!r.memory_summary.empty()) fmt::print("\n{}\n", r.memory_summary);
  }
  fmt::print("peaks:   requested {}, allocated {}, reserved {}; reserved / requested {}\n",
             bytes(r.peak_requested), bytes(r.peak_allocated), bytes(r.peak_reserved),
             ratio(r.peak_reserved, r.peak_requested));
  if (c.recorded_peak_reserved) {
    fmt::print(
        "         the recording allocator reserved {} at its peak: this replay holds {} × that\n",
        bytes(*c.recorded_peak_reserved), ratio(r.peak_reserved, *c.recorded_peak_reserved));
  }
  fmt::print("device:  {}\n", device_calls_text(r.calls));
  if (o.steps != 0) {
    fmt::print("steps:   {} (the trace replayed as the steps of a training loop)\n", o.steps);
    print_steps(r);
  }
  if (run.peer) {  // PyTorch's own statistics, next to the simulator's counts above
    const json& f = run.peer_fields;
    const auto figure = [&](const char* key) {
      const auto it = f.find(key);
      return it == f.end() ? std::string("?") : json_line(*it);
    };
    if (const auto peak = f.find("pytorch_reserved_peak_bytes");
        peak != f.end() && peak->is_number_unsigned()) {
      fmt::print(
          "pytorch: its own statistics: reserved peak {}, {} device allocations, {} frees, {} "
          "retries, {} out-of-memory\n",
          bytes(peak->get<std::uint64_t>()), figure("pytorch_num_device_alloc"),
          figure("pytorch_num_device_free"), figure("pytorch_num_alloc_retries"),
          figure("pytorch_num_ooms"));
    }
  }
  if (o.costs && !run.peer) {
    fmt::print("         {:.3f} ms of simulated time in device calls (typical per-call costs)\n",
               r.simulated_seconds * 1e3);
  }
  if (run.min_searched) {
    if (run.min_device_memory) {
      fmt::print("minimum: completes on {} ({} × peak requested)\n", bytes(*run.min_device_memory),
                 ratio(*run.min_device_memory, c.peak_requested));
    } else {
      fmt::print("minimum: does not complete even on {}\n", bytes(o.min_memory_limit));
    }
  }
  if (run.peer && r.events_per_second() < 1e5) {
    fmt::print("replay:  {} events in {:.1f} ms ({:.1f} k events/s, in {})\n", r.events_replayed,
               r.wall_seconds * 1e3, r.events_per_second() / 1e3, peer_name);
  } else {
    fmt::print("replay:  {} events in {:.1f} ms ({:.1f} M events/s)\n", r.events_replayed,
               r.wall_seconds * 1e3, r.events_per_second() / 1e6);
  }
}

void print_table(const options& o, const std::vector<config_run>& runs,
                 const gpumem::compiled_trace& c) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"config", "policy", "result", "peak requested", "peak allocated", "peak reserved",
                  "reserved/requested", "device allocs", "device frees"});
  if (o.costs) rows.front().push_back("device time");
  if (o.find_min_memory) rows.front().push_back("min device memory");
  rows.front().push_back("events/s");
  for (const config_run& run : runs) {
    const gpumem::replay_result& r = run.result;
    std::vector<std::string> row = {
        run.text.empty() ? "(default)" : gpumem::detail::printable(run.text),
        r.policy,
        r.completed ? "completed"
        : o.steps != 0
            ? fmt::format("OOM at event {} of step {}", *r.oom_event_index, r.oom_step + 1)
            : fmt::format("OOM at event {}", *r.oom_event_index),
        bytes(r.peak_requested),
        bytes(r.peak_allocated),
        bytes(r.peak_reserved),
        ratio(r.peak_reserved, r.peak_requested),
        std::to_string(r.device_alloc_calls()),
        std::to_string(r.device_free_calls())};
    if (o.costs) {
      row.push_back(run.peer ? std::string("-")
                             : fmt::format("{:.2f} ms", r.simulated_seconds * 1e3));
    }
    if (o.find_min_memory) {
      row.push_back(run.min_device_memory ? bytes(*run.min_device_memory)
                                          : "> " + bytes(o.min_memory_limit));
    }
    const double rate = r.events_per_second();
    row.push_back(run.peer && rate < 1e5 ? fmt::format("{:.1f}k", rate / 1e3)
                                         : fmt::format("{:.1f}M", rate / 1e6));
    rows.push_back(std::move(row));
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (std::size_t i = 0; i < rows[r].size(); ++i) {
      if (i != 0) line += "  ";
      line += i < 3 ? fmt::format("{:<{}}", rows[r][i], width[i])
                    : fmt::format("{:>{}}", rows[r][i], width[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
  }
  (void)c;
  if (o.steps != 0) {
    for (const config_run& run : runs) {
      fmt::print("\n--- \"{}\", {} steps ---\n", gpumem::detail::printable(run.text), o.steps);
      print_steps(run.result);
    }
  }
  for (const config_run& run : runs) {
    if (run.result.completed) continue;
    fmt::print("\n--- \"{}\" ran out of memory at event {} ---\n{}\n",
               gpumem::detail::printable(run.text), *run.result.oom_event_index,
               run.result.oom_message);
    print_completes_with(run);
    if (o.verbose && !run.result.memory_summary.empty()) {
      fmt::print("\n{}\n", run.result.memory_summary);
    }
  }
}

namespace {

// `x` as printed with `decimals` decimals: the records carry rounded figures, so that two
// versions of the tool compare equal.
double rounded(double x, int decimals) {
  return std::strtod(fmt::format("{:.{}f}", x, decimals).c_str(), nullptr);
}

json optional_number(const std::optional<std::size_t>& v) {
  return v ? json(*v) : json(nullptr);
}

json record_of(const options& o, const config_run& run, const gpumem::compiled_trace& c,
               const gpumem::allocation_trace& t) {
  const gpumem::replay_result& r = run.result;
  json j;
  j["config"] = run.text;
  j["allocator"] = o.allocator;
  j["policy"] = r.policy;
  j["trace"] = o.trace_path;
  if (t.source == "pytorch-snapshot") j["snapshot_device"] = o.snapshot_device;
  j["device_memory_bytes"] = o.device_memory;
  j["completed"] = r.completed;
  j["oom_event_index"] = optional_number(r.oom_event_index);
  j["recorded_oom_event"] = optional_number(c.recorded_oom_event);
  j["oom_message"] = r.completed ? json(nullptr) : json(r.oom_message);
  j["events"] = c.ops.size();
  j["events_replayed"] = r.events_replayed;
  j["peak_requested_bytes"] = r.peak_requested;
  j["peak_allocated_bytes"] = r.peak_allocated;
  j["peak_reserved_bytes"] = r.peak_reserved;
  j["reserved_over_requested"] =
      r.peak_requested == 0
          ? json(nullptr)
          : json(rounded(
                static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_requested), 6));
  j["recorded_peak_reserved_bytes"] = optional_number(c.recorded_peak_reserved);
  j["recorded_initial_reserved_bytes"] = optional_number(t.recorded_initial_reserved);
  j["recorded_segment_allocs"] = c.recorded_segment_allocs;
  j["recorded_segment_frees"] = c.recorded_segment_frees;
  j["initial_events"] = c.initial_events;
  j["device_alloc_calls"] = r.device_alloc_calls();
  j["device_free_calls"] = r.device_free_calls();
  j["device_calls"] = r.calls.total();
  if (run.peer) {
    // (the peer's record carries its own counts)
  } else if (o.steps == 0) {
    j["host_synchronizations"] = r.calls.host_synchronizations();
  } else {
    auto per_step = [&](auto figure) {
      json list = json::array();
      for (const gpumem::step_figures& f : r.steps) list.push_back(figure(f));
      return list;
    };
    j["steps"] = o.steps;
    j["oom_step"] = r.completed ? json(nullptr) : json(r.oom_step + 1);
    j["device_calls_per_step"] =
        per_step([](const gpumem::step_figures& f) { return f.device_calls(); });
    j["host_synchronizations_per_step"] =
        per_step([](const gpumem::step_figures& f) { return f.host_synchronizations(); });
    j["stream_waits_per_step"] =
        per_step([](const gpumem::step_figures& f) { return f.stream_waits(); });
  }
  j["simulated_device_seconds"] = run.peer ? json(nullptr) : json(rounded(r.simulated_seconds, 9));
  j["replay_seconds"] = rounded(r.wall_seconds, 6);
  j["events_per_second"] = std::llround(r.events_per_second());
  if (o.find_min_memory) j["min_device_memory_bytes"] = optional_number(run.min_device_memory);
  if (run.text == "recorded") j["recorded_config"] = run.effective;
  if (!run.peer) j["completes_with"] = run.completes_with;
  // What only a peer reports (its own statistics, the simulator's counts by call).
  for (auto it = run.peer_fields.begin(); it != run.peer_fields.end(); ++it) {
    if (!j.contains(it.key())) j[it.key()] = it.value();
  }
  return j;
}

}  // namespace

std::vector<json> json_records(const options& o, const std::vector<config_run>& runs,
                               const gpumem::compiled_trace& c, const gpumem::allocation_trace& t) {
  std::vector<json> records;
  for (const config_run& run : runs) records.push_back(record_of(o, run, c, t));
  return records;
}

void print_json_array(const std::vector<json>& records) {
  fmt::print("[\n");
  for (std::size_t i = 0; i < records.size(); ++i) {
    fmt::print("  {}{}\n", json_line(records[i]), i + 1 < records.size() ? "," : "");
  }
  fmt::print("]\n");
}

void print_summary(const options& o, std::vector<replayed_input> inputs, std::size_t given) {
  auto worst_run = [](const replayed_input& in) {
    auto worst = badness(in, in.runs.front());
    for (const config_run& run : in.runs) worst = std::max(worst, badness(in, run));
    return worst;
  };
  std::stable_sort(inputs.begin(), inputs.end(),
                   [&](const replayed_input& a, const replayed_input& b) {
                     return worst_run(a) > worst_run(b);
                   });
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"trace", "config", "result", "recorded", "peak requested", "peak reserved",
                  "reserved/requested", "headroom"});
  if (o.find_min_memory) rows.front().push_back("min device memory");
  for (const replayed_input& in : inputs) {
    for (const config_run& run : in.runs) {
      const gpumem::replay_result& r = run.result;
      std::vector<std::string> row = {
          gpumem::detail::printable(in.label),
          run.text.empty() ? "(default)" : gpumem::detail::printable(run.text),
          r.completed ? "completed" : fmt::format("OOM at event {}", *r.oom_event_index),
          in.recorded_oom_event ? fmt::format("OOM at event {}", *in.recorded_oom_event) : "-",
          bytes(r.peak_requested),
          bytes(r.peak_reserved),
          ratio(r.peak_reserved, r.peak_requested),
          r.completed && in.device_memory >= r.peak_reserved
              ? bytes(in.device_memory - r.peak_reserved)
              : "-"};
      if (o.find_min_memory) {
        row.push_back(run.min_device_memory ? bytes(*run.min_device_memory)
                                            : "> " + bytes(o.min_memory_limit));
      }
      rows.push_back(std::move(row));
    }
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  fmt::print("\n=== {} traces, worst first ===\n", given);
  if (inputs.size() < given) {
    fmt::print("({} could not be replayed: see the messages above)\n", given - inputs.size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (i != 0) line += "  ";
      line +=
          i < 4 ? fmt::format("{:<{}}", row[i], width[i]) : fmt::format("{:>{}}", row[i], width[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
  }
  // The worst input per configuration (configurations in the worst input's order).
  const std::size_t configs = inputs.empty() ? 0 : inputs.front().runs.size();
  for (std::size_t k = 0; k < configs; ++k) {
    std::size_t worst = 0;
    for (std::size_t i = 1; i < inputs.size(); ++i) {
      if (inputs[i].runs.size() == configs &&
          badness(inputs[i], inputs[i].runs[k]) > badness(inputs[worst], inputs[worst].runs[k])) {
        worst = i;
      }
    }
    const config_run& run = inputs[worst].runs[k];
    std::string why = run.result.completed
                          ? fmt::format("peak reserved {}", bytes(run.result.peak_reserved))
                          : fmt::format("out of memory at event {}", *run.result.oom_event_index);
    if (!run.result.completed && inputs[worst].recorded_oom_event == run.result.oom_event_index) {
      why += ", as recorded";
    }
    if (run.min_searched && run.min_device_memory) {
      why += fmt::format(", needs {}", bytes(*run.min_device_memory));
    }
    fmt::print("worst for \"{}\": {} ({})\n",
               run.text.empty() ? "(default)" : gpumem::detail::printable(run.text),
               gpumem::detail::printable(inputs[worst].label), why);
  }
}

}  // namespace gpumem_replay
