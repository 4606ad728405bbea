// What pytorch.org/memory_viz draws from gpumem's exports (gpumem-replay --export-snapshot): for
// each policy, on hand-built traces, the bundled traces, the real snapshots and the quick start's
// out-of-memory run, the memory is rebuilt at every event the way memory_viz's "Allocator State
// History" does it (from the final segments, undoing the events from the last one back), and
//   - every undone segment event finds what it undoes, and every block lies inside a segment;
//   - the reserved memory it shows (the sum of the segments) is the replay's reserved memory after
//     the trace event that made the exported event: at every block event, and after the last
//     exported event of each trace event;
//   - the oom event is there when the replay ran out of memory, with the device's free memory.
// tests/replay_cli/memory_viz_check.py does the same rebuild in Python on gpumem-replay's files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gpumem/trace/pytorch_snapshot.hpp"
#include "gpumem/trace/replay.hpp"
#include "gpumem/trace/trace_io.hpp"

namespace {

using gpumem::allocation_trace;
using gpumem::trace_event;
using gpumem::trace_event_kind;
using gpumem::detail::pickle_value;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

std::int64_t get_int(const pickle_value& d, std::string_view key) {
  const pickle_value* v = d.find(key);
  if (v == nullptr || !v->is_int()) throw std::runtime_error("no int '" + std::string(key) + "'");
  return v->as_int();
}

std::string get_str(const pickle_value& d, std::string_view key) {
  const pickle_value* v = d.find(key);
  if (v == nullptr || !v->is_str()) throw std::runtime_error("no str '" + std::string(key) + "'");
  return v->as_str();
}

struct viz_event {
  std::string action;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::int64_t stream = 0;
  std::size_t exported = 0;  // index in the exported device trace
};

struct viz_result {
  std::vector<std::uint64_t> reserved;  // per exported event: memory_viz's reserved memory there
  std::vector<std::string> errors;
};

// memory_viz's rebuild (simulate_memory), at every position in one backward pass.
viz_result rebuild(const pickle_value& snapshot) {
  struct seg {
    std::uint64_t addr, size;
    std::int64_t stream;
  };
  std::vector<seg> segs;                          // by address
  std::map<std::uint64_t, std::uint64_t> blocks;  // addr -> size
  viz_result out;
  auto sort_segs = [&] {
    std::sort(segs.begin(), segs.end(), [](const seg& a, const seg& b) { return a.addr < b.addr; });
  };
  for (const pickle_value& s : snapshot.find("segments")->as_list()) {
    segs.push_back({static_cast<std::uint64_t>(get_int(s, "address")),
                    static_cast<std::uint64_t>(get_int(s, "total_size")), get_int(s, "stream")});
    std::uint64_t addr = segs.back().addr;
    for (const pickle_value& b : s.find("blocks")->as_list()) {
      const std::string state = get_str(b, "state");
      const auto size = static_cast<std::uint64_t>(get_int(b, "size"));
      if (state == "active_allocated" || state == "active_pending_free") blocks[addr] = size;
      addr += size;
    }
    if (addr != segs.back().addr + segs.back().size) {
      out.errors.push_back("a segment's blocks do not cover it");
    }
  }
  sort_segs();
  // The events, free_requested + free_completed of one address merged into 'free'.
  std::vector<viz_event> events;
  const auto& traces = snapshot.find("device_traces")->as_list();
  const auto& raw = traces.front().as_list();
  for (std::size_t i = 0; i < raw.size(); ++i) {
    viz_event e;
    e.action = get_str(raw[i], "action");
    e.exported = i;
    if (e.action != "oom") e.addr = static_cast<std::uint64_t>(get_int(raw[i], "addr"));
    e.size = static_cast<std::uint64_t>(get_int(raw[i], "size"));
    e.stream = get_int(raw[i], "stream");
    if (e.action == "free_completed" && !events.empty() &&
        events.back().action == "free_requested" && events.back().addr == e.addr) {
      events.back().action = "free";
      continue;
    }
    events.push_back(e);
  }
  auto containing = [&](std::uint64_t lo, std::uint64_t hi) -> std::ptrdiff_t {
    for (std::size_t k = 0; k < segs.size(); ++k) {
      if (segs[k].addr <= lo && hi <= segs[k].addr + segs[k].size) {
        return static_cast<std::ptrdiff_t>(k);
      }
    }
    return -1;
  };
  auto total = [&] {
    std::uint64_t t = 0;
    for (const seg& s : segs) t += s.size;
    return t;
  };
  auto fail = [&](std::size_t i, const std::string& what) {
    if (out.errors.size() < 10) out.errors.push_back("event " + std::to_string(i) + ": " + what);
  };
  for (const auto& [addr, size] : blocks) {
    if (containing(addr, addr + size) < 0) fail(raw.size(), "a final block is in no segment");
  }
  out.reserved.assign(raw.size(), 0);
  for (std::size_t n = events.size(); n-- > 0;) {
    const viz_event& e = events[n];
    // Position n (and the free_completed merged into it) shows the state before undoing it.
    out.reserved[e.exported] = total();
    if (e.action == "free" && e.exported + 1 < raw.size()) out.reserved[e.exported + 1] = total();
    const std::uint64_t lo = e.addr;
    const std::uint64_t hi = e.addr + e.size;
    if (e.action == "segment_free" || e.action == "segment_unmap") {
      if (std::any_of(segs.begin(), segs.end(),
                      [&](const seg& s) { return s.addr < hi && lo < s.addr + s.size; })) {
        fail(e.exported, e.action + ": the range overlaps a segment");
      }
      segs.push_back({lo, e.size, e.stream});
      sort_segs();
      if (e.action == "segment_unmap") {  // merged with its neighbours of the same stream
        auto k = static_cast<std::size_t>(
            std::find_if(segs.begin(), segs.end(), [&](const seg& s) { return s.addr == lo; }) -
            segs.begin());
        if (k + 1 < segs.size() && segs[k].addr + segs[k].size == segs[k + 1].addr &&
            segs[k].stream == segs[k + 1].stream) {
          segs[k].size += segs[k + 1].size;
          segs.erase(segs.begin() + static_cast<std::ptrdiff_t>(k) + 1);
        }
        if (k > 0 && segs[k - 1].addr + segs[k - 1].size == segs[k].addr &&
            segs[k - 1].stream == segs[k].stream) {
          segs[k - 1].size += segs[k].size;
          segs.erase(segs.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
    } else if (e.action == "segment_alloc" || e.action == "segment_map") {
      const std::ptrdiff_t k = containing(lo, hi);
      if (k < 0 ||
          (e.action == "segment_alloc" && (segs[static_cast<std::size_t>(k)].addr != lo ||
                                           segs[static_cast<std::size_t>(k)].size != e.size))) {
        fail(e.exported, e.action + ": no segment to undo it in");
        continue;
      }
      seg& s = segs[static_cast<std::size_t>(k)];
      const std::uint64_t s_end = s.addr + s.size;
      if (s.addr == lo && s_end == hi) {
        segs.erase(segs.begin() + k);
      } else if (s.addr == lo) {
        s.addr = hi;
        s.size = s_end - hi;
      } else if (s_end == hi) {
        s.size = lo - s.addr;
      } else {
        s.size = lo - s.addr;
        segs.push_back({hi, s_end - hi, s.stream});
        sort_segs();
      }
      for (const auto& [addr, size] : blocks) {
        if (addr < hi && lo < addr + size) fail(e.exported, "a block loses its segment");
      }
    } else if (e.action == "alloc") {
      if (blocks.erase(e.addr) == 0) fail(e.exported, "alloc of no block");
    } else if (e.action == "free_requested") {
      if (blocks.count(e.addr) == 0) fail(e.exported, "free_requested of no block");
    } else if (e.action == "free" || e.action == "free_completed") {
      blocks[e.addr] = e.size;
      if (containing(lo, hi) < 0) fail(e.exported, "a freed block is in no segment");
    }
  }
  return out;
}

struct exported {
  gpumem::replay_result result;  // with samples and the snapshot trace
  std::string bytes;             // the pickle
};

exported export_replay(const allocation_trace& t, const std::string& config,
                       std::size_t device_memory) {
  const gpumem::compiled_trace c = gpumem::compile_trace(t);
  gpumem::replay_options ro;
  ro.device_memory = device_memory;
  ro.config = gpumem::allocator_config::parse(config);
  ro.record_history = true;
  ro.record_samples = true;
  if (!c.ops.empty()) ro.snapshot_after_event = c.ops.size() - 1;
  exported e;
  e.result = gpumem::replay_trace(c, ro);
  std::ostringstream out;
  gpumem::write_pytorch_snapshot(out, e.result.segments, e.result.snapshot_trace,
                                 e.result.history.recorded_config);
  e.bytes = out.str();
  return e;
}

// The checks of this file's header on one export; returns the number of events checked.
std::size_t check_export(const allocation_trace& t, const std::string& config,
                         std::size_t device_memory) {
  SCOPED_TRACE(config);
  const exported e = export_replay(t, config, device_memory);
  const gpumem::replay_result& r = e.result;
  const pickle_value snapshot = gpumem::detail::unpickle(e.bytes);
  const viz_result viz = rebuild(snapshot);
  for (const std::string& error : viz.errors) ADD_FAILURE() << error;
  const auto& events = snapshot.find("device_traces")->as_list().front().as_list();
  EXPECT_EQ(events.size(), r.snapshot_trace.size());
  EXPECT_EQ(r.snapshot_trace_event.size(), r.snapshot_trace.size());
  // The reserved memory after each trace event: the replay's samples; at the OOM, the segments.
  std::uint64_t at_oom = 0;
  for (const auto& s : r.segments) at_oom += s.reserved_size;
  auto expected = [&](std::size_t event) -> std::uint64_t {
    if (r.oom_event_index && event == *r.oom_event_index) return at_oom;
    return r.samples.at(event).reserved;
  };
  std::size_t mismatches = 0;
  for (std::size_t k = 0; k < events.size() && mismatches < 5; ++k) {
    const std::string action = get_str(events[k], "action");
    const bool last_of_event =
        k + 1 == events.size() || r.snapshot_trace_event[k + 1] != r.snapshot_trace_event[k];
    const bool block_event = action.rfind("segment", 0) != 0 && action != "oom";
    if (!last_of_event && !block_event) continue;
    const std::uint64_t want = expected(r.snapshot_trace_event[k]);
    if (viz.reserved[k] != want) {
      ++mismatches;
      ADD_FAILURE() << "exported event " << k << " (" << action << ", trace event "
                    << r.snapshot_trace_event[k] << "): memory_viz shows " << viz.reserved[k]
                    << " bytes reserved, the replay " << want;
    }
  }
  // The final segments are the reserved memory at the end (or at the OOM).
  std::uint64_t final_reserved = 0;
  for (const pickle_value& s : snapshot.find("segments")->as_list()) {
    final_reserved += static_cast<std::uint64_t>(get_int(s, "total_size"));
    EXPECT_EQ(s.find("is_expandable")->as_bool(), config.find("classic") == std::string::npos);
  }
  EXPECT_EQ(final_reserved, r.oom_event_index ? at_oom : r.samples.back().reserved);
  // An oom event exactly when the replay ran out of memory, last, with the device's free memory.
  const bool has_oom = !events.empty() && get_str(events.back(), "action") == "oom";
  EXPECT_EQ(has_oom, r.oom_event_index.has_value());
  if (has_oom) {
    EXPECT_EQ(static_cast<std::uint64_t>(get_int(events.back(), "size")), r.oom_request_bytes);
    EXPECT_NE(events.back().find("device_free"), nullptr);
    EXPECT_EQ(events.back().find("addr"), nullptr);
  }
  return events.size();
}

const std::string policies[] = {"policy:classic", "policy:expandable", "policy:stitch"};

std::string source_dir() {
  return std::filesystem::path(GPUMEM_SOURCE_DIR).string();
}

allocation_trace example(const std::string& relative) {
  return gpumem::read_trace(source_dir() + "/" + relative);
}

// A trace that makes every policy give memory back: a classic out-of-memory retry (cached
// segments freed, then a larger one), empty_cache, and frees of blocks on shared pages (stitch).
allocation_trace churn_trace() {
  allocation_trace t;
  std::uint64_t addr = 0x1000;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
  auto alloc = [&](std::uint64_t size, std::uint64_t stream = 0) {
    t.events.push_back({trace_event_kind::alloc, addr, size, stream, gpumem::no_time});
    live.emplace_back(addr, size);
    addr += 0x1000;
  };
  auto free_at = [&](std::size_t i) {
    t.events.push_back(
        {trace_event_kind::free_requested, live[i].first, live[i].second, 0, gpumem::no_time});
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
  };
  for (int i = 0; i < 24; ++i) alloc((i % 4 + 1) * 7 * MiB + 4096, i % 5 == 0 ? 7 : 0);
  for (std::size_t i = live.size(); i-- > 0;) {
    if (i % 2 == 0) free_at(i);
  }
  for (int i = 0; i < 6; ++i) alloc(40 * MiB);  // needs the cached memory back on a small device
  for (int i = 0; i < 6; ++i) free_at(live.size() - 1);  // cached, then emptied
  t.events.push_back({trace_event_kind::empty_cache, 0, 0, 0, gpumem::no_time});
  for (int i = 0; i < 30; ++i) alloc((i % 7 + 1) * 300 * 1024);
  while (live.size() > 3) free_at(live.size() / 2);
  for (int i = 0; i < 10; ++i) alloc(96 * MiB);  // runs out on the small device
  return t;
}

}  // namespace

TEST(MemoryVizExport, HandBuiltChurn) {
  for (const std::string& p : policies) {
    check_export(churn_trace(), p, 8 * GiB);    // completes
    check_export(churn_trace(), p, 700 * MiB);  // out-of-memory paths
    // Both give memory back (empty_cache, the out-of-memory retry), and the small one runs out.
    for (const std::size_t device : {8 * GiB, 700 * MiB}) {
      const exported e = export_replay(churn_trace(), p, device);
      EXPECT_EQ(e.result.completed, device == 8 * GiB) << p;
      EXPECT_TRUE(std::any_of(e.result.snapshot_trace.begin(), e.result.snapshot_trace.end(),
                              [](const gpumem::snapshot_trace_entry& x) {
                                return x.action == gpumem::allocator_action::segment_free ||
                                       x.action == gpumem::allocator_action::segment_unmap;
                              }))
          << p;
    }
  }
}

TEST(MemoryVizExport, QuickStartOutOfMemoryRun) {
  // The quick start's demo: the GPT-2 step on a 3 GiB device; classic runs out of memory.
  const allocation_trace t = example("examples/traces/gpt2-small-b4-s512-ckpt.trace");
  for (const std::string& p : policies) EXPECT_GT(check_export(t, p, 3 * GiB), 1000u);
  const exported classic = export_replay(t, "policy:classic", 3 * GiB);
  EXPECT_TRUE(classic.result.oom_event_index.has_value());
}

TEST(MemoryVizExport, BundledTraces) {
  for (const char* name :
       {"examples/traces/resnet50-b32.trace", "examples/traces/llama-tiny-b4-s512-accum2.trace"}) {
    SCOPED_TRACE(name);
    const allocation_trace t = example(name);
    for (const std::string& p : policies) check_export(t, p, 80 * GiB);
  }
}

TEST(MemoryVizExport, RealSnapshots) {
  for (const char* name : {"examples/traces/real/transformer-forward-bf16.pickle",
                           "examples/traces/real/opt-zeroth-order-finetune.pickle"}) {
    SCOPED_TRACE(name);
    const allocation_trace t = example(name);
    for (const std::string& p : policies) check_export(t, p, 80 * GiB);
  }
}

// Under stitch a page mapped at two addresses counts once: the export's segments are the memory
// reserved memory counts, not every mapped range (which would show more than the device holds).
TEST(MemoryVizExport, StitchSegmentsAreReservedMemory) {
  const allocation_trace t = example("examples/traces/gpt2-small-b4-s512-ckpt.trace");
  const exported e = export_replay(t, "policy:stitch", 80 * GiB);
  std::uint64_t mapped = 0;
  std::uint64_t reserved = 0;
  for (const auto& s : e.result.segments) {
    mapped += s.mapped_size;
    reserved += s.reserved_size;
  }
  std::uint64_t exported_bytes = 0;
  const pickle_value snapshot = gpumem::detail::unpickle(e.bytes);
  for (const pickle_value& s : snapshot.find("segments")->as_list()) {
    exported_bytes += static_cast<std::uint64_t>(get_int(s, "total_size"));
  }
  EXPECT_EQ(exported_bytes, reserved);
  EXPECT_GT(mapped, reserved + GiB);  // pages mapped at two addresses (the whole ranges: 8 GiB)
  EXPECT_EQ(reserved, e.result.samples.back().reserved);
  RecordProperty("mapped_bytes", std::to_string(mapped));
  RecordProperty("reserved_bytes", std::to_string(reserved));
}
