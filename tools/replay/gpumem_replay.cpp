// gpumem-replay — replays an allocation trace on a simulated GPU: does it run out of memory,
// where and why, how much memory each allocator configuration holds, and the smallest device on
// which it completes. Reads gpumem traces, PyTorch memory snapshots and RMM memory event logs.
//
// Exit status: 0 when the replays ran (whether or not they ran out of memory), 1 when a trace
// could not be read or a replay failed, 2 for a bad command line.
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/config.hpp"
#include "gpumem/detail/size_units.hpp"
#include "gpumem/detail/utf8.hpp"
#include "gpumem/error.hpp"
#include "gpumem/report/memory_plot.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/pytorch_snapshot.hpp"
#include "gpumem/trace/replay.hpp"
#include "gpumem/trace/rmm_csv.hpp"
#include "gpumem/trace/trace_io.hpp"
#include "json_text.hpp"

#ifndef GPUMEM_VERSION
#define GPUMEM_VERSION "unknown"
#endif

extern char** environ;

namespace {

using gpumem_replay::json_string;

constexpr std::string_view default_compare[] = {"policy:classic", "policy:expandable",
                                                "policy:stitch"};
constexpr std::string_view default_compare_pytorch[] = {"", "expandable_segments:True"};
constexpr std::string_view default_compare_cub[] = {""};

constexpr std::string_view peer_name = "gpumem-replay-peer";
constexpr std::string_view enable_pytorch =
    "to enable it: `bash tools/setup_torch.sh`, then configure gpumem with "
    "-DGPUMEM_TORCH_PYTHON=.venv-torch/bin/python and rebuild";

enum class progress_mode { automatic, always, never };

struct config_run;
struct replayed_input;

struct options {
  std::string trace_path;                // the one being replayed
  std::vector<std::string> trace_paths;  // as given (several: one replay each, then a summary)
  bool all_devices = false;              // --snapshot-device all
  std::vector<int> devices_with_data;    // of a PyTorch snapshot, for the header
  // Several inputs: run() hands its JSON objects and its runs back instead of printing them.
  std::vector<std::string>* json_objects = nullptr;
  std::vector<replayed_input>* collected = nullptr;
  std::string allocator = "gpumem";  // gpumem, pytorch or cub
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

void print_help() {
  std::printf(
      "usage: gpumem-replay TRACE... [options]\n"
      "\n"
      "Replays an allocation trace on a simulated GPU under gpumem's caching allocator and tells\n"
      "whether it runs out of memory, where and why, and how much memory it holds. TRACE is a\n"
      "gpumem trace, a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) or an RMM\n"
      "memory event log (logging_resource_adaptor CSV); the format is recognised by its content.\n"
      "TRACE - reads it from standard input. Several traces (one per rank, say: gpumem-replay\n"
      "DIR/*.pickle) are replayed one after the other, then a table lists them worst first\n"
      "(out of memory first, then the least headroom) and names the worst per configuration;\n"
      "one that cannot be read is reported and the others are still replayed.\n"
      "\n"
      "options:\n"
      "  --allocator gpumem|pytorch|cub\n"
      "                          the caching allocator to replay on (default gpumem). pytorch:\n"
      "                          PyTorch's own CUDACachingAllocator (libc10_cuda.so), cub: CUB's\n"
      "                          CachingDeviceAllocator, both running on the gpumem CUDA\n"
      "                          simulator in a child process (gpumem-replay-peer); their\n"
      "                          --config is their own (pytorch: PYTORCH_CUDA_ALLOC_CONF syntax;\n"
      "                          cub: bin_growth:N,min_bin:N,max_bin:N,max_cached_bytes:SIZE)\n"
      "  --device-memory SIZE    simulated device size, e.g. 80GiB, 24GiB, 1536MiB (binary\n"
      "                          units: K/KiB, M/MiB, G/GiB, T/TiB; B for bytes; a number\n"
      "                          without a unit is refused). Default: for a PyTorch snapshot\n"
      "                          that ran out of memory, what its allocator could have had\n"
      "                          (its reserved memory then plus the device's free memory),\n"
      "                          else 80GiB\n"
      "  --overhead SIZE         memory of the device that the allocator does not see (CUDA\n"
      "                          context, NCCL buffers, other processes): the allocator gets\n"
      "                          the device memory minus this (default 0)\n"
      "  --config CONFIG         the allocator configuration, PYTORCH_CUDA_ALLOC_CONF syntax plus\n"
      "                          gpumem's policy key, e.g. "
      "\"policy:classic,max_split_size_mb:128\"\n"
      "                          or \"expandable_segments:True\" (default: \"\", gpumem's default\n"
      "                          policy, stitch). The environment is not read.\n"
      "                          recorded: the snapshot's own allocator_settings, on the\n"
      "                          classic policy (expandable with expandable_segments:True):\n"
      "                          what PyTorch did; the default for a PyTorch snapshot\n"
      "  --compare [CONFIG...]   replay under several configurations, one row each (default:\n"
      "                          policy:classic policy:expandable policy:stitch, after\n"
      "                          recorded for a PyTorch snapshot)\n"
      "  --find-min-memory       also find, per configuration, the smallest device on which the\n"
      "                          trace completes (to 1 MiB; one replay per probe). It covers\n"
      "                          the allocator's memory only: add what --overhead stands for\n"
      "  --plot FILE.svg         draw memory over time per configuration and the segments at the\n"
      "                          peak (or at the out-of-memory) as an SVG image\n"
      "  --steps N               replay the trace N times in a row, as the steps of a training\n"
      "                          loop (what is live at the end of a step is freed), and print "
      "each\n"
      "                          step's device calls, host synchronisations and stream waits\n"
      "  --timeline FILE.csv|FILE.json\n"
      "                          write memory over events per configuration: requested,\n"
      "                          allocated and reserved bytes after each event (and its\n"
      "                          recorded time, where the trace has one)\n"
      "  --json                  print a JSON array, one object per configuration\n"
      "  --convert FILE          write the trace as a gpumem trace (or, for FILE.csv, as an RMM\n"
      "                          log) and exit\n"
      "  --export-snapshot FILE  write the allocator's segments at the end (or at the\n"
      "                          out-of-memory) and the replayed events, under the first\n"
      "                          configuration, as a PyTorch memory snapshot pickle: open it at\n"
      "                          https://pytorch.org/memory_viz\n"
      "  --snapshot-device N|all the device of a PyTorch snapshot to replay (default: the one\n"
      "                          device with data, else 0; the header says which devices hold\n"
      "                          data); all: each of them\n"
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
      "  gpumem-replay run.trace --allocator pytorch --compare \"\" "
      "\"expandable_segments:True\"\n"
      "\n"
      "Exit status: 0 when the replays ran (out of memory included), 1 when the trace could not\n"
      "be read or a replay failed, 2 for a bad command line.\n");
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "gpumem-replay: %s (see --help)\n", message.c_str());
  std::exit(2);
}

/// A size flag's value: a number with a unit ("24" is refused: it would be 24 bytes).
std::size_t size_with_unit(std::string_view flag, const std::string& v) {
  std::string_view t = v;
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
  if (!t.empty() && ((t.back() >= '0' && t.back() <= '9') || t.back() == '.')) {
    usage_error(fmt::format("{} \"{}\" has no unit: write e.g. {}GiB or {}MiB (B for bytes)", flag,
                            gpumem::detail::printable_excerpt(v),
                            gpumem::detail::printable_excerpt(t),
                            gpumem::detail::printable_excerpt(t)));
  }
  try {
    return gpumem::parse_size(v);
  } catch (const std::invalid_argument& e) {
    usage_error(fmt::format("{}: {}", flag, gpumem::detail::printable_excerpt(e.what(), 300)));
  }
}

options parse_command_line(int argc, char** argv) {
  options o;
  bool config_given = false;  // --config seen
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
      if (i + 1 >= argc)
        usage_error(fmt::format("{} needs a value", gpumem::detail::printable_excerpt(arg)));
      return argv[++i];
    };
    auto no_value = [&]() {
      if (inline_value)
        usage_error(fmt::format("{} takes no value", gpumem::detail::printable_excerpt(arg)));
    };
    if (arg == "-h" || arg == "--help") {
      print_help();
      std::exit(0);
    } else if (arg == "--version") {
      std::printf("gpumem-replay %s\n", GPUMEM_VERSION);
      std::exit(0);
    } else if (arg == "--device-memory") {
      o.device_memory = size_with_unit("--device-memory", value());
      if (o.device_memory == 0) usage_error("--device-memory must be more than 0 bytes");
      if (o.device_memory > (std::size_t{1} << 50)) {
        usage_error("--device-memory above 1 PiB is not supported");
      }
      o.device_memory_given = true;
    } else if (arg == "--overhead") {
      o.overhead = size_with_unit("--overhead", value());
    } else if (arg == "--timeline") {
      o.timeline_path = value();
      const auto ends_with = [&](std::string_view tail) {
        return o.timeline_path.size() > tail.size() &&
               o.timeline_path.compare(o.timeline_path.size() - tail.size(), tail.size(), tail) ==
                   0;
      };
      if (!ends_with(".csv") && !ends_with(".json")) {
        usage_error(fmt::format("--timeline writes FILE.csv or FILE.json, got \"{}\"",
                                gpumem::detail::printable_excerpt(o.timeline_path)));
      }
    } else if (arg == "--allocator") {
      o.allocator = value();
      if (o.allocator != "gpumem" && o.allocator != "pytorch" && o.allocator != "cub") {
        usage_error(fmt::format("--allocator must be gpumem, pytorch or cub, got \"{}\"",
                                gpumem::detail::printable_excerpt(o.allocator)));
      }
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
    } else if (arg == "--steps") {
      const std::string v = value();
      if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos ||
          std::stoul(v) == 0) {
        usage_error(fmt::format("--steps needs a number of steps from 1 to 999999, got \"{}\"",
                                gpumem::detail::printable_excerpt(v)));
      }
      o.steps = std::stoul(v);
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
      if (v == "all") {
        o.all_devices = true;
      } else if (v.empty() || v.size() > 4 ||
                 v.find_first_not_of("0123456789") != std::string::npos) {
        usage_error(fmt::format("--snapshot-device needs a device number or all, got \"{}\"",
                                gpumem::detail::printable_excerpt(v)));
      } else {
        o.snapshot_device = std::stoi(v);
        o.snapshot_device_given = true;
      }
    } else if (arg == "--progress") {
      const std::string v = value();
      if (v == "auto") {
        o.progress = progress_mode::automatic;
      } else if (v == "always") {
        o.progress = progress_mode::always;
      } else if (v == "never") {
        o.progress = progress_mode::never;
      } else {
        usage_error(fmt::format("--progress must be auto, always or never, got \"{}\"",
                                gpumem::detail::printable_excerpt(v)));
      }
    } else if (arg.rfind("-", 0) == 0 && arg != "-") {
      usage_error(fmt::format("unknown option {}", gpumem::detail::printable_excerpt(arg)));
    } else {
      o.trace_paths.push_back(arg);
    }
  }
  if (o.trace_paths.empty()) usage_error("no trace given");
  o.trace_path = o.trace_paths.front();
  if (o.trace_paths.size() > 1 || o.all_devices) {
    for (const std::string& p : o.trace_paths) {
      if (p == "-") usage_error("standard input (-) is read alone: give one trace");
    }
    const std::pair<const std::string*, const char*> single[] = {
        {&o.plot_path, "--plot"},
        {&o.export_path, "--export-snapshot"},
        {&o.convert_path, "--convert"},
        {&o.timeline_path, "--timeline"}};
    for (const auto& [path, flag] : single) {
      if (!path->empty()) {
        usage_error(fmt::format("{} writes one trace's file: give one trace and one device", flag));
      }
    }
  }
  if (o.trace_path == "-" && o.allocator != "gpumem") {
    usage_error(fmt::format("--allocator {} reads the trace from a file, not from standard input",
                            o.allocator));
  }
  if (o.allocator != "gpumem") {
    if (!o.plot_path.empty()) usage_error("--plot is only for --allocator gpumem");
    if (!o.export_path.empty()) usage_error("--export-snapshot is only for --allocator gpumem");
    if (!o.timeline_path.empty()) usage_error("--timeline is only for --allocator gpumem");
    if (o.steps != 0) usage_error("--steps is only for --allocator gpumem");
  }
  if (o.steps != 0 && (!o.plot_path.empty() || !o.export_path.empty() || o.find_min_memory)) {
    usage_error("--steps does not combine with --plot, --export-snapshot or --find-min-memory");
  }
  o.config_given = !o.configs.empty();
  if (o.compare && o.configs.empty()) {
    o.compare_defaulted = true;
    if (o.allocator == "pytorch") {
      for (std::string_view c : default_compare_pytorch) o.configs.emplace_back(c);
    } else if (o.allocator == "cub") {
      for (std::string_view c : default_compare_cub) o.configs.emplace_back(c);
    } else {
      for (std::string_view c : default_compare) o.configs.emplace_back(c);
    }
  }
  if (o.configs.empty()) o.configs.emplace_back("");
  // Settings are checked before the trace is read: a typo is reported at once. A peer checks its
  // own configuration (PyTorch's or CUB's syntax).
  if (o.allocator == "gpumem") {
    for (const std::string& text : o.configs) {
      if (text == "recorded") {  // resolved once the trace is read
        o.parsed_configs.emplace_back();
        continue;
      }
      try {
        o.parsed_configs.push_back(gpumem::allocator_config::parse(text));
      } catch (const gpumem::config_error& e) {
        usage_error(fmt::format("bad configuration \"{}\": {}",
                                gpumem::detail::printable_excerpt(text), e.what()));
      }
    }
  }
  // The search must at least cover the device the user simulates.
  o.min_memory_limit = std::max(o.min_memory_limit, o.device_memory);
  // An output written over the trace would destroy it before (or while) it is read.
  for (const std::string* output :
       {&o.convert_path, &o.plot_path, &o.export_path, &o.timeline_path}) {
    std::error_code ec;
    if (!output->empty() && std::filesystem::equivalent(*output, o.trace_path, ec)) {
      usage_error(fmt::format("\"{}\" is the trace being read: write the output to another file",
                              gpumem::detail::printable(*output)));
    }
  }
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
  std::string text;       // as given
  std::string effective;  // what runs: text, or for "recorded" the settings it stands for
  gpumem::allocator_config config;
  gpumem::replay_result result;
  std::optional<std::size_t> min_device_memory;
  bool min_searched = false;
  /// A peer's replay (--allocator pytorch|cub): no simulated time; every field it printed, in
  /// order (key, JSON value), for --json.
  bool peer = false;
  std::vector<std::pair<std::string, std::string>> peer_fields;
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

