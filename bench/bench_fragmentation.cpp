// gpumem_bench_fragmentation — how much memory each allocator policy reserves for the same work.
//
// Runs the synthetic workloads of bench/workloads.hpp against caching_allocator<simulated_device>
// under several configurations (policy:classic, policy:expandable, policy:stitch by default, plus
// any --config given) and reports, per (workload, configuration): peak requested bytes (counted
// by the workload itself), peak reserved bytes (stats().reserved_bytes[all].peak), their ratio
// (1.00 is the limit: no fragmentation), the allocator's device allocation / release calls, every
// simulated-device call kind that was made, and whether the workload completed or ran out of
// memory. Each run gets a fresh simulated device, so the numbers are exact and repeatable.
//
// A configuration whose policy this build does not provide (the constructor throws config_error,
// or the allocator runs another policy than the configuration asks for) is shown as
// "n/a (policy not available)", so the tool works before and after the VMM policies land.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "command_line.hpp"
#include "gpumem/gpumem.hpp"
#include "gpumem/trace/native_format.hpp"
#include "workload_traces.hpp"
#include "workloads.hpp"

namespace {

using gpumem::bench::workload_info;
using device = gpumem::simulated_device;
using allocator = gpumem::caching_allocator<device>;

constexpr std::string_view k_default_configs[] = {"policy:classic", "policy:expandable",
                                                  "policy:stitch"};

struct config_entry {
  std::string text;  // as given, used as the label
  gpumem::allocator_config config;
};

struct options {
  std::size_t device_memory = std::size_t{80} << 30;
  std::uint64_t seed = 1;
  bool markdown = false;
  bool default_configs = true;
  std::vector<std::string> config_texts;
  std::vector<const workload_info*> workloads;
  std::string trace_dir;  // --write-traces: write the workloads as traces there and exit
};

enum class outcome { completed, out_of_memory, unavailable, error };

struct run_result {
  outcome status = outcome::completed;
  std::string note;  // OOM point, error text, or why the policy is not available
  std::size_t peak_requested = 0;
  std::size_t peak_reserved = 0;
  std::size_t allocator_peak_requested = 0;  // stats().requested_bytes[all].peak, cross-check
  std::int64_t device_alloc = 0;
  std::int64_t device_free = 0;
  gpumem::call_counters calls;
  std::size_t allocs = 0;
  double seconds = 0;
};

void print_help() {
  std::string names;
  for (const workload_info& w : gpumem::bench::all_workloads()) {
    names += fmt::format("  {:<24}{}\n", w.name, w.summary);
  }
  std::printf(
      "usage: gpumem_bench_fragmentation [options]\n"
      "\n"
      "Runs synthetic workloads against gpumem's caching allocator on a simulated GPU under\n"
      "several configurations and reports peak requested vs peak reserved memory and device "
      "calls.\n"
      "\n"
      "options:\n"
      "  --workload NAME        run only this workload (repeatable; default: all)\n"
      "  --config TEXT          also run this configuration, in allocator_config::parse syntax,\n"
      "                         e.g. \"policy:classic,max_split_size_mb:128\" (repeatable). Name\n"
      "                         the policy: without one the allocator picks its default policy\n"
      "  --no-default-configs   run only the --config configurations (default: policy:classic,\n"
      "                         policy:expandable and policy:stitch, then the --config ones)\n"
      "  --device-memory SIZE   simulated device capacity, e.g. 80GiB (default 80GiB)\n"
      "  --seed N               workload seed (default 1)\n"
      "  --markdown             print a Markdown table\n"
      "  --write-traces DIR     write each workload as a gpumem trace, DIR/<workload>.trace, for\n"
      "                         gpumem-replay, and exit\n"
      "  --list                 list the workloads and exit\n"
      "  --help                 show this help and exit\n"
      "\n"
      "workloads:\n%s"
      "\n"
      "Exit status: 0 when every run completed, ran out of memory, or was not available; 1 when a\n"
      "run failed otherwise; 2 for a bad command line.\n",
      names.c_str());
}

options parse_command_line(int argc, char** argv) {
  options opts;
  gpumem_tools::command_line cl(argc, argv, "gpumem_bench_fragmentation");
  while (cl.next()) {
    if (cl.is("--help") || cl.is("-h")) {
      cl.no_value();
      print_help();
      std::exit(0);
    } else if (cl.is("--list")) {
      cl.no_value();
      for (const workload_info& w : gpumem::bench::all_workloads()) {
        std::printf("%-24s %s\n", std::string(w.name).c_str(), std::string(w.summary).c_str());
      }
      std::exit(0);
    } else if (cl.is("--markdown")) {
      cl.no_value();
      opts.markdown = true;
    } else if (cl.is("--no-default-configs")) {
      cl.no_value();
      opts.default_configs = false;
    } else if (cl.is("--workload")) {
      const std::string name = cl.value();
      const workload_info* w = gpumem::bench::find_workload(name);
      if (w == nullptr) cl.fail(fmt::format("unknown workload \"{}\"; --list names them", name));
      if (std::find(opts.workloads.begin(), opts.workloads.end(), w) == opts.workloads.end()) {
        opts.workloads.push_back(w);
      }
    } else if (cl.is("--config")) {
      opts.config_texts.push_back(cl.value());
    } else if (cl.is("--device-memory")) {
      opts.device_memory = cl.size_value();
      if (opts.device_memory == 0) cl.fail("--device-memory must be above 0");
    } else if (cl.is("--write-traces")) {
      opts.trace_dir = cl.value();
      if (opts.trace_dir.empty()) cl.fail("--write-traces needs a directory");
    } else if (cl.is("--seed")) {
      opts.seed = cl.unsigned_value();
    } else {
      cl.unknown();
    }
  }
  if (opts.workloads.empty()) {
    for (const workload_info& w : gpumem::bench::all_workloads()) opts.workloads.push_back(&w);
  }
  if (!opts.default_configs && opts.config_texts.empty()) {
    cl.fail("--no-default-configs leaves no configuration: add --config");
  }
  return opts;
}

std::vector<config_entry> build_configs(const options& opts) {
  std::vector<std::string> texts;
  if (opts.default_configs)
    texts.assign(std::begin(k_default_configs), std::end(k_default_configs));
  texts.insert(texts.end(), opts.config_texts.begin(), opts.config_texts.end());
  std::vector<config_entry> out;
  for (const std::string& text : texts) {
    try {
      out.push_back({text, gpumem::allocator_config::parse(text)});
    } catch (const gpumem::config_error& e) {
      gpumem_tools::usage_error("gpumem_bench_fragmentation",
                                fmt::format("--config \"{}\": {}", text, e.what()));
    }
  }
  return out;
}

run_result run_one(const workload_info& w, const gpumem::allocator_config& config,
                   std::size_t device_memory, std::uint64_t seed) {
  run_result r;
  device gpu(device_memory);
  std::optional<allocator> alloc;
  try {
    alloc.emplace(gpu, config);
  } catch (const gpumem::config_error& e) {
    r.status = outcome::unavailable;
    r.note = e.what();
    return r;
  }
  const gpumem::allocator_policy wanted = config.effective_policy(device::supports_vmm);
  if (alloc->policy() != wanted) {
    r.status = outcome::unavailable;
    r.note = fmt::format("policy:{} was asked for, but the allocator runs policy:{}",
                         gpumem::to_string(wanted), gpumem::to_string(alloc->policy()));
    return r;
  }

  std::unordered_map<gpumem::bench::stream_id, device::stream_type> streams;
  auto stream_of = [&](gpumem::bench::stream_id id) {
    if (id == 0) return gpu.default_stream();
    auto it = streams.find(id);
    if (it == streams.end()) it = streams.emplace(id, gpu.create_stream()).first;
    return it->second;
  };
  allocator& a = *alloc;
  gpumem::bench::workload_context ctx(gpumem::bench::allocator_ops{
      [&](std::size_t bytes, gpumem::bench::stream_id s) {
        return a.allocate(bytes, stream_of(s));
      },
      [&](void* p) { a.deallocate(p); },
      [&](void* p, gpumem::bench::stream_id s) { a.record_stream(p, stream_of(s)); },
      [&] { a.empty_cache(); }});

  const auto start = std::chrono::steady_clock::now();
  try {
    w.run(ctx, seed);
  } catch (const gpumem::out_of_memory&) {
    r.status = outcome::out_of_memory;
    r.note = fmt::format("OOM at allocation {} ({})", ctx.num_allocs() + 1,
                         gpumem::format_bytes(ctx.attempted_bytes()));
  } catch (const std::exception& e) {
    r.status = outcome::error;
    r.note = fmt::format("error at allocation {}: {}", ctx.num_allocs() + 1, e.what());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const gpumem::device_stats s = a.stats();
  r.peak_requested = ctx.peak_requested();
  r.peak_reserved = static_cast<std::size_t>(s.reserved_bytes[0].peak);
  r.allocator_peak_requested = static_cast<std::size_t>(s.requested_bytes[0].peak);
  r.device_alloc = s.num_device_alloc;
  r.device_free = s.num_device_free;
  r.calls = gpu.counters();  // before the allocator's destructor returns its segments
  r.allocs = ctx.num_allocs();
  return r;
}

// ---- output

std::size_t display_width(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // count UTF-8 code points
  return n;
}

std::string pad(std::string_view s, std::size_t width) {
  std::string out(s);
  out.append(width > display_width(s) ? width - display_width(s) : 0, ' ');
  return out;
}

std::string device_calls(const gpumem::call_counters& c) {
  std::string out;
  for (gpumem::call_kind k : gpumem::all_call_kinds) {
    if (c[k] == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", gpumem::call_kind_name(k), c[k]);
  }
  return out.empty() ? "none" : out;
}

std::vector<std::string> row_for(const workload_info& w, const config_entry& c, const run_result& r,
                                 bool markdown) {
  const std::string dash = "—";
  const std::string config = markdown ? "`" + c.text + "`" : c.text;
  if (r.status == outcome::unavailable) {
    return {
        std::string(w.name), config, "n/a (policy not available)", dash, dash, dash, dash, dash};
  }
  std::string result = r.status == outcome::completed ? "completed" : r.note;
  const double ratio = r.peak_requested == 0 ? 0.0
                                             : static_cast<double>(r.peak_reserved) /
                                                   static_cast<double>(r.peak_requested);
  return {std::string(w.name),
          config,
          result,
          gpumem::format_bytes(r.peak_requested),
          gpumem::format_bytes(r.peak_reserved),
          fmt::format("{:.3f}", ratio),
          fmt::format("{} / {}", r.device_alloc, r.device_free),
          device_calls(r.calls)};
}

void print_table(const std::vector<std::vector<std::string>>& rows, bool markdown) {
  const std::vector<std::string> header{"workload",
                                        "config",
                                        "result",
                                        "peak requested",
                                        "peak reserved",
                                        "reserved ÷ requested",
                                        "device alloc / free",
                                        "device calls"};
  if (markdown) {
    auto line = [](const std::vector<std::string>& cells) {
      std::string out = "|";
      for (const std::string& cell : cells) out += " " + cell + " |";
      std::puts(out.c_str());
    };
    line(header);
    std::string sep = "|";
    for (std::size_t i = 0; i < header.size(); ++i)
      sep += (i >= 3 && i <= 6) ? " ---: |" : " --- |";
    std::puts(sep.c_str());
    for (const auto& row : rows) line(row);
    return;
  }
  std::vector<std::size_t> width(header.size());
  for (std::size_t i = 0; i < header.size(); ++i) width[i] = display_width(header[i]);
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i)
      width[i] = std::max(width[i], display_width(row[i]));
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      out += i + 1 == cells.size() ? cells[i] : pad(cells[i], width[i]) + "  ";
    }
    std::puts(out.c_str());
  };
  line(header);
  std::vector<std::string> rule;
  for (std::size_t i = 0; i < header.size(); ++i) rule.emplace_back(width[i], '-');
  line(rule);
  for (const auto& row : rows) line(row);
}

}  // namespace

