// gpumem-replay — replays an allocation trace on a simulated GPU: does it run out of memory,
// where and why, how much memory each allocator configuration holds, and the smallest device on
// which it completes. Reads gpumem traces, PyTorch memory snapshots and RMM memory event logs.
//
// Exit status: 0 when the replays ran (whether or not they ran out of memory), 1 when a trace
// could not be read or a replay failed, 2 for a bad command line.
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "gpumem/config.hpp"
#include "gpumem/detail/size_units.hpp"
#include "gpumem/error.hpp"
#include "gpumem/report/memory_plot.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/pytorch_snapshot.hpp"
#include "gpumem/trace/replay.hpp"
#include "gpumem/trace/rmm_csv.hpp"
#include "gpumem/trace/trace_io.hpp"

#ifndef GPUMEM_VERSION
#define GPUMEM_VERSION "unknown"
#endif

namespace {

constexpr std::string_view default_compare[] = {"policy:classic", "policy:expandable",
                                                "policy:stitch"};

enum class progress_mode { automatic, always, never };

struct options {
  std::string trace_path;
  std::size_t device_memory = std::size_t{80} << 30;
  bool device_memory_given = false;
  std::vector<std::string> configs;  // as given, in order
  bool compare = false;
  bool find_min_memory = false;
  std::size_t min_memory_limit = std::size_t{1} << 40;
  std::string plot_path;
  std::string convert_path;
  std::string export_path;
  bool json = false;
  bool verbose = false;
  bool costs = true;
  int snapshot_device = 0;
  progress_mode progress = progress_mode::automatic;
};

void print_help() {
  std::printf(
      "usage: gpumem-replay TRACE [options]\n"
      "\n"
      "Replays an allocation trace on a simulated GPU under gpumem's caching allocator and tells\n"
      "whether it runs out of memory, where and why, and how much memory it holds. TRACE is a\n"
      "gpumem trace, a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) or an RMM\n"
      "memory event log (logging_resource_adaptor CSV); the format is recognised by its content.\n"
      "\n"
      "options:\n"
      "  --device-memory SIZE    simulated device size, e.g. 80GiB, 24GiB, 1536MiB (default\n"
      "                          80GiB; binary units: K/KiB, M/MiB, G/GiB, T/TiB)\n"
      "  --config CONFIG         the allocator configuration, PYTORCH_CUDA_ALLOC_CONF syntax plus\n"
      "                          gpumem's policy key, e.g. "
      "\"policy:classic,max_split_size_mb:128\"\n"
      "                          or \"expandable_segments:True\" (default: \"\", gpumem's default\n"
      "                          policy, stitch). The environment is not read\n"
      "  --compare [CONFIG...]   replay under several configurations, one row each (default:\n"
      "                          policy:classic policy:expandable policy:stitch)\n"
      "  --find-min-memory       also find, per configuration, the smallest device on which the\n"
      "                          trace completes (to 1 MiB; one replay per probe)\n"
      "  --plot FILE.svg         draw memory over time per configuration and the segments at the\n"
      "                          peak (or at the out-of-memory) as an SVG image\n"
      "  --json                  print a JSON array, one object per configuration\n"
      "  --convert FILE          write the trace as a gpumem trace (or, for FILE.csv, as an RMM\n"
      "                          log) and exit\n"
      "  --export-snapshot FILE  write the allocator's segments at the end (or at the\n"
      "                          out-of-memory) and the replayed events, under the first\n"
      "                          configuration, as a PyTorch memory snapshot pickle: open it at\n"
      "                          https://pytorch.org/memory_viz\n"
      "  --snapshot-device N     the device of a PyTorch snapshot to replay (default 0)\n"
      "  --no-costs              charge no simulated time for device calls (default: typical\n"
      "                          figures for a datacenter GPU, see cost_model::typical)\n"
      "  --progress auto|always|never\n"
      "                          progress bar on stderr (auto: on a terminal, for replays longer\n"
      "                          than a second)\n"
      "  --verbose               print memory_summary() at an out-of-memory in --compare mode too\n"
      "  --version               print the version and exit\n"
      "  -h, --help              show this help and exit\n"
      "\n"
      "examples:\n"
      "  gpumem-replay snapshot.pickle --device-memory 24GiB\n"
      "  gpumem-replay run.trace --device-memory 16GiB --compare policy:classic policy:stitch \\\n"
      "      --plot memory.svg\n"
      "  gpumem-replay run.trace --compare --find-min-memory --json\n"
      "\n"
      "Exit status: 0 when the replays ran (out of memory included), 1 when the trace could not\n"
      "be read or a replay failed, 2 for a bad command line.\n");
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "gpumem-replay: %s (see --help)\n", message.c_str());
  std::exit(2);
}