std::string bytes(std::uint64_t b) {
  return gpumem::format_bytes(static_cast<std::size_t>(b));
}

std::string ratio(std::uint64_t a, std::uint64_t b) {
  return b == 0 ? std::string("-")
                : fmt::format("{:.3f}", static_cast<double>(a) / static_cast<double>(b));
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
    std::map<std::string, std::string> f(run.peer_fields.begin(), run.peer_fields.end());
    if (f.count("pytorch_reserved_peak_bytes") != 0) {
      fmt::print(
          "pytorch: its own statistics: reserved peak {}, {} device allocations, {} frees, {} "
          "retries, {} out-of-memory\n",
          bytes(std::stoull(f["pytorch_reserved_peak_bytes"])), f["pytorch_num_device_alloc"],
          f["pytorch_num_device_free"], f["pytorch_num_alloc_retries"], f["pytorch_num_ooms"]);
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

void print_json(const options& o, const std::vector<config_run>& runs,
                const gpumem::compiled_trace& c, const gpumem::allocation_trace& t) {
  if (o.json_objects == nullptr) fmt::print("[\n");
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
    field("allocator", json_string(o.allocator));
    field("policy", json_string(r.policy));
    field("trace", json_string(o.trace_path));
    if (t.source == "pytorch-snapshot") field("snapshot_device", std::to_string(o.snapshot_device));
    field("device_memory_bytes", std::to_string(o.device_memory));
    field("completed", r.completed ? "true" : "false");
    field("oom_event_index", optional_number(r.oom_event_index));
    field("recorded_oom_event", optional_number(c.recorded_oom_event));
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
    field("recorded_initial_reserved_bytes", optional_number(t.recorded_initial_reserved));
    field("recorded_segment_allocs", std::to_string(c.recorded_segment_allocs));
    field("recorded_segment_frees", std::to_string(c.recorded_segment_frees));
    field("initial_events", std::to_string(c.initial_events));
    field("device_alloc_calls", std::to_string(r.device_alloc_calls()));
    field("device_free_calls", std::to_string(r.device_free_calls()));
    field("device_calls", std::to_string(r.calls.total()));
    if (run.peer) {
      // (the peer's JSON carries its own counts)
    } else if (o.steps == 0) {
      field("host_synchronizations", std::to_string(r.calls.host_synchronizations()));
    } else {
      auto per_step = [&](auto figure) {
        std::string list = "[";
        for (const gpumem::step_figures& f : r.steps) {
          list += (list.size() > 1 ? ", " : "") + std::to_string(figure(f));
        }
        return list + "]";
      };
      field("steps", std::to_string(o.steps));
      field("oom_step", r.completed ? "null" : std::to_string(r.oom_step + 1));
      field("device_calls_per_step",
            per_step([](const gpumem::step_figures& f) { return f.device_calls(); }));
      field("host_synchronizations_per_step",
            per_step([](const gpumem::step_figures& f) { return f.host_synchronizations(); }));
      field("stream_waits_per_step",
            per_step([](const gpumem::step_figures& f) { return f.stream_waits(); }));
    }
    field("simulated_device_seconds",
          run.peer ? std::string("null") : fmt::format("{:.9f}", r.simulated_seconds));
    field("replay_seconds", fmt::format("{:.6f}", r.wall_seconds));
    field("events_per_second", fmt::format("{:.0f}", r.events_per_second()));
    if (o.find_min_memory) field("min_device_memory_bytes", optional_number(run.min_device_memory));
    if (run.text == "recorded") field("recorded_config", json_string(run.effective));
    if (!run.peer) {
      std::string list = "[";
      for (const std::string& x : run.completes_with) {
        list += (list.size() > 1 ? ", " : "") + json_string(x);
      }
      field("completes_with", list + "]");
    }
    // What only a peer reports (its own statistics, the simulator's counts by call).
    for (const auto& [key, value] : run.peer_fields) {
      if (obj.find("\"" + key + "\": ") == std::string::npos) field(key, value);
    }
    obj += "}";
    if (o.json_objects != nullptr) {
      o.json_objects->push_back(std::move(obj));
    } else {
      fmt::print("{}{}\n", obj, i + 1 < runs.size() ? "," : "");
    }
  }
  if (o.json_objects == nullptr) fmt::print("]\n");
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
  gpumem::write_pytorch_snapshot(out, r.segments, r.snapshot_trace, r.history.recorded_config);
  out.close();
  if (!out) {
    throw std::system_error(errno, std::generic_category(), "cannot write '" + o.export_path + "'");
  }
}

// --- Peers: PyTorch's and CUB's allocators, in a child process ----------------------------------

/// gpumem-replay-peer next to this executable (GPUMEM_REPLAY_PEER overrides the path).
std::string peer_path() {
  if (const char* env = std::getenv("GPUMEM_REPLAY_PEER"); env != nullptr && *env != '\0') {
    return env;
  }
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n <= 0) return std::string(peer_name);
  self.resize(static_cast<std::size_t>(n));
  const std::size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) +
         std::string(peer_name);
}