int main(int argc, char** argv) {
  const options opts = parse_command_line(argc, argv);
  const std::vector<config_entry> configs = build_configs(opts);

  if (!opts.trace_dir.empty()) {
    for (const workload_info* w : opts.workloads) {
      const std::string path = opts.trace_dir + "/" + std::string(w->name) + ".trace";
      std::ofstream out(path, std::ios::binary);
      gpumem::write_native_trace(out, gpumem::bench::record_workload(*w, opts.seed));
      out.close();
      if (!out) {
        std::fprintf(stderr, "gpumem_bench_fragmentation: cannot write %s\n", path.c_str());
        return 1;
      }
      std::printf("wrote %s\n", path.c_str());
    }
    return 0;
  }

  if (!opts.markdown) {
    std::printf("simulated device: %s, seed %llu\n\n",
                gpumem::format_bytes(opts.device_memory).c_str(),
                static_cast<unsigned long long>(opts.seed));
  }

  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> notes;
  int status = 0;
  for (const workload_info* w : opts.workloads) {
    for (const config_entry& c : configs) {
      run_result r;
      try {
        r = run_one(*w, c.config, opts.device_memory, opts.seed);
      } catch (const std::exception& e) {  // the device or allocator could not be set up
        r.status = outcome::error;
        r.note = fmt::format("error: {}", e.what());
      }
      if (r.status == outcome::error) status = 1;
      if (r.status == outcome::unavailable) {
        const std::string n = fmt::format("{}: {}", c.text, r.note);
        if (std::find(notes.begin(), notes.end(), n) == notes.end()) notes.push_back(n);
      } else if (r.allocator_peak_requested != r.peak_requested) {
        std::fprintf(stderr,
                     "warning: %s under %s: the workload counted a peak of %zu requested bytes, "
                     "the allocator's requested_bytes peak is %zu\n",
                     std::string(w->name).c_str(), c.text.c_str(), r.peak_requested,
                     r.allocator_peak_requested);
        status = 1;
      }
      if (!opts.markdown && r.status != outcome::unavailable) {
        std::fprintf(stderr, "%s under %s: %zu allocations, %.2f s\n", std::string(w->name).c_str(),
                     c.text.c_str(), r.allocs, r.seconds);
      }
      rows.push_back(row_for(*w, c, r, opts.markdown));
    }
  }
  print_table(rows, opts.markdown);
  if (!opts.markdown && !notes.empty()) {
    std::puts("");
    for (const std::string& n : notes) std::printf("not available: %s\n", n.c_str());
  }
  return status;
}