options parse_command_line(int argc, char** argv) {
  options o;
  bool config_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      const auto eq = arg.find('=');
      if (eq != std::string::npos) {
        inline_value = arg.substr(eq + 1);
        arg.resize(eq);
      }
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", arg));
      return argv[++i];
    };
    auto no_value = [&]() {
      if (inline_value) usage_error(fmt::format("{} takes no value", arg));
    };
    if (arg == "-h" || arg == "--help") {
      print_help();
      std::exit(0);
    } else if (arg == "--version") {
      std::printf("gpumem-replay %s\n", GPUMEM_VERSION);
      std::exit(0);
    } else if (arg == "--device-memory") {
      const std::string v = value();
      try {
        o.device_memory = gpumem::parse_size(v);
      } catch (const std::invalid_argument& e) {
        usage_error(fmt::format("--device-memory: {}", e.what()));
      }
      if (o.device_memory == 0) usage_error("--device-memory must be more than 0 bytes");
      if (o.device_memory > (std::size_t{1} << 50)) {
        usage_error("--device-memory above 1 PiB is not supported");
      }
      o.device_memory_given = true;
    } else if (arg == "--config") {
      if (config_given || o.compare) usage_error("give one --config, or --compare with several");
      o.configs.push_back(value());
      config_given = true;
    } else if (arg == "--compare") {
      if (config_given) usage_error("give one --config, or --compare with several");
      if (inline_value) o.configs.push_back(*inline_value);
      o.compare = true;
      while (i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) != 0) {
        o.configs.emplace_back(argv[++i]);
      }
    } else if (arg == "--find-min-memory") {
      no_value();
      o.find_min_memory = true;
    } else if (arg == "--plot") {
      o.plot_path = value();
      if (o.plot_path.empty()) usage_error("--plot needs a file name");
    } else if (arg == "--convert") {
      o.convert_path = value();
      if (o.convert_path.empty()) usage_error("--convert needs a file name");
    } else if (arg == "--export-snapshot") {
      o.export_path = value();
      if (o.export_path.empty()) usage_error("--export-snapshot needs a file name");
    } else if (arg == "--json") {
      no_value();
      o.json = true;
    } else if (arg == "--verbose") {
      no_value();
      o.verbose = true;
    } else if (arg == "--no-costs") {
      no_value();
      o.costs = false;
    } else if (arg == "--snapshot-device") {
      const std::string v = value();
      if (v.empty() || v.size() > 4 || v.find_first_not_of("0123456789") != std::string::npos) {
        usage_error(fmt::format("--snapshot-device needs a device number, got \"{}\"", v));
      }
      o.snapshot_device = std::stoi(v);
    } else if (arg == "--progress") {
      const std::string v = value();
      if (v == "auto") {
        o.progress = progress_mode::automatic;
      } else if (v == "always") {
        o.progress = progress_mode::always;
      } else if (v == "never") {
        o.progress = progress_mode::never;
      } else {
        usage_error(fmt::format("--progress must be auto, always or never, got \"{}\"", v));
      }
    } else if (arg.rfind("-", 0) == 0 && arg != "-") {
      usage_error(fmt::format("unknown option {}", arg));
    } else if (o.trace_path.empty()) {
      o.trace_path = arg;
    } else {
      usage_error(fmt::format("one trace at a time: \"{}\" and \"{}\"", o.trace_path, arg));
    }
  }
  if (o.trace_path.empty()) usage_error("no trace given");
  if (o.compare && o.configs.empty()) {
    for (std::string_view c : default_compare) o.configs.emplace_back(c);
  }
  if (o.configs.empty()) o.configs.emplace_back("");
  return o;
}

// --- Progress ------------------------------------------------------------------------------------

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

// --- Running -------------------------------------------------------------------------------------

struct config_run {
  std::string text;  // as given
  gpumem::allocator_config config;
  gpumem::replay_result result;
  std::optional<std::size_t> min_device_memory;
  bool min_searched = false;
};

std::string bytes(std::uint64_t b) {
  return gpumem::format_bytes(static_cast<std::size_t>(b));
}