struct child_output {
  int status = 0;  // the exit status, or 128 + signal
  std::string out;
  std::string err;
};

/// Runs `argv` with `env`, collecting its stdout and stderr.
child_output run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe(out_pipe) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  if (::pipe(err_pipe) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw std::system_error(errno, std::generic_category(), "pipe");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
    posix_spawn_file_actions_addclose(&actions, fd);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc =
      ::posix_spawn(&pid, argv.front().c_str(), &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    throw std::system_error(rc, std::generic_category(), "cannot start " + argv.front());
  }
  child_output result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  char buffer[65536];
  while (open_fds > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  result.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  return result;
}

/// The peer's message without its "gpumem-replay-peer: " prefix and trailing newline.
std::string peer_message(std::string err) {
  const std::string prefix = std::string(peer_name) + ": ";
  if (const std::size_t at = err.rfind(prefix); at != std::string::npos) {
    err = err.substr(at + prefix.size());
  }
  while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
  return err;
}

/// Checks that gpumem-replay-peer is there and has the allocator built in.
void check_peer(const options& o, const std::string& path) {
  if (::access(path.c_str(), X_OK) != 0) {
    usage_error(fmt::format(
        "--allocator {} needs {} next to gpumem-replay, not found at {}{}", o.allocator, peer_name,
        path, o.allocator == "pytorch" ? fmt::format("; {}", enable_pytorch) : std::string()));
  }
  const child_output list = run_child({path, "--list"}, {});
  if (list.status != 0) usage_error(fmt::format("{} --list failed: {}", path, list.err));
  if (list.out.find(o.allocator + "\n") == std::string::npos) {
    usage_error(fmt::format(
        "--allocator {}: {} was built without it{}", o.allocator, path,
        o.allocator == "pytorch" ? fmt::format("; {}", enable_pytorch) : std::string()));
  }
}

/// The fields of one flat JSON object (string, number, true, false, null values), raw.
std::vector<std::pair<std::string, std::string>> parse_flat_json(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> fields;
  std::size_t i = 0;
  auto bad = [&]() -> std::runtime_error {
    return std::runtime_error(fmt::format("unreadable output of {} near offset {}", peer_name, i));
  };
  auto skip_space = [&] {
    while (i < text.size() &&
           (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) {
      ++i;
    }
  };
  auto raw_string = [&]() {  // from the opening quote to after the closing one
    const std::size_t start = i++;
    while (i < text.size() && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
    if (i >= text.size()) throw bad();
    ++i;
    return std::string(text.substr(start, i - start));
  };
  skip_space();
  if (i >= text.size() || text[i] != '{') throw bad();
  ++i;
  for (;;) {
    skip_space();
    if (i < text.size() && text[i] == '}') break;
    if (i >= text.size() || text[i] != '"') throw bad();
    std::string key = raw_string();
    key = key.substr(1, key.size() - 2);
    skip_space();
    if (i >= text.size() || text[i] != ':') throw bad();
    ++i;
    skip_space();
    std::string value;
    if (i < text.size() && text[i] == '"') {
      value = raw_string();
    } else {
      const std::size_t start = i;
      while (i < text.size() && text[i] != ',' && text[i] != '}' && text[i] != ' ') ++i;
      value = std::string(text.substr(start, i - start));
      if (value.empty()) throw bad();
    }
    fields.emplace_back(std::move(key), std::move(value));
    skip_space();
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    if (i < text.size() && text[i] == '}') break;
    throw bad();
  }
  return fields;
}

/// A JSON string literal's text (the escapes json_string and the peer write).
std::string json_unquote(std::string_view raw) {
  std::string out;
  for (std::size_t i = 1; i + 1 < raw.size(); ++i) {
    if (raw[i] != '\\' || i + 2 >= raw.size()) {
      out += raw[i];
      continue;
    }
    const char c = raw[++i];
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u':
        if (i + 4 < raw.size()) {
          out += static_cast<char>(std::stoi(std::string(raw.substr(i + 1, 4)), nullptr, 16));
          i += 4;
        }
        break;
      default:
        out += c;
    }
  }
  return out;
}

/// One replay by the peer: fills run.result and run.peer_fields. Throws when the peer failed.
void run_peer(const options& o, const std::string& path, std::size_t device_memory,
              config_run& run) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v = *e;
    // The configuration is the one given, not the environment's (like gpumem's replays).
    if (v.rfind("GPUMEM_SIM_MEMORY=", 0) == 0 || v.rfind("PYTORCH_CUDA_ALLOC_CONF=", 0) == 0 ||
        v.rfind("PYTORCH_ALLOC_CONF=", 0) == 0) {
      continue;
    }
    env.emplace_back(v);
  }
  env.push_back(fmt::format("GPUMEM_SIM_MEMORY={}", device_memory));
  const child_output child =
      run_child({path, "--allocator", o.allocator, "--trace", o.trace_path, "--config",
                 run.effective, "--snapshot-device", std::to_string(o.snapshot_device)},
                env);
  if (child.status == 2) usage_error(peer_message(child.err));
  if (child.status != 0) {
    throw std::runtime_error(
        fmt::format("{} (--allocator {}, config \"{}\") exited with status {}: {}", peer_name,
                    o.allocator, run.text, child.status, peer_message(child.err)));
  }
  if (!child.err.empty()) std::fputs(child.err.c_str(), stderr);  // the allocator's warnings
  run.peer = true;
  run.peer_fields = parse_flat_json(child.out);
  std::map<std::string, std::string> f(run.peer_fields.begin(), run.peer_fields.end());
  auto number = [&](const std::string& key) -> std::uint64_t {
    const auto it = f.find(key);
    if (it == f.end() || it->second == "null") return 0;
    return std::stoull(it->second);
  };
  gpumem::replay_result& r = run.result;
  r = gpumem::replay_result{};
  r.policy = f.count("policy") != 0 ? json_unquote(f["policy"]) : std::string("?");
  r.completed = f["completed"] == "true";
  if (!r.completed) {
    r.oom_event_index = static_cast<std::size_t>(number("oom_event_index"));
    r.oom_message = json_unquote(f["oom_message"]);
    r.oom_request_bytes = number("oom_request_bytes");
  }
  r.peak_requested = number("peak_requested_bytes");
  r.peak_allocated = number("peak_allocated_bytes");
  r.peak_reserved = number("peak_reserved_bytes");
  r.events_replayed = static_cast<std::size_t>(number("events_replayed"));
  for (gpumem::call_kind k : gpumem::all_call_kinds) {
    r.calls[k] =
        static_cast<std::size_t>(number(fmt::format("calls_{}", gpumem::call_kind_name(k))));
  }
  r.wall_seconds = f.count("replay_seconds") != 0 ? std::stod(f["replay_seconds"]) : 0.0;
}

