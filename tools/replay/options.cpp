// gpumem-replay — its command line: --help, the parsing of the options on the shared scanner
// (tools/common/command_line.hpp), and what --config recorded stands for.
#include "options.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "gpumem/detail/utf8.hpp"
#include "gpumem/error.hpp"

#ifndef GPUMEM_VERSION
#define GPUMEM_VERSION "unknown"
#endif

namespace gpumem_replay {

namespace {

constexpr std::string_view default_compare[] = {"policy:classic", "policy:expandable",
                                                "policy:stitch"};
constexpr std::string_view default_compare_pytorch[] = {"", "expandable_segments:True"};
constexpr std::string_view default_compare_cub[] = {""};

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

}  // namespace

options parse_command_line(int argc, char** argv) {
  options o;
  bool config_given = false;  // --config seen
  gpumem_tools::command_line cl(argc, argv, std::string(tool_name));
  while (cl.next()) {
    if (cl.is("-h") || cl.is("--help")) {  // --help=VALUE shows the help too
      print_help();
      std::exit(0);
    } else if (cl.is("--version")) {
      std::printf("gpumem-replay %s\n", GPUMEM_VERSION);
      std::exit(0);
    } else if (cl.is("--device-memory")) {
      o.device_memory = cl.size_value();
      if (o.device_memory == 0) cl.fail("--device-memory must be more than 0 bytes");
      if (o.device_memory > (std::size_t{1} << 50)) {
        cl.fail("--device-memory above 1 PiB is not supported");
      }
      o.device_memory_given = true;
    } else if (cl.is("--overhead")) {
      o.overhead = cl.size_value();
    } else if (cl.is("--timeline")) {
      o.timeline_path = cl.value();
      const auto ends_with = [&](std::string_view tail) {
        return o.timeline_path.size() > tail.size() &&
               o.timeline_path.compare(o.timeline_path.size() - tail.size(), tail.size(), tail) ==
                   0;
      };
      if (!ends_with(".csv") && !ends_with(".json")) {
        cl.fail(fmt::format("--timeline writes FILE.csv or FILE.json, got \"{}\"",
                            gpumem::detail::printable_excerpt(o.timeline_path)));
      }
    } else if (cl.is("--allocator")) {
      o.allocator = cl.value();
      if (o.allocator != "gpumem" && o.allocator != "pytorch" && o.allocator != "cub") {
        cl.fail(fmt::format("--allocator must be gpumem, pytorch or cub, got \"{}\"",
                            gpumem::detail::printable_excerpt(o.allocator)));
      }
    } else if (cl.is("--config")) {
      if (config_given || o.compare) cl.fail("give one --config, or --compare with several");
      o.configs.push_back(cl.value());
      config_given = true;
    } else if (cl.is("--compare")) {
      if (config_given) cl.fail("give one --config, or --compare with several");
      for (std::string& config : cl.values()) o.configs.push_back(std::move(config));
      o.compare = true;
    } else if (cl.is("--steps")) {
      const std::string v = cl.value();
      if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos ||
          std::stoul(v) == 0) {
        cl.fail(fmt::format("--steps needs a number of steps from 1 to 999999, got \"{}\"",
                            gpumem::detail::printable_excerpt(v)));
      }
      o.steps = std::stoul(v);
    } else if (cl.is("--find-min-memory")) {
      cl.no_value();
      o.find_min_memory = true;
    } else if (cl.is("--plot")) {
      o.plot_path = cl.value();
      if (o.plot_path.empty()) cl.fail("--plot needs a file name");
    } else if (cl.is("--convert")) {
      o.convert_path = cl.value();
      if (o.convert_path.empty()) cl.fail("--convert needs a file name");
    } else if (cl.is("--export-snapshot")) {
      o.export_path = cl.value();
      if (o.export_path.empty()) cl.fail("--export-snapshot needs a file name");
    } else if (cl.is("--json")) {
      cl.no_value();
      o.json = true;
    } else if (cl.is("--verbose")) {
      cl.no_value();
      o.verbose = true;
    } else if (cl.is("--no-costs")) {
      cl.no_value();
      o.costs = false;
    } else if (cl.is("--snapshot-device")) {
      const std::string v = cl.value();
      if (v == "all") {
        o.all_devices = true;
      } else if (v.empty() || v.size() > 4 ||
                 v.find_first_not_of("0123456789") != std::string::npos) {
        cl.fail(fmt::format("--snapshot-device needs a device number or all, got \"{}\"",
                            gpumem::detail::printable_excerpt(v)));
      } else {
        o.snapshot_device = std::stoi(v);
        o.snapshot_device_given = true;
      }
    } else if (cl.is("--progress")) {
      const std::string v = cl.value();
      if (v == "auto") {
        o.progress = progress_mode::automatic;
      } else if (v == "always") {
        o.progress = progress_mode::always;
      } else if (v == "never") {
        o.progress = progress_mode::never;
      } else {
        cl.fail(fmt::format("--progress must be auto, always or never, got \"{}\"",
                            gpumem::detail::printable_excerpt(v)));
      }
    } else if (cl.positional()) {
      o.trace_paths.push_back(cl.arg());
    } else {
      cl.fail(fmt::format("unknown option {}", gpumem::detail::printable_excerpt(cl.arg())));
    }
  }
  if (o.trace_paths.empty()) cl.fail("no trace given");
  o.trace_path = o.trace_paths.front();
  if (o.trace_paths.size() > 1 || o.all_devices) {
    for (const std::string& p : o.trace_paths) {
      if (p == "-") cl.fail("standard input (-) is read alone: give one trace");
    }
    const std::pair<const std::string*, const char*> single[] = {
        {&o.plot_path, "--plot"},
        {&o.export_path, "--export-snapshot"},
        {&o.convert_path, "--convert"},
        {&o.timeline_path, "--timeline"}};
    for (const auto& [path, flag] : single) {
      if (!path->empty()) {
        cl.fail(fmt::format("{} writes one trace's file: give one trace and one device", flag));
      }
    }
  }
  if (o.trace_path == "-" && o.allocator != "gpumem") {
    cl.fail(fmt::format("--allocator {} reads the trace from a file, not from standard input",
                        o.allocator));
  }
  if (o.allocator != "gpumem") {
    if (!o.plot_path.empty()) cl.fail("--plot is only for --allocator gpumem");
    if (!o.export_path.empty()) cl.fail("--export-snapshot is only for --allocator gpumem");
    if (!o.timeline_path.empty()) cl.fail("--timeline is only for --allocator gpumem");
    if (o.steps != 0) cl.fail("--steps is only for --allocator gpumem");
  }
  if (o.steps != 0 && (!o.plot_path.empty() || !o.export_path.empty() || o.find_min_memory)) {
    cl.fail("--steps does not combine with --plot, --export-snapshot or --find-min-memory");
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
        cl.fail(fmt::format("bad configuration \"{}\": {}", gpumem::detail::printable_excerpt(text),
                            e.what()));
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
      cl.fail(fmt::format("\"{}\" is the trace being read: write the output to another file",
                          gpumem::detail::printable(*output)));
    }
  }
  return o;
}

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

}  // namespace gpumem_replay
