// gpumem-replay — the files it writes: the trace converted, the timeline (CSV or JSON), the SVG
// plot and the PyTorch memory snapshot.
#include "output_files.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "gpumem/detail/utf8.hpp"
#include "gpumem/report/memory_plot.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/pytorch_snapshot.hpp"
#include "gpumem/trace/rmm_csv.hpp"
#include "json_text.hpp"
#include "output.hpp"

namespace gpumem_replay {

namespace {

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

}  // namespace

void write_conversion(const options& o, const gpumem::allocation_trace& trace) {
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
}

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
  auto time_of = [&](std::uint64_t event) -> std::optional<std::int64_t> {
    if (c.time_us.empty() || n == 0) return std::nullopt;
    const std::int64_t t = c.time_us[static_cast<std::size_t>(event % n)];
    if (t == gpumem::no_time) return std::nullopt;
    return t;
  };
  if (csv) {
    out << "config,policy,event,requested_bytes,allocated_bytes,reserved_bytes,time_us\n";
    for (const config_run& run : runs) {
      // A CSV field: quoted, quotes doubled.
      std::string label = "\"";
      for (char ch : run.text) label += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      label += "\"";
      for (const gpumem::replay_sample& s : run.result.samples) {
        const std::optional<std::int64_t> t = time_of(s.event_index);
        out << label << ',' << run.result.policy << ',' << s.event_index << ',' << s.requested
            << ',' << s.allocated << ',' << s.reserved << ','
            << (t ? std::to_string(*t) : std::string()) << '\n';
      }
    }
  } else {
    out << "[\n";
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const config_run& run = runs[i];
      auto column = [&](auto field) {
        json list = json::array();
        for (const gpumem::replay_sample& s : run.result.samples) list.push_back(field(s));
        return list;
      };
      json record;
      record["config"] = run.text;
      record["policy"] = run.result.policy;
      record["completed"] = run.result.completed;
      record["event"] = column([](const gpumem::replay_sample& s) { return s.event_index; });
      record["requested_bytes"] =
          column([](const gpumem::replay_sample& s) { return s.requested; });
      record["allocated_bytes"] =
          column([](const gpumem::replay_sample& s) { return s.allocated; });
      record["reserved_bytes"] = column([](const gpumem::replay_sample& s) { return s.reserved; });
      record["time_us"] =
          c.time_us.empty() ? json(nullptr) : column([&](const gpumem::replay_sample& s) {
            const std::optional<std::int64_t> t = time_of(s.event_index);
            return t ? json(*t) : json(nullptr);
          });
      out << "  " << json_line(record) << (i + 1 < runs.size() ? "," : "") << "\n";
    }
    out << "]\n";
  }
  out.close();
  if (!out) {
    throw std::system_error(errno, std::generic_category(),
                            "cannot write '" + o.timeline_path + "'");
  }
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

}  // namespace gpumem_replay