/// The smallest device (to `resolution`) on which the peer's replay completes; the search of
/// gpumem::find_min_device_memory, one child process per probe.
std::optional<std::size_t> find_min_memory_peer(const options& o, const std::string& path,
                                                const config_run& run,
                                                const gpumem::compiled_trace& c) {
  constexpr std::size_t resolution = std::size_t{1} << 20;
  auto completes = [&](std::size_t bytes) {
    config_run probe;
    probe.text = run.text;
    probe.effective = run.effective;
    run_peer(o, path, bytes, probe);
    return probe.result.completed;
  };
  return gpumem::search_min_device_memory(c.peak_requested, o.min_memory_limit, resolution,
                                          completes);
}

/// What "recorded" stands for: the snapshot's settings on the classic policy (PyTorch's own
/// allocator; expandable when they set expandable_segments:True). Exits 2 when gpumem cannot run
/// them.
gpumem::allocator_config recorded_config(const std::string& settings) {
  gpumem::allocator_config c;
  try {
    c = gpumem::allocator_config::parse(settings);
  } catch (const gpumem::config_error& e) {
    usage_error(
        fmt::format("--config recorded: the snapshot's settings \"{}\" are not a "
                    "configuration gpumem runs: {}",
                    gpumem::detail::printable_excerpt(settings), e.what()));
  }
  if (c.policy == gpumem::allocator_policy::automatic) {
    c.policy = c.expandable_segments ? gpumem::allocator_policy::expandable
                                     : gpumem::allocator_policy::classic;
  }
  return c;
}

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