std::string ratio(std::uint64_t a, std::uint64_t b) {
  return b == 0 ? std::string("-")
                : fmt::format("{:.3f}", static_cast<double>(a) / static_cast<double>(b));
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string device_calls_text(const gpumem::call_counters& calls) {
  std::string out;
  for (gpumem::call_kind k : gpumem::all_call_kinds) {
    if (calls[k] == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", gpumem::cuda_call_name(k), calls[k]);
  }
  return out.empty() ? "none" : out;
}

void print_trace_header(const options& o, const gpumem::allocation_trace& t,
                        const gpumem::compiled_trace& c) {
  fmt::print("trace:   {} ({}{} events, {} allocations, {} stream{})\n", o.trace_path,
             t.source.empty() ? "" : t.source + ", ", t.events.size(), c.allocations,
             c.stream_ids.size(), c.stream_ids.size() == 1 ? "" : "s");
  if (t.initial_events != 0) {
    fmt::print("         {} blocks were live before recording began; they are allocated first\n",
               t.initial_events);
  }
  fmt::print("device:  simulated, {}\n", bytes(o.device_memory));
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
  fmt::print("config:  \"{}\" (allocator gpumem, policy {})\n", run.text, r.policy);
  if (r.completed) {
    fmt::print("result:  completed, {} events\n", r.events_replayed);
  } else {
    fmt::print("result:  OUT OF MEMORY at event {} of {} (a request of {})\n\n", *r.oom_event_index,
               c.ops.size(), bytes(r.oom_request_bytes));
    fmt::print("{}\n\n{}\n", r.oom_message, r.memory_summary);
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
  if (o.costs) {
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
  fmt::print("replay:  {} events in {:.1f} ms ({:.1f} M events/s)\n", r.events_replayed,
             r.wall_seconds * 1e3, r.events_per_second() / 1e6);
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
        run.text.empty() ? "(default)" : run.text,
        r.policy,
        r.completed ? "completed" : fmt::format("OOM at event {}", *r.oom_event_index),
        bytes(r.peak_requested),
        bytes(r.peak_allocated),
        bytes(r.peak_reserved),
        ratio(r.peak_reserved, r.peak_requested),
        std::to_string(r.device_alloc_calls()),
        std::to_string(r.device_free_calls())};
    if (o.costs) row.push_back(fmt::format("{:.2f} ms", r.simulated_seconds * 1e3));
    if (o.find_min_memory) {
      row.push_back(run.min_device_memory ? bytes(*run.min_device_memory)
                                          : "> " + bytes(o.min_memory_limit));
    }
    row.push_back(fmt::format("{:.1f}M", r.events_per_second() / 1e6));
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
  for (const config_run& run : runs) {
    if (run.result.completed) continue;
    fmt::print("\n--- \"{}\" ran out of memory at event {} ---\n{}\n", run.text,
               *run.result.oom_event_index, run.result.oom_message);
    if (o.verbose) fmt::print("\n{}\n", run.result.memory_summary);
  }
}

void print_json(const options& o, const std::vector<config_run>& runs,
                const gpumem::compiled_trace& c) {
  fmt::print("[\n");
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const config_run& run = runs[i];
    const gpumem::replay_result& r = run.result;
    std::string obj = "  {";
    auto field = [&](std::string_view key, const std::string& v) {
      if (obj.size() > 3) obj += ", ";
      obj += fmt::format("\"{}\": {}", key, v);
    };
    auto optional_number = [](const auto& v) {
      return v ? fmt::format("{}", *v) : std::string("null");
    };
    field("config", json_string(run.text));
    field("allocator", json_string("gpumem"));
    field("policy", json_string(r.policy));
    field("trace", json_string(o.trace_path));
    field("device_memory_bytes", std::to_string(o.device_memory));
    field("completed", r.completed ? "true" : "false");
    field("oom_event_index", optional_number(r.oom_event_index));
    field("oom_message", r.completed ? "null" : json_string(r.oom_message));
    field("events", std::to_string(c.ops.size()));
    field("events_replayed", std::to_string(r.events_replayed));
    field("peak_requested_bytes", std::to_string(r.peak_requested));
    field("peak_allocated_bytes", std::to_string(r.peak_allocated));
    field("peak_reserved_bytes", std::to_string(r.peak_reserved));
    field("reserved_over_requested",
          r.peak_requested == 0 ? "null"
                                : fmt::format("{:.6f}", static_cast<double>(r.peak_reserved) /
                                                            static_cast<double>(r.peak_requested)));
    field("recorded_peak_reserved_bytes", optional_number(c.recorded_peak_reserved));
    field("device_alloc_calls", std::to_string(r.device_alloc_calls()));
    field("device_free_calls", std::to_string(r.device_free_calls()));
    field("device_calls", std::to_string(r.calls.total()));
    field("simulated_device_seconds", fmt::format("{:.9f}", r.simulated_seconds));
    field("replay_seconds", fmt::format("{:.6f}", r.wall_seconds));
    field("events_per_second", fmt::format("{:.0f}", r.events_per_second()));
    if (o.find_min_memory) field("min_device_memory_bytes", optional_number(run.min_device_memory));
    obj += "}";
    fmt::print("{}{}\n", obj, i + 1 < runs.size() ? "," : "");
  }
  fmt::print("]\n");
}

gpumem::memory_curve curve_of(const config_run& run) {
  gpumem::memory_curve curve;
  curve.label = run.text.empty() ? "(default: " + run.result.policy + ")" : run.text;
  for (const gpumem::replay_sample& s : run.result.samples) {
    curve.event_index.push_back(s.event_index);
    curve.requested.push_back(s.requested);
    curve.allocated.push_back(s.allocated);
    curve.reserved.push_back(s.reserved);
  }
  curve.oom_event_index = run.result.oom_event_index;
  return gpumem::decimate(curve, 4000);
}

gpumem::segment_map map_of(const std::string& label, const gpumem::replay_result& r) {
  gpumem::segment_map map;
  map.label = label;
  map.at_event_index = r.snapshot_event.value_or(0);
  for (const auto& s : r.segments) {
    gpumem::segment_map_segment seg;
    seg.size = s.total_size;
    seg.is_small = s.is_small;
    for (const gpumem::block_snapshot& b : s.blocks) {
      gpumem::segment_map_block block;
      block.offset = b.address - s.address;
      block.size = b.size;
      switch (b.state) {
        case gpumem::block_state::active_allocated:
          block.state = gpumem::segment_map_block::state_kind::allocated;
          break;
        case gpumem::block_state::active_pending_free:
          block.state = gpumem::segment_map_block::state_kind::pending_free;
          break;
        case gpumem::block_state::inactive:
          block.state = b.mapped ? gpumem::segment_map_block::state_kind::cached
                                 : gpumem::segment_map_block::state_kind::unmapped;
          break;
      }
      seg.blocks.push_back(block);
    }
    map.segments.push_back(std::move(seg));
  }
  return map;
}

void write_plot(const options& o, const std::vector<config_run>& runs,
                const gpumem::compiled_trace& c, const gpumem::allocation_trace& t) {
  std::vector<gpumem::memory_curve> curves;
  std::vector<gpumem::segment_map> maps;
  for (const config_run& run : runs) {
    curves.push_back(curve_of(run));
    // The segments at the peak: a second replay that stops to look at them.
    gpumem::replay_result at = run.result;
    if (run.result.completed) {
      std::size_t peak_event = 0;
      std::uint64_t peak = 0;
      for (const gpumem::replay_sample& s : run.result.samples) {
        if (s.reserved > peak) {
          peak = s.reserved;
          peak_event = static_cast<std::size_t>(s.event_index);
        }
      }
      gpumem::replay_options ro;
      ro.device_memory = o.device_memory;
      ro.config = run.config;
      ro.snapshot_after_event = peak_event;
      at = gpumem::replay_trace(c, ro);
    }
    maps.push_back(map_of(
        curves.back().label + (run.result.completed ? " at peak reserved" : " at the OOM"), at));
  }
  gpumem::memory_plot_options po;
  po.title = fmt::format("{} on a simulated {} device", o.trace_path, bytes(o.device_memory));
  po.device_memory = o.device_memory;
  po.recorded_reserved_peak = c.recorded_peak_reserved;
  (void)t;
  std::ofstream out(o.plot_path, std::ios::binary);
  if (!out)
    throw std::system_error(errno, std::generic_category(), "cannot write '" + o.plot_path + "'");
  gpumem::write_memory_plot(out, curves, maps, po);
  out.close();
  if (!out)
    throw std::system_error(errno, std::generic_category(), "cannot write '" + o.plot_path + "'");
}

void export_snapshot(const options& o, const config_run& run, const gpumem::compiled_trace& c) {
  gpumem::replay_options ro;
  ro.device_memory = o.device_memory;
  ro.config = run.config;
  ro.record_history = true;
  if (!c.ops.empty()) ro.snapshot_after_event = c.ops.size() - 1;
  const gpumem::replay_result r = gpumem::replay_trace(c, ro);
  std::ofstream out(o.export_path, std::ios::binary);
  if (!out) {
    throw std::system_error(errno, std::generic_category(), "cannot write '" + o.export_path + "'");
  }
  gpumem::write_pytorch_snapshot(out, r.segments, r.history);
  out.close();
  if (!out) {
    throw std::system_error(errno, std::generic_category(), "cannot write '" + o.export_path + "'");
  }
}

int run(const options& o) {
  const auto read_start = std::chrono::steady_clock::now();
  const gpumem::allocation_trace trace = gpumem::read_trace(o.trace_path, o.snapshot_device);
  if (!o.convert_path.empty()) {
    std::ofstream out(o.convert_path, std::ios::binary);
    if (!out)
      throw std::system_error(errno, std::generic_category(),
                              "cannot write '" + o.convert_path + "'");
    const bool csv = o.convert_path.size() >= 4 &&
                     o.convert_path.compare(o.convert_path.size() - 4, 4, ".csv") == 0;
    if (csv) {
      gpumem::write_rmm_csv(out, trace);
    } else {
      gpumem::write_native_trace(out, trace);
    }
    out.close();
    if (!out)
      throw std::system_error(errno, std::generic_category(),
                              "cannot write '" + o.convert_path + "'");
    std::fprintf(stderr, "gpumem-replay: wrote %zu events to %s\n", trace.events.size(),
                 o.convert_path.c_str());
    return 0;
  }
  const gpumem::compiled_trace compiled = gpumem::compile_trace(trace);
  const double read_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - read_start).count();

  std::vector<config_run> runs;
  for (const std::string& text : o.configs) {
    config_run run;
    run.text = text;
    try {
      run.config = gpumem::allocator_config::parse(text);
    } catch (const gpumem::config_error& e) {
      usage_error(fmt::format("bad configuration \"{}\": {}", text, e.what()));
    }
    runs.push_back(std::move(run));
  }

  if (!o.json) {
    print_trace_header(o, trace, compiled);
    if (read_seconds > 0.5) fmt::print("(read and checked in {:.2f} s)\n\n", read_seconds);
  }
  for (config_run& run : runs) {
    gpumem::replay_options ro;
    ro.device_memory = o.device_memory;
    ro.config = run.config;
    if (!o.costs) ro.costs = gpumem::cost_model{};
    ro.record_samples = !o.plot_path.empty();
    progress_bar bar(o.progress, run.text.empty() ? "(default)" : run.text);
    ro.progress = [&bar](std::size_t done, std::size_t total) { bar(done, total); };
    run.result = gpumem::replay_trace(compiled, ro);
    if (o.find_min_memory) {
      run.min_searched = true;
      progress_bar search_bar(o.progress, "min memory " + run.text);
      std::size_t probes = 0;
      run.min_device_memory =
          gpumem::find_min_device_memory(compiled, ro, o.min_memory_limit, std::size_t{1} << 20,
                                         [&](std::size_t, bool) { search_bar(++probes, 40); });
    }
  }

  if (o.json) {
    print_json(o, runs, compiled);
  } else if (runs.size() == 1 && !o.compare) {
    print_detail(o, runs.front(), compiled);
  } else {
    print_table(o, runs, compiled);
  }
  if (!o.plot_path.empty()) {
    write_plot(o, runs, compiled, trace);
    if (!o.json) fmt::print("\nplot: {}\n", o.plot_path);
  }
  if (!o.export_path.empty()) {
    export_snapshot(o, runs.front(), compiled);
    if (!o.json) {
      fmt::print("\nsnapshot: {} (\"{}\"; open it at https://pytorch.org/memory_viz)\n",
                 o.export_path, runs.front().text);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse_command_line(argc, argv);
  try {
    return run(o);
  } catch (const gpumem::trace_error& e) {
    std::fprintf(stderr, "gpumem-replay: %s\n", e.what());
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "gpumem-replay: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpumem-replay: replay failed: %s\n", e.what());
  }
  return 1;
}
