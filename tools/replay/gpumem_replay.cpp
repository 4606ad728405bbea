// gpumem-replay — replays an allocation trace on a simulated GPU: does it run out of memory,
// where and why, how much memory each allocator configuration holds, and the smallest device on
// which it completes. Reads gpumem traces, PyTorch memory snapshots and RMM memory event logs.
//
// Exit status: 0 when the replays ran (whether or not they ran out of memory), 1 when a trace
// could not be read or a replay failed, 2 for a bad command line.
//
// This file reads the trace and runs the replays; the command line is in options.cpp, the replays
// on gpumem's allocator in gpumem_run.cpp and on a peer's in peer_process.cpp, what is printed in
// output.cpp and the files written in output_files.cpp.
#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "config_run.hpp"
#include "gpumem/detail/utf8.hpp"
#include "gpumem/error.hpp"
#include "gpumem/trace/pytorch_snapshot.hpp"
#include "gpumem/trace/replay.hpp"
#include "gpumem/trace/trace_io.hpp"
#include "gpumem_run.hpp"
#include "options.hpp"
#include "output.hpp"
#include "output_files.hpp"
#include "peer_process.hpp"

namespace gpumem_replay {
namespace {

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

/// The trace of o.trace_path (or standard input) for o.snapshot_device, which becomes the one
/// device a snapshot holds data for when none was given; o.devices_with_data lists them.
gpumem::allocation_trace read_input(options& o) {
  // "-" is standard input (replayed as many times as the flags ask: it is read once).
  if (o.trace_path != "-") {
    o.devices_with_data = snapshot_devices(o.trace_path);
    // A process writes its own GPU's snapshot (rank 3's device 3): its one device is the default.
    if (!o.snapshot_device_given && !o.all_devices && o.devices_with_data.size() == 1) {
      o.snapshot_device = o.devices_with_data.front();
    }
  }
  try {
    return o.trace_path == "-" ? gpumem::read_trace(std::cin, "standard input", o.snapshot_device)
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
}

/// What the trace settles of the options: the device (the recording's when it ran out of memory
/// and none was given) less --overhead, and the configurations a PyTorch snapshot replays.
void fit_options_to_trace(options& o, const gpumem::allocation_trace& trace) {
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
}

/// One input (o.trace_path, o.snapshot_device): read, replayed under each configuration, and its
/// results printed, or handed back to run_all (json_records, collected) when not null.
int run(options o, std::vector<json>* json_records_out, std::vector<replayed_input>* collected) {
  const bool peer = o.allocator != "gpumem";
  const std::string peer_file = peer ? peer_path() : std::string();
  if (peer) check_peer(o, peer_file);
  const auto read_start = std::chrono::steady_clock::now();
  const gpumem::allocation_trace trace = read_input(o);
  if (!o.convert_path.empty()) {
    write_conversion(o, trace);
    return 0;
  }
  fit_options_to_trace(o, trace);
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
    run_gpumem(o, run, compiled);
  }

  if (!o.json && peer) print_trace_header(o, trace, compiled);
  if (collected != nullptr) {
    std::string label = o.trace_path;
    if (trace.source == "pytorch-snapshot" && (o.all_devices || o.snapshot_device != 0)) {
      label += fmt::format(" device {}", o.snapshot_device);
    }
    collected->push_back({std::move(label), runs, o.device_memory, compiled.recorded_oom_event});
  }
  if (o.json) {
    std::vector<json> records = json_records(o, runs, compiled, trace);
    if (json_records_out == nullptr) {
      print_json_array(records);
    } else {
      std::move(records.begin(), records.end(), std::back_inserter(*json_records_out));
    }
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
    return run(o, nullptr, nullptr);
  }
  std::vector<json> records;
  std::vector<replayed_input> collected;
  int status = 0;
  for (const auto& [path, device] : inputs) {
    options o = given;
    o.trace_path = path;
    o.snapshot_device = device;
    if (!given.json) {
      fmt::print("=== {}{} ===\n", gpumem::detail::printable(path),
                 given.all_devices ? fmt::format(", device {}", device) : std::string());
    }
    try {
      status = std::max(status, run(o, given.json ? &records : nullptr, &collected));
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
    print_json_array(records);
  } else if (!collected.empty()) {
    print_summary(given, collected, inputs.size());
  }
  return status;
}

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

}  // namespace
}  // namespace gpumem_replay

int main(int argc, char** argv) {
  gpumem_replay::reserve_standard_descriptors();
  const gpumem_replay::options o = gpumem_replay::parse_command_line(argc, argv);
  const bool writes_stdout = o.convert_path.empty();
  // Messages may quote the input (a trace's text, a file name): printed escaped.
  auto report = [](const char* prefix, const char* what) {
    std::fprintf(stderr, "gpumem-replay: %s%s\n", prefix, gpumem::detail::printable(what).c_str());
  };
  try {
    return gpumem_replay::check_output(gpumem_replay::run_all(o), writes_stdout);
  } catch (const gpumem::trace_error& e) {
    report("", e.what());
  } catch (const std::system_error& e) {
    report("", e.what());
  } catch (const std::exception& e) {
    report("replay failed: ", e.what());
  }
  return gpumem_replay::check_output(1, writes_stdout);
}