/// --timeline: requested, allocated and reserved bytes after each event, per configuration.
void write_timeline(const options& o, const std::vector<config_run>& runs,
                    const gpumem::compiled_trace& c) {
  std::ofstream out(o.timeline_path, std::ios::binary);
  if (!out) {
    throw std::system_error(errno, std::generic_category(),
                            "cannot write '" + o.timeline_path + "'");
  }
  const bool csv = o.timeline_path.size() > 4 &&
                   o.timeline_path.compare(o.timeline_path.size() - 4, 4, ".csv") == 0;
  const std::size_t n = c.ops.size();
  auto time_of = [&](std::uint64_t event) -> std::string {
    if (c.time_us.empty() || n == 0) return {};
    const std::int64_t t = c.time_us[static_cast<std::size_t>(event % n)];
    return t == gpumem::no_time ? std::string() : std::to_string(t);
  };
  if (csv) {
    out << "config,policy,event,requested_bytes,allocated_bytes,reserved_bytes,time_us\n";
    for (const config_run& run : runs) {
      // A CSV field: quoted, quotes doubled.
      std::string label = "\"";
      for (char ch : run.text) label += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      label += "\"";
      for (const gpumem::replay_sample& s : run.result.samples) {
        out << label << ',' << run.result.policy << ',' << s.event_index << ',' << s.requested
            << ',' << s.allocated << ',' << s.reserved << ',' << time_of(s.event_index) << '\n';
      }
    }
  } else {
    out << "[\n";
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const config_run& run = runs[i];
      auto column = [&](auto field) {
        std::string list = "[";
        for (const gpumem::replay_sample& s : run.result.samples) {
          if (list.size() > 1) list += ",";
          list += field(s);
        }
        return list + "]";
      };
      const bool timed = !c.time_us.empty();
      out << "  {\"config\": " << json_string(run.text)
          << ", \"policy\": " << json_string(run.result.policy)
          << ", \"completed\": " << (run.result.completed ? "true" : "false") << ",\n   \"event\": "
          << column([](const gpumem::replay_sample& s) { return std::to_string(s.event_index); })
          << ",\n   \"requested_bytes\": "
          << column([](const gpumem::replay_sample& s) { return std::to_string(s.requested); })
          << ",\n   \"allocated_bytes\": "
          << column([](const gpumem::replay_sample& s) { return std::to_string(s.allocated); })
          << ",\n   \"reserved_bytes\": "
          << column([](const gpumem::replay_sample& s) { return std::to_string(s.reserved); })
          << ",\n   \"time_us\": "
          << (timed ? column([&](const gpumem::replay_sample& s) {
               const std::string t = time_of(s.event_index);
               return t.empty() ? std::string("null") : t;
             })
                    : std::string("null"))
          << "}" << (i + 1 < runs.size() ? "," : "") << "\n";
    }
    out << "]\n";
  }
  out.close();
  if (!out) {
    throw std::system_error(errno, std::generic_category(),
                            "cannot write '" + o.timeline_path + "'");
  }
}

/// The devices a PyTorch snapshot file holds data for; empty for other formats (or unreadable).
std::vector<int> snapshot_devices(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char first = 0;
  if (!in.get(first) || static_cast<unsigned char>(first) != 0x80) return {};  // not a pickle
  std::string bytes(1, first);
  bytes.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  try {
    return gpumem::pytorch_snapshot_devices(bytes);
  } catch (const std::exception&) {
    return {};  // the reader says what is wrong
  }
}

int run(options o) {
  const bool peer = o.allocator != "gpumem";
  const std::string peer_file = peer ? peer_path() : std::string();
  if (peer) check_peer(o, peer_file);
  const auto read_start = std::chrono::steady_clock::now();
  // "-" is standard input (replayed as many times as the flags ask: it is read once).
  if (o.trace_path != "-") {
    o.devices_with_data = snapshot_devices(o.trace_path);
    // A process writes its own GPU's snapshot (rank 3's device 3): its one device is the default.
    if (!o.snapshot_device_given && !o.all_devices && o.devices_with_data.size() == 1) {
      o.snapshot_device = o.devices_with_data.front();
    }
  }
  gpumem::allocation_trace trace;
  try {
    trace = o.trace_path == "-" ? gpumem::read_trace(std::cin, "standard input", o.snapshot_device)
                                : gpumem::read_trace(o.trace_path, o.snapshot_device);
  } catch (const gpumem::trace_error& e) {
    if (o.devices_with_data.empty() ||
        std::find(o.devices_with_data.begin(), o.devices_with_data.end(), o.snapshot_device) !=
            o.devices_with_data.end()) {
      throw;
    }
    std::string list;
    for (int d : o.devices_with_data) list += (list.empty() ? "" : ", ") + std::to_string(d);
    throw gpumem::trace_error(
        fmt::format("{} (devices with data: {}; see --snapshot-device)", e.what(), list),
        e.offset());
  }
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
                 gpumem::detail::printable(o.convert_path).c_str());
    return 0;
  }
  // The device: given, or what the recording's allocator could have had when it ran out of memory.
  if (!o.device_memory_given && trace.device_memory && trace.recorded_oom_event) {
    o.device_memory = static_cast<std::size_t>(*trace.device_memory);
    o.device_memory_source =
        "(the recording's at its out-of-memory: its reserved memory plus the device's free memory)";
  }
  if (o.overhead >= o.device_memory) {
    usage_error(fmt::format("--overhead {} leaves nothing of the {} device", bytes(o.overhead),
                            bytes(o.device_memory)));
  }
  o.device_memory -= o.overhead;
  o.min_memory_limit = std::max(o.min_memory_limit, o.device_memory);
  // A PyTorch snapshot replays first as it was recorded: "recorded" unless configurations are
  // given; --compare alone puts it before gpumem's policies.
  const bool snapshot = trace.source == "pytorch-snapshot";
  if (snapshot && o.allocator != "cub" && !o.config_given) {
    if (o.compare_defaulted && o.allocator == "gpumem") {
      o.configs.insert(o.configs.begin(), "recorded");
      o.parsed_configs.insert(o.parsed_configs.begin(), gpumem::allocator_config{});
    } else if (!o.compare) {
      o.configs = {"recorded"};
      o.parsed_configs = {gpumem::allocator_config{}};
    }
  }
  if (std::find(o.configs.begin(), o.configs.end(), "recorded") != o.configs.end()) {
    if (o.allocator == "cub")
      usage_error("--config recorded: CUB's allocator has no such settings");
    o.recorded_effective = o.allocator == "gpumem"
                               ? recorded_config(trace.recorded_config).to_string()
                               : trace.recorded_config;
    for (std::size_t i = 0; i < o.configs.size(); ++i) {
      if (o.configs[i] == "recorded" && o.allocator == "gpumem") {
        o.parsed_configs[i] = recorded_config(trace.recorded_config);
      }
    }
  }
  const gpumem::compiled_trace compiled = gpumem::compile_trace(trace);
  const double read_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - read_start).count();

  std::vector<config_run> runs;
  for (std::size_t i = 0; i < o.configs.size(); ++i) {
    config_run run;
    run.text = o.configs[i];
    run.effective = run.text == "recorded" ? o.recorded_effective : run.text;
    if (!peer) run.config = o.parsed_configs[i];
    runs.push_back(std::move(run));
  }

  // A peer checks its configuration when it runs: a bad one ends the run before any output.
  if (!o.json && !peer) {
    print_trace_header(o, trace, compiled);
    if (read_seconds > 0.5) fmt::print("(read and checked in {:.2f} s)\n\n", read_seconds);
  }
  for (config_run& run : runs) {
    if (peer) {
      run_peer(o, peer_file, o.device_memory, run);
      if (o.find_min_memory) {
        run.min_searched = true;
        run.min_device_memory = find_min_memory_peer(o, peer_file, run, compiled);
      }
      continue;
    }
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

  if (!o.json && peer) print_trace_header(o, trace, compiled);
  if (o.collected != nullptr) {
    std::string label = o.trace_path;
    if (trace.source == "pytorch-snapshot" && (o.all_devices || o.snapshot_device != 0)) {
      label += fmt::format(" device {}", o.snapshot_device);
    }
    o.collected->push_back({std::move(label), runs, o.device_memory, compiled.recorded_oom_event});
  }
  if (o.json) {
    print_json(o, runs, compiled, trace);
  } else if (runs.size() == 1 && !o.compare) {
    print_detail(o, runs.front(), compiled);
  } else {
    print_table(o, runs, compiled);
  }
  // The recording ran out of memory: a replay that completes has not reproduced it.
  if (compiled.recorded_oom_event) {
    for (const config_run& run : runs) {
      if (!run.result.completed) continue;
      std::fprintf(stderr,
                   "gpumem-replay: warning: the recording ran out of memory at event %zu, but "
                   "\"%s\" completes on %s: the replay did not reproduce it (a larger device than "
                   "the recording had? see --device-memory and --overhead)\n",
                   *compiled.recorded_oom_event, gpumem::detail::printable(run.text).c_str(),
                   bytes(o.device_memory).c_str());
    }
  }
  if (!o.timeline_path.empty()) {
    write_timeline(o, runs, compiled);
    if (!o.json) fmt::print("\ntimeline: {}\n", o.timeline_path);
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

/// Several inputs: a row per input and configuration, the inputs worst first (by their worst
/// configuration; see badness), then the worst input per configuration.
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

/// Every trace given, each device of each with --snapshot-device all: one run() each; with
/// several, a summary (or one JSON array of every record).
int run_all(const options& given) {
  std::vector<std::pair<std::string, int>> inputs;
  for (const std::string& path : given.trace_paths) {
    if (!given.all_devices) {
      inputs.emplace_back(path, given.snapshot_device);
      continue;
    }
    const std::vector<int> devices = snapshot_devices(path);
    if (devices.empty()) inputs.emplace_back(path, 0);  // not a snapshot: its one trace
    for (int d : devices) inputs.emplace_back(path, d);
  }
  if (inputs.size() == 1) {
    options o = given;
    o.snapshot_device = inputs.front().second;
    return run(o);
  }
  std::vector<std::string> json_objects;
  std::vector<replayed_input> collected;
  int status = 0;
  for (const auto& [path, device] : inputs) {
    options o = given;
    o.trace_path = path;
    o.snapshot_device = device;
    o.json_objects = given.json ? &json_objects : nullptr;
    o.collected = &collected;
    if (!given.json) {
      fmt::print("=== {}{} ===\n", gpumem::detail::printable(path),
                 given.all_devices ? fmt::format(", device {}", device) : std::string());
    }
    try {
      status = std::max(status, run(o));
    } catch (const std::system_error& e) {
      std::fprintf(stderr, "gpumem-replay: %s\n", gpumem::detail::printable(e.what()).c_str());
      status = 1;
    } catch (const gpumem::trace_error& e) {
      std::fprintf(stderr, "gpumem-replay: %s\n", gpumem::detail::printable(e.what()).c_str());
      status = 1;
    } catch (const std::exception& e) {  // one input's failure, not the others'
      std::fprintf(stderr, "gpumem-replay: %s: replay failed: %s\n",
                   gpumem::detail::printable(path).c_str(),
                   gpumem::detail::printable(e.what()).c_str());
      status = 1;
    }
    if (!given.json) fmt::print("\n");
  }
  if (given.json) {
    fmt::print("[\n");
    for (std::size_t i = 0; i < json_objects.size(); ++i) {
      fmt::print("{}{}\n", json_objects[i], i + 1 < json_objects.size() ? "," : "");
    }
    fmt::print("]\n");
  } else if (!collected.empty()) {
    print_summary(given, collected, inputs.size());
  }
  return status;
}

}  // namespace

// Whether the program started with standard output closed. Its descriptor is then taken by
// /dev/null, so that no file opened later (a --convert output) becomes standard output.
bool stdout_was_closed = false;

void reserve_standard_descriptors() {
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    if (fd == STDOUT_FILENO) stdout_was_closed = true;
    const int opened = ::open("/dev/null", fd == STDIN_FILENO ? O_RDONLY : O_WRONLY);
    if (opened != fd && opened >= 0) ::close(opened);  // fd is the lowest free descriptor
  }
}

// Output that did not reach its destination (a full disk, a closed pipe) is an error: results
// that were never written must not look like a success.
int check_output(int status, bool writes_stdout) {
  if (stdout_was_closed && writes_stdout) {
    std::fprintf(stderr,
                 "gpumem-replay: standard output is closed: the results were not written\n");
    return 1;
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    std::fprintf(stderr, "gpumem-replay: cannot write the results to standard output: %s\n",
                 std::strerror(errno != 0 ? errno : EIO));
    return 1;
  }
  return status;
}

int main(int argc, char** argv) {
  reserve_standard_descriptors();
  const options o = parse_command_line(argc, argv);
  const bool writes_stdout = o.convert_path.empty();
  // Messages may quote the input (a trace's text, a file name): printed escaped.
  auto report = [](const char* prefix, const char* what) {
    std::fprintf(stderr, "gpumem-replay: %s%s\n", prefix, gpumem::detail::printable(what).c_str());
  };
  try {
    return check_output(run_all(o), writes_stdout);
  } catch (const gpumem::trace_error& e) {
    report("", e.what());
  } catch (const std::system_error& e) {
    report("", e.what());
  } catch (const std::exception& e) {
    report("replay failed: ", e.what());
  }
  return check_output(1, writes_stdout);
}
