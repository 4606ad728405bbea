// PyTorch memory snapshots: the real recordings in examples/traces/real read back to the figures
// their README gives (event counts, PyTorch's peak reserved and requested), the traces obey
// docs/trace_format.md's validity rules, gpumem's export reads back unchanged (and loads in
// Python), and malformed snapshots are trace_errors that say where.
#include "gpumem/trace/pytorch_snapshot.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "gpumem/device/simulated_device.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/replay.hpp"
#include "support/sim.hpp"
#include "support/timing.hpp"

namespace {

using gpumem::allocation_trace;
using gpumem::block_snapshot;
using gpumem::block_state;
using gpumem::no_time;
using gpumem::segment_snapshot;
using gpumem::simulated_stream;
using gpumem::trace_error;
using gpumem::trace_event;
using gpumem::trace_event_kind;
using gpumem::detail::pickle_value;
using dict = pickle_value::dict_items;
using seq = pickle_value::sequence;
namespace fs = std::filesystem;

// --- Where the real traces are (examples/traces/real; GPUMEM_SHARED_TRACES first)
// ------------------------------------------------------------------

std::optional<std::string> real_trace(const std::string& name) {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("GPUMEM_SHARED_TRACES"); env != nullptr && *env != '\0') {
    dirs.emplace_back(env);
  }
  dirs.emplace_back(GPUMEM_REAL_TRACES);
  for (const fs::path& dir : dirs) {
    std::error_code ec;
    if (fs::is_regular_file(dir / name, ec)) return (dir / name).string();
  }
  return std::nullopt;
}

#define GPUMEM_REAL_TRACE(var, name)                                                        \
  const std::optional<std::string> var##_found = real_trace(name);                          \
  if (!var##_found) {                                                                       \
    GTEST_FAIL() << name << " not found in examples/traces/real (or GPUMEM_SHARED_TRACES)"; \
  }                                                                                         \
  const std::string& var = *var##_found

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// --- What a trace says --------------------------------------------------------------------------

// docs/trace_format.md: each free_requested and record_stream names a live block, each
// free_completed a block whose free was requested, no alloc names a live block. `strict` also
// refuses an alloc at an address whose free has not completed (PyTorch never reuses such memory).
std::string first_violation(const allocation_trace& t, bool strict = true) {
  enum class state { live, freeing };
  std::unordered_map<std::uint64_t, state> blocks;
  if (t.initial_events > t.events.size()) return "initial_events beyond the events";
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const trace_event& e = t.events[i];
    const std::string at =
        "event " + std::to_string(i) + " (" + std::string(gpumem::to_string(e.kind)) + "): ";
    if (i < t.initial_events && e.kind != trace_event_kind::alloc) return at + "initial, not alloc";
    const auto it = blocks.find(e.address);
    switch (e.kind) {
      case trace_event_kind::alloc:
        if (e.size == 0) return at + "0 bytes";
        if (it != blocks.end() && (strict || it->second == state::live)) return at + "live block";
        blocks[e.address] = state::live;
        break;
      case trace_event_kind::free_requested:
        if (it == blocks.end() || it->second != state::live) return at + "not live";
        it->second = state::freeing;
        break;
      case trace_event_kind::free_completed:
        if (it == blocks.end() || it->second != state::freeing) return at + "free not requested";
        blocks.erase(it);
        break;
      case trace_event_kind::record_stream:
        if (it == blocks.end() || it->second != state::live) return at + "not live";
        break;
      case trace_event_kind::segment_alloc:
      case trace_event_kind::segment_free:
      case trace_event_kind::empty_cache:
        break;
    }
  }
  return "";
}

struct recorded_figures {
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_requested = 0;
  std::map<trace_event_kind, std::size_t> counts;  // events after the initial ones
  std::set<std::uint64_t> streams;
};

// What PyTorch did: reserved from recorded_initial_reserved through the segment events, requested
// as the sum of live requested sizes (down at free_requested).
recorded_figures figures(const allocation_trace& t) {
  recorded_figures f;
  std::int64_t reserved = static_cast<std::int64_t>(t.recorded_initial_reserved.value_or(0));
  std::int64_t requested = 0;
  f.peak_reserved = static_cast<std::uint64_t>(reserved);
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const trace_event& e = t.events[i];
    const auto size = static_cast<std::int64_t>(e.size);
    if (i >= t.initial_events) ++f.counts[e.kind];
    f.streams.insert(e.stream);
    switch (e.kind) {
      case trace_event_kind::alloc:
        requested += size;
        break;
      case trace_event_kind::free_requested:
        requested -= size;
        break;
      case trace_event_kind::segment_alloc:
        reserved += size;
        break;
      case trace_event_kind::segment_free:
        reserved -= size;
        break;
      default:
        break;
    }
    EXPECT_GE(requested, 0) << "event " << i;
    EXPECT_GE(reserved, 0) << "event " << i;
    f.peak_reserved = std::max(f.peak_reserved, static_cast<std::uint64_t>(reserved));
    f.peak_requested = std::max(f.peak_requested, static_cast<std::uint64_t>(requested));
  }
  return f;
}

double gib(std::uint64_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
}
double round2(double x) {
  return std::round(x * 100.0) / 100.0;
}

// --- From a snapshot's own segments to gpumem's segment snapshots --------------------------------

block_state state_of(const std::string& s) {
  if (s == "active_allocated") return block_state::active_allocated;
  if (s == "active_pending_free") return block_state::active_pending_free;
  return block_state::inactive;
}

std::vector<segment_snapshot<simulated_stream>> segments_of(const pickle_value& root) {
  std::vector<segment_snapshot<simulated_stream>> out;
  for (const pickle_value& s : root.find("segments")->as_list()) {
    segment_snapshot<simulated_stream> seg;
    seg.address = static_cast<std::uintptr_t>(s.find("address")->as_int());
    seg.total_size = static_cast<std::size_t>(s.find("total_size")->as_int());
    seg.allocated_size = static_cast<std::size_t>(s.find("allocated_size")->as_int());
    seg.active_size = static_cast<std::size_t>(s.find("active_size")->as_int());
    seg.requested_size = static_cast<std::size_t>(s.find("requested_size")->as_int());
    seg.stream = simulated_stream{static_cast<std::uint64_t>(s.find("stream")->as_int())};
    seg.is_small = s.find("segment_type")->as_str() == "small";
    std::uintptr_t cursor = seg.address;
    for (const pickle_value& b : s.find("blocks")->as_list()) {
      block_snapshot bs;
      bs.address = b.find("address") != nullptr
                       ? static_cast<std::uintptr_t>(b.find("address")->as_int())
                       : cursor;
      bs.size = static_cast<std::size_t>(b.find("size")->as_int());
      bs.requested_size = static_cast<std::size_t>(b.find("requested_size")->as_int());
      bs.state = state_of(b.find("state")->as_str());
      cursor = bs.address + bs.size;
      seg.blocks.push_back(bs);
    }
    out.push_back(std::move(seg));
  }
  return out;
}

std::string export_bytes(const std::vector<segment_snapshot<simulated_stream>>& segments,
                         const allocation_trace& history, int device = 0) {
  std::ostringstream out(std::ios::binary);
  gpumem::write_pytorch_snapshot(out, segments, history, device);
  return out.str();
}

allocation_trace read_bytes(const std::string& bytes, int device = 0) {
  return gpumem::read_pytorch_snapshot(std::vector<char>(bytes.begin(), bytes.end()), device);
}

// --- The real recordings ------------------------------------------------------------------------

TEST(RealSnapshot, OptZerothOrderFinetune) {
  GPUMEM_REAL_TRACE(path, "opt-zeroth-order-finetune.pickle");
  const allocation_trace t = gpumem::read_pytorch_snapshot(path);
  EXPECT_EQ(t.source, "pytorch-snapshot");
  EXPECT_EQ(t.recorded_config, "");
  EXPECT_EQ(t.initial_events, 0u);  // recorded from program start
  EXPECT_EQ(t.events.size(), 23105u);
  EXPECT_EQ(first_violation(t), "");
  const recorded_figures f = figures(t);
  EXPECT_EQ(f.counts.at(trace_event_kind::alloc), 7946u);
  EXPECT_EQ(f.counts.at(trace_event_kind::free_requested), 7549u);
  EXPECT_EQ(f.counts.at(trace_event_kind::free_completed), 7549u);
  EXPECT_EQ(f.counts.at(trace_event_kind::segment_alloc), 61u);   // cudaMalloc
  EXPECT_EQ(f.counts.count(trace_event_kind::segment_free), 0u);  // cudaFree
  EXPECT_EQ(f.streams.size(), 1u);
  ASSERT_TRUE(t.recorded_initial_reserved.has_value());
  EXPECT_EQ(*t.recorded_initial_reserved, 0u);
  EXPECT_DOUBLE_EQ(round2(gib(f.peak_reserved)), 1.77);
  EXPECT_DOUBLE_EQ(round2(gib(f.peak_requested)), 1.66);
  EXPECT_NEAR(static_cast<double>(f.peak_reserved) / static_cast<double>(f.peak_requested), 1.064,
              0.0005);
  std::cout << "opt-zeroth-order-finetune: peak reserved " << f.peak_reserved << " B ("
            << gib(f.peak_reserved) << " GiB), peak requested " << f.peak_requested << " B ("
            << gib(f.peak_requested) << " GiB)\n";
  for (std::size_t i = 0; i < t.events.size(); ++i) ASSERT_NE(t.events[i].time_us, no_time) << i;
}

TEST(RealSnapshot, TransformerForwardBf16) {
  GPUMEM_REAL_TRACE(path, "transformer-forward-bf16.pickle");
  const allocation_trace t = gpumem::read_pytorch_snapshot(path);
  // Memory allocated before recording started is only in the final segments: 137 blocks.
  EXPECT_EQ(t.initial_events, 137u);
  EXPECT_EQ(t.events.size() - t.initial_events, 2811u);
  EXPECT_EQ(first_violation(t), "");
  for (std::size_t i = 0; i < t.initial_events; ++i) {
    EXPECT_EQ(t.events[i].time_us, no_time);
    if (i > 0) {
      EXPECT_LT(t.events[i - 1].address, t.events[i].address);
    }
  }
  const recorded_figures f = figures(t);
  EXPECT_EQ(f.counts.at(trace_event_kind::alloc), 937u);
  EXPECT_EQ(f.counts.at(trace_event_kind::free_requested), 937u);
  EXPECT_EQ(f.counts.at(trace_event_kind::free_completed), 937u);
  EXPECT_EQ(f.counts.count(trace_event_kind::segment_alloc), 0u);
  EXPECT_EQ(f.counts.count(trace_event_kind::segment_free), 0u);
  EXPECT_EQ(f.streams.size(), 1u);
  ASSERT_TRUE(t.recorded_initial_reserved.has_value());
  EXPECT_EQ(*t.recorded_initial_reserved, 861929472u);  // 43 segments, none allocated during
  EXPECT_DOUBLE_EQ(round2(gib(f.peak_reserved)), 0.80);
  EXPECT_DOUBLE_EQ(round2(gib(f.peak_requested)), 0.73);
  EXPECT_NEAR(static_cast<double>(f.peak_reserved) / static_cast<double>(f.peak_requested), 1.105,
              0.0005);
  std::cout << "transformer-forward-bf16: peak reserved " << f.peak_reserved << " B ("
            << gib(f.peak_reserved) << " GiB), peak requested " << f.peak_requested << " B ("
            << gib(f.peak_requested) << " GiB)\n";
}

TEST(RealSnapshot, OptInferenceOomStateOnly) {
  GPUMEM_REAL_TRACE(path, "opt-inference-oom-state.pickle");
  const allocation_trace t = gpumem::read_pytorch_snapshot(path);
  // No history (its one 'snapshot' marker is dropped): the trace is the state, as allocs.
  EXPECT_EQ(t.initial_events, 460u);
  EXPECT_EQ(t.events.size(), 460u);
  EXPECT_EQ(first_violation(t), "");
  ASSERT_TRUE(t.recorded_initial_reserved.has_value());
  EXPECT_EQ(*t.recorded_initial_reserved, 11844714496u);  // about 11.3 GB... of 176 segments
  std::uint64_t requested = 0;
  for (const trace_event& e : t.events) requested += e.size;
  EXPECT_EQ(requested, 11840159744u);  // the size the snapshot marker records

  // Old schema: blocks carry no address; the derived ones tile the 176 segments, every one of
  // which holds at least one of the allocs.
  const pickle_value root = gpumem::detail::unpickle(read_file(path));
  const auto segments = segments_of(root);
  ASSERT_EQ(segments.size(), 176u);
  std::set<std::uintptr_t> hit;
  for (const trace_event& e : t.events) {
    const auto seg = std::find_if(segments.begin(), segments.end(), [&](const auto& s) {
      return e.address >= s.address && e.address + e.size <= s.address + s.total_size;
    });
    ASSERT_NE(seg, segments.end()) << std::hex << e.address;
    hit.insert(seg->address);
  }
  EXPECT_EQ(hit.size(), 176u);
}

TEST(RealSnapshot, TwoMegabyteFileParsesQuickly) {
  GPUMEM_REAL_TRACE(path, "opt-zeroth-order-finetune.pickle");
  const std::string bytes = read_file(path);
  ASSERT_GT(bytes.size(), 2000000u);
  double best_unpickle = 1e9;
  double best_read = 1e9;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const pickle_value v = gpumem::detail::unpickle(bytes);
    auto t1 = std::chrono::steady_clock::now();
    best_unpickle =
        std::min(best_unpickle, std::chrono::duration<double, std::milli>(t1 - t0).count());
    t0 = std::chrono::steady_clock::now();
    const allocation_trace t = gpumem::read_pytorch_snapshot(path);
    t1 = std::chrono::steady_clock::now();
    best_read = std::min(best_read, std::chrono::duration<double, std::milli>(t1 - t0).count());
    EXPECT_EQ(t.events.size(), 23105u);
  }
  std::cout << "opt-zeroth-order-finetune.pickle (" << bytes.size() << " bytes): unpickle "
            << best_unpickle << " ms, read_pytorch_snapshot " << best_read << " ms (best of 5)\n";
  RecordProperty("unpickle_ms", std::to_string(best_unpickle));
  RecordProperty("read_ms", std::to_string(best_read));
}

// Export the recording's own final state and its history; reading that back gives the same trace.
TEST(RealSnapshot, ExportReadsBackUnchanged) {
  for (const char* name : {"opt-zeroth-order-finetune.pickle", "transformer-forward-bf16.pickle",
                           "opt-inference-oom-state.pickle"}) {
    SCOPED_TRACE(name);
    const std::optional<std::string> path = real_trace(name);
    if (!path) GTEST_FAIL() << name << " not found in examples/traces/real";
    const allocation_trace original = gpumem::read_pytorch_snapshot(*path);
    const auto segments = segments_of(gpumem::detail::unpickle(read_file(*path)));
    const allocation_trace back = read_bytes(export_bytes(segments, original));
    EXPECT_EQ(back, original);
  }
}

// --- A trace written back: read(write(read(snapshot))) == read(snapshot) -------------------------

// The snapshots to write back: the real ones, and gpumem-replay's exports of them and of two
// bundled traces under each policy (what --export-snapshot writes).
std::vector<std::pair<std::string, std::string>> snapshots_to_write_back() {
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::pair<std::string, allocation_trace>> sources;
  for (const char* name : {"opt-zeroth-order-finetune.pickle", "transformer-forward-bf16.pickle",
                           "opt-inference-oom-state.pickle"}) {
    const std::optional<std::string> path = real_trace(name);
    if (!path) {
      ADD_FAILURE() << name << " not found in examples/traces/real";
      continue;
    }
    out.emplace_back(name, read_file(*path));
    sources.emplace_back(name, gpumem::read_pytorch_snapshot(*path));
  }
  // resnet50-b32; and a workload that empties the cache 24 times, whose exports hold the segment
  // frees the reader takes for empty_cache calls again.
  for (const char* name : {"resnet50-b32.trace", "workloads/inference_varying_inputs.trace"}) {
    sources.emplace_back(
        name, gpumem::read_native_trace(std::string(GPUMEM_REAL_TRACES) + "/../" + name));
  }
  for (const auto& [name, t] : sources) {
    const gpumem::compiled_trace c = gpumem::compile_trace(t);
    for (const char* config : {"policy:classic", "policy:expandable", "policy:stitch"}) {
      gpumem::replay_options ro;
      ro.device_memory = t.device_memory.value_or(80 * gpumem_test::GiB);
      ro.config = gpumem::allocator_config::parse(config);
      ro.record_history = true;
      if (!c.ops.empty()) ro.snapshot_after_event = c.ops.size() - 1;
      const gpumem::replay_result r = gpumem::replay_trace(c, ro);
      std::ostringstream bytes(std::ios::binary);
      gpumem::write_pytorch_snapshot(bytes, r.segments, r.snapshot_trace,
                                     r.history.recorded_config);
      out.emplace_back(name + " exported under " + config, bytes.str());
    }
  }
  return out;
}

TEST(RoundTrip, RealAndExportedSnapshotsWriteBackUnchanged) {
  const auto snapshots = snapshots_to_write_back();
  EXPECT_EQ(snapshots.size(), 18u);  // 3 real + 5 sources x 3 policies
  for (const auto& [name, bytes] : snapshots) {
    SCOPED_TRACE(name);
    const allocation_trace trace = read_bytes(bytes);
    ASSERT_EQ(first_violation(trace), "");
    std::ostringstream out(std::ios::binary);
    gpumem::write_pytorch_snapshot(out, trace);
    allocation_trace back;
    ASSERT_NO_THROW(back = read_bytes(out.str()));
    EXPECT_EQ(back.initial_events, trace.initial_events);
    EXPECT_EQ(back.recorded_initial_reserved, trace.recorded_initial_reserved);
    EXPECT_EQ(back.device_memory, trace.device_memory);
    EXPECT_EQ(back.recorded_oom_event, trace.recorded_oom_event);
    EXPECT_EQ(back.recorded_config, trace.recorded_config);
    ASSERT_EQ(back.events.size(), trace.events.size());
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      ASSERT_EQ(back.events[i], trace.events[i]) << "event " << i;
    }
    EXPECT_EQ(back, trace);
  }
}

// gpumem-replay's export of a workload that empties its cache 24 times, under classic: read back,
// its segment frees are 23 empty_cache calls (one emptied an empty cache and left no trace), and
// replaying it as recorded gives the export's own reserved memory, peak to the byte. Before the
// empty_cache events were derived, the peak was 24.8% above.
TEST(RoundTrip, ExportOfAWorkloadThatEmptiesItsCacheReplaysToItsPeak) {
  const allocation_trace source = gpumem::read_native_trace(
      std::string(GPUMEM_REAL_TRACES) + "/../workloads/inference_varying_inputs.trace");
  const auto empty_caches = [](const allocation_trace& t) {
    return std::count_if(t.events.begin(), t.events.end(), [](const trace_event& e) {
      return e.kind == trace_event_kind::empty_cache;
    });
  };
  ASSERT_EQ(empty_caches(source), 24);
  gpumem::replay_options ro;
  ro.config = gpumem::allocator_config::parse("policy:classic");
  ro.record_history = true;
  const gpumem::compiled_trace c = gpumem::compile_trace(source);
  ro.snapshot_after_event = c.ops.size() - 1;
  const gpumem::replay_result exported = gpumem::replay_trace(c, ro);
  std::ostringstream bytes(std::ios::binary);
  gpumem::write_pytorch_snapshot(bytes, exported.segments, exported.snapshot_trace,
                                 exported.history.recorded_config);
  const allocation_trace t = read_bytes(bytes.str());
  EXPECT_EQ(empty_caches(t), 23);
  EXPECT_EQ(figures(t).peak_reserved, exported.peak_reserved);
  gpumem::replay_options again;
  again.config = ro.config;
  const gpumem::replay_result r = gpumem::replay_trace(gpumem::compile_trace(t), again);
  ASSERT_TRUE(r.completed);
  EXPECT_EQ(r.peak_reserved, exported.peak_reserved);
}

// --- gpumem's own allocator, exported ------------------------------------------------------------

struct recording {
  gpumem::simulated_device dev{
      gpumem_test::device_options(2 * gpumem_test::GiB, gpumem::event_completion::manual)};
  gpumem_test::allocator alloc{dev, gpumem_test::config()};
  allocation_trace history;
  std::set<std::uintptr_t> segments;

  void* allocate(std::size_t size, simulated_stream s) {
    void* p = alloc.allocate(size, s);
    for (const auto& seg : alloc.snapshot()) {
      if (segments.insert(seg.address).second) {
        history.events.push_back(
            {trace_event_kind::segment_alloc, seg.address, seg.total_size, seg.stream.id, no_time});
      }
    }
    history.events.push_back(
        {trace_event_kind::alloc, reinterpret_cast<std::uintptr_t>(p), size, s.id, now()});
    sizes[p] = {size, s.id};
    return p;
  }
  void record_stream(void* p, simulated_stream s) {
    alloc.record_stream(p, s);
    history.events.push_back(
        {trace_event_kind::record_stream, reinterpret_cast<std::uintptr_t>(p), 0, s.id, now()});
  }
  // The classic policy returns a block at once unless record_stream deferred it.
  void free(void* p, bool deferred) {
    alloc.deallocate(p);
    const auto [size, stream] = sizes.at(p);
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    history.events.push_back({trace_event_kind::free_requested, addr, size, stream, now()});
    if (!deferred) {
      history.events.push_back({trace_event_kind::free_completed, addr, size, stream, now()});
    }
  }
  std::int64_t now() { return clock += 3; }

  std::int64_t clock = 1000;
  std::map<void*, std::pair<std::size_t, std::uint64_t>> sizes;
};

TEST(Export, GpumemStateAndHistoryReadBack) {
  using gpumem_test::KiB;
  using gpumem_test::MiB;
  recording r;
  const simulated_stream main_stream = r.dev.default_stream();
  const simulated_stream side = r.dev.create_stream();
  std::vector<void*> live;
  for (int i = 0; i < 40; ++i) {
    const std::size_t size = (i % 3 == 0) ? (i + 1) * 100 * KiB : (i + 1) * MiB + 17;
    live.push_back(r.allocate(size, i % 5 == 0 ? side : main_stream));
  }
  for (std::size_t i = 0; i < live.size(); i += 2) r.free(live[i], false);
  r.record_stream(live[1], side);
  r.free(live[1], true);  // pending at the end: active_pending_free
  r.history.recorded_config = "expandable_segments:False";

  const auto segments = r.alloc.snapshot();
  const bool has_pending = std::any_of(segments.begin(), segments.end(), [](const auto& s) {
    return std::any_of(s.blocks.begin(), s.blocks.end(), [](const block_snapshot& b) {
      return b.state == block_state::active_pending_free;
    });
  });
  EXPECT_TRUE(has_pending);
  const allocation_trace back = read_bytes(export_bytes(segments, r.history));
  allocation_trace expected = r.history;
  expected.events.erase(std::remove_if(expected.events.begin(), expected.events.end(),
                                       [](const trace_event& e) {
                                         return e.kind == trace_event_kind::record_stream;
                                       }),
                        expected.events.end());
  expected.source = "pytorch-snapshot";
  expected.recorded_initial_reserved = 0;  // every segment_alloc is in the history
  EXPECT_EQ(back, expected);
  EXPECT_EQ(first_violation(back), "");
}

TEST(Export, InitialEventsAreStateNotHistory) {
  // A history whose first two events are initial: they are not exported as events, and the
  // reader rebuilds them from the segments.
  std::vector<segment_snapshot<simulated_stream>> segments(1);
  auto& s = segments[0];
  s.address = 0x10000000;
  s.total_size = 2 * 1024 * 1024;
  s.stream = simulated_stream{7};
  s.is_small = true;
  s.blocks = {{0x10000000, 512, 100, block_state::active_allocated},
              {0x10000200, 1024, 1000, block_state::active_allocated},
              {0x10000600, 2 * 1024 * 1024 - 0x600, 0, block_state::inactive}};
  allocation_trace h;
  h.events = {{trace_event_kind::alloc, 0x10000000, 100, 7, no_time},
              {trace_event_kind::alloc, 0x10000200, 50, 7, no_time},
              {trace_event_kind::free_requested, 0x10000200, 50, 7, 5},
              {trace_event_kind::free_completed, 0x10000200, 50, 7, 6},
              {trace_event_kind::record_stream, 0x10000000, 0, 9, 7},
              {trace_event_kind::alloc, 0x10000200, 1000, 7, 8}};
  h.initial_events = 2;
  h.recorded_initial_reserved = 2 * 1024 * 1024;

  for (int device : {0, 2}) {
    SCOPED_TRACE(device);
    const std::string bytes = export_bytes(segments, h, device);
    const pickle_value v = gpumem::detail::unpickle(bytes);
    ASSERT_EQ(v.find("device_traces")->as_list().size(), static_cast<std::size_t>(device + 1));
    const auto& events = v.find("device_traces")->as_list().back().as_list();
    ASSERT_EQ(events.size(), 3u);  // record_stream and the initial events are not exported
    EXPECT_EQ(events[0].find("action")->as_str(), "free_requested");
    EXPECT_EQ(events[0].find("time_us")->as_int(), 5);
    EXPECT_TRUE(events[0].find("frames")->is_list());
    const pickle_value& seg = v.find("segments")->as_list()[0];
    EXPECT_EQ(seg.find("device")->as_int(), device);
    EXPECT_EQ(seg.find("segment_type")->as_str(), "small");
    EXPECT_EQ(seg.find("stream")->as_int(), 7);
    EXPECT_EQ(seg.find("blocks")->as_list()[2].find("state")->as_str(), "inactive");

    const allocation_trace back = read_bytes(bytes, device);
    ASSERT_EQ(back.initial_events, 2u);
    EXPECT_EQ(back.events[0], h.events[0]);
    EXPECT_EQ(back.events[1], h.events[1]);
    EXPECT_EQ(back.events[2], h.events[2]);
    EXPECT_EQ(back.events[4], h.events[5]);
    EXPECT_EQ(back.recorded_initial_reserved, h.recorded_initial_reserved);
    EXPECT_EQ(first_violation(back), "");
    if (device > 0) {
      EXPECT_THROW(read_bytes(bytes, 0), trace_error);  // device 0 has nothing
    }
  }
}

struct fake_stream_st;  // cudaStream_t is a pointer to an opaque struct

TEST(Export, PointerStreamsAreTheirValue) {
  std::vector<segment_snapshot<fake_stream_st*>> segments(1);
  segments[0].address = 0x2000000;
  segments[0].total_size = 20 * 1024 * 1024;
  segments[0].stream = reinterpret_cast<fake_stream_st*>(std::uintptr_t{0x55aa00});
  segments[0].blocks = {{0x2000000, 20 * 1024 * 1024, 4096, block_state::active_allocated}};
  std::ostringstream out;
  gpumem::write_pytorch_snapshot(out, segments, allocation_trace{});
  const allocation_trace back = read_bytes(out.str());
  ASSERT_EQ(back.events.size(), 1u);
  EXPECT_EQ(back.events[0],
            (trace_event{trace_event_kind::alloc, 0x2000000, 4096, 0x55aa00, no_time}));
}

TEST(Export, PythonLoadsIt) {
  if (std::system("python3 -c pass > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 is not on PATH";
  }
  recording r;
  std::vector<void*> live;
  for (int i = 0; i < 30; ++i) live.push_back(r.allocate((i + 1) * 300000, r.dev.default_stream()));
  for (std::size_t i = 0; i < live.size(); i += 3) r.free(live[i], false);
  const auto segments = r.alloc.snapshot();
  const std::string path = ::testing::TempDir() + "gpumem_export_python_check.pickle";
  {
    std::ofstream out(path, std::ios::binary);
    gpumem::write_pytorch_snapshot(out, segments, r.history);
  }
  std::size_t blocks = 0;
  for (const auto& s : segments) blocks += s.blocks.size();
  const std::string script =
      "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); "
      "n,s,b=int(sys.argv[2]),int(sys.argv[3]),int(sys.argv[4]); "
      "t=d['device_traces'][0]; "
      "assert len(d['device_traces'])==1 and len(t)==n, len(t); "
      "assert len(d['segments'])==s and sum(len(x['blocks']) for x in d['segments'])==b; "
      "assert all(e['action'] in ('alloc','free_requested','free_completed','segment_alloc') "
      "and e['frames']==[] and isinstance(e['addr'],int) "
      "and ('time_us' in e) == (e['action'] != 'segment_alloc') for e in t); "
      "assert all(x['segment_type'] in ('small','large') and x['segment_pool_id']==(0,0) "
      "and x['is_expandable'] is False and x['device']==0 for x in d['segments']); "
      "assert all(sum(y['size'] for y in x['blocks'])==x['total_size'] for x in d['segments']); "
      "assert all(y['state'] in ('active_allocated','active_pending_free','inactive') "
      "for x in d['segments'] for y in x['blocks']); "
      "assert d['allocator_settings']=={'PYTORCH_CUDA_ALLOC_CONF': ''}";
  const std::string command = "python3 -c \"" + script + "\" " + path + " " +
                              std::to_string(r.history.events.size()) + " " +
                              std::to_string(segments.size()) + " " + std::to_string(blocks);
  EXPECT_EQ(std::system(command.c_str()), 0);
  std::remove(path.c_str());
}

// --- Built snapshots: the rules of the rebuild ---------------------------------------------------

pickle_value block(std::int64_t addr, std::int64_t size, std::int64_t requested,
                   const char* state) {
  return pickle_value::make_dict(dict{{"address", addr},
                                      {"size", size},
                                      {"requested_size", requested},
                                      {"state", state},
                                      {"frames", pickle_value::make_list()}});
}

pickle_value segment(std::int64_t addr, std::int64_t total, seq blocks, std::int64_t device = 0,
                     std::int64_t stream = 0) {
  return pickle_value::make_dict(dict{{"device", device},
                                      {"address", addr},
                                      {"total_size", total},
                                      {"stream", stream},
                                      {"segment_type", "large"},
                                      {"blocks", pickle_value::make_list(std::move(blocks))}});
}

pickle_value event(const char* action, std::int64_t addr, std::int64_t size,
                   std::optional<std::int64_t> time = std::nullopt, std::int64_t stream = 0) {
  dict d{{"action", action}, {"addr", addr}, {"size", size}, {"stream", stream}};
  if (time) d.emplace_back("time_us", *time);
  d.emplace_back("frames", pickle_value::make_list());
  return pickle_value::make_dict(std::move(d));
}

pickle_value snapshot(seq segments, seq events) {
  return pickle_value::make_dict(dict{
      {"segments", pickle_value::make_list(std::move(segments))},
      {"device_traces", pickle_value::make_list(seq{pickle_value::make_list(std::move(events))})}});
}

allocation_trace read_value(const pickle_value& v, int device = 0) {
  return read_bytes(gpumem::detail::pickle_dumps(v), device);
}

constexpr std::int64_t seg_addr = 0x7f0000000000;
constexpr std::int64_t mib2 = 2 * 1024 * 1024;

TEST(Rebuild, PendingFreeAtTheEnd) {
  // alloc, free_requested; the block still waits for another stream at the end.
  const allocation_trace t = read_value(
      snapshot({segment(seg_addr, mib2,
                        {block(seg_addr, 1024, 1000, "active_pending_free"),
                         block(seg_addr + 1024, mib2 - 1024, 0, "inactive")})},
               {event("alloc", seg_addr, 1000, 10), event("free_requested", seg_addr, 1000, 11)}));
  EXPECT_EQ(t.initial_events, 0u);
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.events[1], (trace_event{trace_event_kind::free_requested,
                                      static_cast<std::uint64_t>(seg_addr), 1000, 0, 11}));
  EXPECT_EQ(first_violation(t), "");
}

TEST(Rebuild, PendingFreeBeforeTheStart) {
  // The first event completes a free requested before recording began; another block was
  // pending from before the start to the end.
  const allocation_trace t = read_value(snapshot(
      {segment(seg_addr, mib2,
               {block(seg_addr, 1024, 700, "active_allocated"),
                block(seg_addr + 1024, 512, 512, "active_pending_free"),
                block(seg_addr + 1536, mib2 - 1536, 0, "inactive")},
               0, 3)},
      {event("free_completed", seg_addr, 1000, 20, 3), event("alloc", seg_addr, 700, 21, 3)}));
  EXPECT_EQ(t.initial_events, 2u);
  ASSERT_EQ(t.events.size(), 6u);
  const auto a = static_cast<std::uint64_t>(seg_addr);
  EXPECT_EQ(t.events[0], (trace_event{trace_event_kind::alloc, a, 1000, 3, no_time}));
  EXPECT_EQ(t.events[1], (trace_event{trace_event_kind::alloc, a + 1024, 512, 3, no_time}));
  EXPECT_EQ(t.events[2], (trace_event{trace_event_kind::free_requested, a, 1000, 3, no_time}));
  EXPECT_EQ(t.events[3],
            (trace_event{trace_event_kind::free_requested, a + 1024, 512, 3, no_time}));
  EXPECT_EQ(t.events[4], (trace_event{trace_event_kind::free_completed, a, 1000, 3, 20}));
  EXPECT_EQ(t.events[5], (trace_event{trace_event_kind::alloc, a, 700, 3, 21}));
  EXPECT_EQ(first_violation(t), "");
}

TEST(Rebuild, SegmentEventsMarkersAndSettings) {
  pickle_value v =
      snapshot({segment(seg_addr, mib2, {block(seg_addr, mib2, 0, "inactive")}),
                segment(seg_addr + 4 * mib2, 2 * mib2,
                        {block(seg_addr + 4 * mib2, 2 * mib2, 0, "inactive")})},
               {event("segment_map", seg_addr + 4 * mib2, mib2), event("oom", 0, 1 << 30),
                event("segment_unmap", seg_addr + 8 * mib2, mib2), event("snapshot", 0, 0),
                event("segment_alloc", seg_addr + 5 * mib2, mib2),
                event("segment_free", seg_addr, 3 * mib2)});
  v.as_dict().emplace_back(
      "allocator_settings",
      pickle_value::make_dict(
          dict{{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}, {"max_split_size", -1}}));
  const allocation_trace t = read_value(v);
  // snapshot dropped; the oom becomes the failed request (an alloc at 0 and its free), without a
  // device size (the event has no 'device_free'); the unmap that a segment_alloc follows is the
  // allocator's own, the last segment_free (which no segment_alloc follows) an empty_cache
  ASSERT_EQ(t.events.size(), 8u);
  EXPECT_EQ(t.events[0].kind, trace_event_kind::segment_alloc);
  EXPECT_EQ(t.events[1], (trace_event{trace_event_kind::alloc, 0, 1 << 30, 0, no_time}));
  EXPECT_EQ(t.events[2].kind, trace_event_kind::free_requested);
  EXPECT_EQ(t.events[3].kind, trace_event_kind::free_completed);
  EXPECT_EQ(t.events[4].kind, trace_event_kind::segment_free);
  EXPECT_EQ(t.events[5].kind, trace_event_kind::segment_alloc);
  EXPECT_EQ(t.events[6], (trace_event{trace_event_kind::empty_cache, 0, 0, 0, no_time}));
  EXPECT_EQ(t.events[7].kind, trace_event_kind::segment_free);
  EXPECT_EQ(t.recorded_oom_event, std::optional<std::size_t>(1));
  EXPECT_EQ(t.device_memory, std::nullopt);
  EXPECT_EQ(t.events[0].time_us, no_time);
  EXPECT_EQ(t.recorded_config, "expandable_segments:True");
  // final 3 x 2 MiB; undo: +3 (segment_free), -1 (segment_alloc), +1 (unmap), -1 (map) = 5 x 2 MiB
  EXPECT_EQ(t.recorded_initial_reserved, std::optional<std::uint64_t>(5 * mib2));
}

// PyTorch's oom trace entry: the device's free memory, the failed request's size, stream, time.
pickle_value oom_event(std::uint64_t device_free, std::uint64_t size, std::int64_t stream,
                       std::int64_t time_us) {
  return pickle_value::make_dict(dict{{"action", "oom"},
                                      {"device_free", device_free},
                                      {"size", size},
                                      {"stream", stream},
                                      {"time_us", time_us},
                                      {"frames", pickle_value::make_list()}});
}

// PyTorch's oom event (device_free instead of addr): the request that failed is replayed where it
// failed, and the device is what the allocator could have had: its reserved memory then (after
// the segment its out-of-memory path freed) plus the device's free memory.
TEST(Rebuild, OomIsTheFailedRequestAndGivesTheDevice) {
  const pickle_value oom = oom_event(3 * mib2, 5 * mib2, 4, 77);
  const allocation_trace t = read_value(snapshot(
      {segment(seg_addr, 2 * mib2, {block(seg_addr, 2 * mib2, 2 * mib2, "active_allocated")})},
      {event("segment_alloc", seg_addr + 8 * mib2, mib2), event("alloc", seg_addr, 2 * mib2),
       event("segment_free", seg_addr + 8 * mib2, mib2), oom, event("oom", 0, 1000)}));
  ASSERT_EQ(t.events.size(), 6u);  // only the first oom becomes a request
  EXPECT_EQ(t.recorded_oom_event, std::optional<std::size_t>(3));
  EXPECT_EQ(t.events[3], (trace_event{trace_event_kind::alloc, 0, 5 * mib2, 4, 77}));
  EXPECT_EQ(t.events[4], (trace_event{trace_event_kind::free_requested, 0, 5 * mib2, 4, 77}));
  EXPECT_EQ(t.events[5], (trace_event{trace_event_kind::free_completed, 0, 5 * mib2, 4, 77}));
  // reserved: 2 x 2 MiB at the start (final 2, +1 -1), 2 x 2 MiB at the oom; plus 3 x 2 MiB free
  EXPECT_EQ(t.device_memory, std::optional<std::uint64_t>(5 * mib2));
  EXPECT_EQ(first_violation(t), "");
}

std::string trace_bytes(const allocation_trace& t) {
  std::ostringstream out(std::ios::binary);
  gpumem::write_pytorch_snapshot(out, t);
  return out.str();
}

// write_pytorch_snapshot(out, trace): the state before the first event (blocks live and pending,
// reserved bytes) and the out-of-memory come back as they were read.
TEST(RoundTrip, InitialStatePendingFreesAndOomWriteBack) {
  const pickle_value oom = oom_event(3 * mib2, 5 * mib2, 4, 77);
  const allocation_trace t = read_value(snapshot(
      {segment(seg_addr, 2 * mib2,
               {block(seg_addr, 1024, 1000, "active_allocated"),
                block(seg_addr + 1024, 1024, 900, "active_pending_free"),
                block(seg_addr + 2048, 2 * mib2 - 2048, 0, "inactive")},
               0, 6)},
      {event("alloc", seg_addr + 4096, 300, 1, 6),
       event("free_requested", seg_addr + 4096, 300, 2, 6),
       event("free_requested", seg_addr, 1000, 3, 6), event("free_completed", seg_addr, 1000, 4, 6),
       event("alloc", seg_addr, 1000, 5, 6), event("segment_alloc", seg_addr + 8 * mib2, mib2),
       event("segment_free", seg_addr + 8 * mib2, mib2), oom,
       event("free_completed", seg_addr + 4096, 300, 8, 6)}));
  ASSERT_EQ(t.initial_events, 2u);  // seg_addr (freed later) and seg_addr + 1024 (pending)
  ASSERT_TRUE(t.recorded_oom_event.has_value());
  ASSERT_TRUE(t.device_memory.has_value());
  const std::string bytes = trace_bytes(t);
  const allocation_trace back = read_bytes(bytes);
  EXPECT_EQ(back, t);
  // What was written: the live blocks in segments of their own, the oom as an oom event.
  const pickle_value v = gpumem::detail::unpickle(bytes);
  std::uint64_t total = 0;
  std::size_t live = 0;
  for (const pickle_value& seg : v.find("segments")->as_list()) {
    total += static_cast<std::uint64_t>(seg.find("total_size")->as_int());
    for (const pickle_value& b : seg.find("blocks")->as_list()) {
      live += b.find("state")->as_str() != "inactive" ? 1 : 0;
    }
  }
  EXPECT_EQ(total, 2u * mib2);
  EXPECT_EQ(live, 2u);
  std::size_t ooms = 0;
  for (const pickle_value& e : v.find("device_traces")->as_list()[0].as_list()) {
    if (e.find("action")->as_str() == "oom") {
      ++ooms;
      EXPECT_EQ(e.find("device_free")->as_int(), 3 * mib2);
      EXPECT_EQ(e.find("size")->as_int(), 5 * mib2);
    }
  }
  EXPECT_EQ(ooms, 1u);
}

TEST(RoundTrip, TraceWithoutRecordedReservedGetsTheLeastThatFits) {
  allocation_trace t;
  t.events = {{trace_event_kind::alloc, 0x1000, 700, 0, 1},
              {trace_event_kind::empty_cache, 0, 0, 0, 2},  // not written; read from the next
              {trace_event_kind::segment_free, 0x9000, 300, 0, 2},
              {trace_event_kind::alloc, 0x2000, 100, 0, 3}};
  const allocation_trace back = read_bytes(trace_bytes(t));
  // 300 bytes freed, 800 live at the end: at least 1,100 at the start.
  EXPECT_EQ(back.recorded_initial_reserved, std::optional<std::uint64_t>(1100));
  EXPECT_EQ(back.events, t.events);
  t.recorded_initial_reserved = 1100;
  EXPECT_EQ(back, [&] {
    allocation_trace expected = t;
    expected.source = "pytorch-snapshot";
    return expected;
  }());
  // A recorded reserved memory that the segment frees or the live blocks overdraw is refused.
  t.recorded_initial_reserved = 200;
  EXPECT_THROW(trace_bytes(t), std::invalid_argument);
  t.recorded_initial_reserved = 1000;
  EXPECT_THROW(trace_bytes(t), std::invalid_argument);
  t.events.push_back({trace_event_kind::free_completed, 0x2000, 100, 0, 5});  // not requested
  t.recorded_initial_reserved = 5000;
  EXPECT_THROW(trace_bytes(t), trace_error);
}

// A live block that no part of its segment holds would not be written; refused instead.
TEST(Export, LiveBlockOutsideItsSegmentIsRefused) {
  std::vector<segment_snapshot<std::uint64_t>> segments(1);
  segments[0].address = 0x100000;
  segments[0].blocks = {{0x100000, 4096, 4000, block_state::active_allocated}};
  std::ostringstream out;
  EXPECT_THROW(gpumem::write_pytorch_snapshot(out, segments, allocation_trace{}),
               std::invalid_argument);  // total_size 0
  segments[0].total_size = 4096;
  gpumem::write_pytorch_snapshot(out, segments, allocation_trace{});
  EXPECT_EQ(read_bytes(out.str()).events.size(), 1u);
  segments[0].is_expandable = true;
  segments[0].total_size = 1 << 20;
  segments[0].reserved_ranges = {{0x101000, 4096}};
  EXPECT_THROW(gpumem::write_pytorch_snapshot(out, segments, allocation_trace{}),
               std::invalid_argument);
}

// Which runs of segment frees are the program's empty_cache and which the allocator's own.
TEST(Rebuild, EmptyCacheFromReleasesThatAreNoRetry) {
  constexpr std::int64_t mib = 1024 * 1024;
  const std::int64_t a1 = seg_addr, a2 = seg_addr + 32 * mib, b = seg_addr + 64 * mib,
                     c = seg_addr + 128 * mib, p = seg_addr + 256 * mib, q = seg_addr + 512 * mib,
                     r = seg_addr + 1024 * mib;
  // A 2 MiB segment held throughout (r's); the most reserved: 232 MiB, after q's segment_alloc.
  // Built anew for each use: a pickle_value's copy shares its containers.
  const auto build = [&]() {
    return snapshot(
        {segment(r, 2 * mib, {block(r, 2 * mib, 512, "active_allocated")})},
        {event("segment_alloc", a1, 20 * mib), event("alloc", a1, 20 * mib),
         event("segment_alloc", a2, 20 * mib), event("alloc", a2, 20 * mib),
         event("free_requested", a1, 20 * mib), event("free_completed", a1, 20 * mib),
         event("free_requested", a2, 20 * mib), event("free_completed", a2, 20 * mib),
         // 8, 9: new memory follows for 20 MiB, which either freed segment held: an empty_cache
         event("segment_free", a1, 20 * mib, 100), event("segment_free", a2, 20 * mib, 101),
         event("segment_alloc", b, 20 * mib), event("alloc", b, 20 * mib),
         event("free_requested", b, 20 * mib), event("free_completed", b, 20 * mib),
         // 14: new memory follows for 30 MiB, which b's segment could not hold, but 22 MiB reserved
         // plus 30 is less than the allocator held later: cudaMalloc did not fail, an empty_cache
         event("segment_free", b, 20 * mib, 200), event("segment_alloc", c, 30 * mib),
         event("alloc", c, 30 * mib), event("segment_alloc", p, 100 * mib),
         event("alloc", p, 100 * mib), event("free_requested", p, 100 * mib),
         event("free_completed", p, 100 * mib),
         // 21: 132 MiB reserved plus 200 MiB is more than it ever held: a retry
         event("segment_free", p, 100 * mib), event("segment_alloc", q, 200 * mib),
         event("alloc", q, 200 * mib), event("free_requested", c, 30 * mib),
         event("free_completed", c, 30 * mib), event("free_requested", q, 200 * mib),
         event("free_completed", q, 200 * mib),
         // 28: right before an oom event: a retry
         event("segment_free", q, 200 * mib), event("oom", 0, 1 << 30),
         // 30 (29 without the oom): after it, then a block event: an empty_cache
         event("segment_free", c, 30 * mib, 300), event("alloc", r, 512)});
  };
  const auto empty_caches = [](const allocation_trace& t) {
    std::vector<std::size_t> at;
    for (std::size_t i = 0; i < t.events.size(); ++i) {
      if (t.events[i].kind == trace_event_kind::empty_cache) at.push_back(i);
    }
    return at;
  };
  const allocation_trace t = read_value(build());
  ASSERT_EQ(empty_caches(t), (std::vector<std::size_t>{8, 15, 34}));
  EXPECT_EQ(t.events[8], (trace_event{trace_event_kind::empty_cache, 0, 0, 0, 100}));
  EXPECT_EQ(t.events[9].kind, trace_event_kind::segment_free);
  EXPECT_EQ(t.events[10].kind, trace_event_kind::segment_free);
  EXPECT_EQ(t.events[15], (trace_event{trace_event_kind::empty_cache, 0, 0, 0, 200}));
  EXPECT_EQ(t.recorded_oom_event, std::optional<std::size_t>(31));
  EXPECT_EQ(t.events[34], (trace_event{trace_event_kind::empty_cache, 0, 0, 0, 300}));
  EXPECT_EQ(t.events[35].kind, trace_event_kind::segment_free);
  EXPECT_EQ(first_violation(t), "");
  gpumem::validate_trace(t);
  // Written back, the empty_cache events are not written and come back from the segment frees.
  EXPECT_EQ(read_bytes(trace_bytes(t)), t);

  // An allocator that collects garbage (garbage_collection_threshold) also gives back, inside a
  // malloc, segments that it could have kept: only a freed segment that fits the request shows
  // an empty_cache then. As a setting of its own (newer snapshots) or in the configuration.
  for (const bool own_setting : {true, false}) {
    SCOPED_TRACE(own_setting);
    pickle_value gc = build();
    gc.as_dict().emplace_back(
        "allocator_settings",
        own_setting ? pickle_value::make_dict(dict{{"PYTORCH_CUDA_ALLOC_CONF", ""},
                                                   {"garbage_collection_threshold", 0.6}})
                    : pickle_value::make_dict(
                          dict{{"PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6"}}));
    EXPECT_EQ(empty_caches(read_value(gc)), (std::vector<std::size_t>{8, 33}));
  }
  pickle_value no_gc = build();
  no_gc.as_dict().emplace_back(
      "allocator_settings", pickle_value::make_dict(dict{{"PYTORCH_CUDA_ALLOC_CONF", ""},
                                                         {"garbage_collection_threshold", 0.0}}));
  EXPECT_EQ(empty_caches(read_value(no_gc)), (std::vector<std::size_t>{8, 15, 34}));
}

// A program that empties the cache between two phases: the replay empties its cache there too, and
// classic under the recorded settings then reserves what PyTorch reserved.
TEST(Rebuild, EmptyCacheReplaysUnderEveryPolicy) {
  constexpr std::int64_t mib = 1024 * 1024;
  const std::int64_t a1 = seg_addr, a2 = seg_addr + 32 * mib, x = seg_addr + 64 * mib,
                     y = seg_addr + 128 * mib;
  const allocation_trace t = read_value(
      snapshot({segment(x, 20 * mib, {block(x, 20 * mib, 20 * mib, "active_allocated")}),
                segment(y, 60 * mib, {block(y, 60 * mib, 60 * mib, "active_allocated")})},
               {event("segment_alloc", a1, 20 * mib), event("alloc", a1, 20 * mib),
                event("segment_alloc", a2, 20 * mib), event("alloc", a2, 20 * mib),
                event("free_requested", a1, 20 * mib), event("free_completed", a1, 20 * mib),
                event("free_requested", a2, 20 * mib), event("free_completed", a2, 20 * mib),
                event("segment_free", a1, 20 * mib), event("segment_free", a2, 20 * mib),
                event("segment_alloc", x, 20 * mib), event("alloc", x, 20 * mib),
                event("segment_alloc", y, 60 * mib), event("alloc", y, 60 * mib)}));
  const std::uint64_t recorded_peak = figures(t).peak_reserved;
  ASSERT_EQ(recorded_peak, 80u * mib);  // 40 MiB, then none, then 20 + 60
  ASSERT_EQ(
      std::count_if(t.events.begin(), t.events.end(),
                    [](const trace_event& e) { return e.kind == trace_event_kind::empty_cache; }),
      1);
  allocation_trace without = t;  // what a replay saw before the empty_cache events were derived
  without.events.erase(
      std::remove_if(without.events.begin(), without.events.end(),
                     [](const trace_event& e) { return e.kind == trace_event_kind::empty_cache; }),
      without.events.end());
  const auto replay = [](const allocation_trace& trace, const std::string& config) {
    gpumem::replay_options ro;
    ro.device_memory = 1024 * static_cast<std::size_t>(mib);
    ro.config = gpumem::allocator_config::parse(config);
    ro.record_samples = true;
    ro.check_invariants = true;
    return gpumem::replay_trace(gpumem::compile_trace(trace), ro);
  };
  // Classic with the recorded settings (none): PyTorch's peak, to the byte; 100 MiB before.
  const gpumem::replay_result classic = replay(t, "policy:classic");
  ASSERT_TRUE(classic.completed);
  EXPECT_EQ(classic.peak_reserved, recorded_peak);
  EXPECT_EQ(replay(without, "policy:classic").peak_reserved, 100u * mib);
  // Every policy empties its cache there: nothing reserved right after the empty_cache event.
  const std::size_t empty_at = static_cast<std::size_t>(
      std::find_if(t.events.begin(), t.events.end(),
                   [](const trace_event& e) { return e.kind == trace_event_kind::empty_cache; }) -
      t.events.begin());
  for (const char* config : {"policy:classic", "policy:expandable", "policy:stitch"}) {
    SCOPED_TRACE(config);
    const gpumem::replay_result r = replay(t, config);
    ASSERT_TRUE(r.completed);
    ASSERT_GT(r.samples.size(), empty_at);
    EXPECT_GT(r.samples[empty_at - 1].reserved, 0u);
    EXPECT_EQ(r.samples[empty_at].reserved, 0u);
    EXPECT_LE(r.peak_reserved, replay(without, config).peak_reserved);
  }
}

// Snapshots that PyTorch's own allocator (torch 2.11, on gpumem's CUDA simulator, a 1 GiB device)
// recorded from a program that empties its cache between phases (tests/data/empty_cache/record.py):
// its empty_cache calls are found, not its out-of-memory retries (one that succeeds, one that
// fails) nor its garbage collection; replayed as recorded, classic reserves what PyTorch did.
TEST(RecordedByPyTorch, EmptyCacheCallsNotRetriesNorGarbageCollection) {
  struct pytorch_run {
    const char* file;
    std::vector<std::size_t> empty_caches;  // where, in the trace
    const char* config;                     // what --config recorded stands for
    std::uint64_t peak_without;             // classic's peak before empty_cache was derived
  };
  constexpr std::uint64_t mib = 1024 * 1024;
  for (const pytorch_run& rec : {
           // 8-9 (an empty_cache before new memory of another shape), 16 (before a request the
           // freed segment held), 83; not 62-72 (the retry that succeeds) nor 77 (the oom's)
           pytorch_run{"classic.pickle", {8, 17, 87}, "policy:classic", 1000 * mib},
           pytorch_run{"expandable.pickle", {8, 16, 74}, "policy:expandable", 0},
           // 16-19 is the garbage collection before 150 MiB, 24 the empty_cache
           pytorch_run{"gc.pickle", {24}, "", 0},
       }) {
    SCOPED_TRACE(rec.file);
    const allocation_trace t =
        gpumem::read_pytorch_snapshot(std::string(GPUMEM_TEST_DATA) + "/empty_cache/" + rec.file);
    std::vector<std::size_t> at;
    for (std::size_t i = 0; i < t.events.size(); ++i) {
      if (t.events[i].kind == trace_event_kind::empty_cache) at.push_back(i);
    }
    EXPECT_EQ(at, rec.empty_caches);
    EXPECT_EQ(first_violation(t), "");
    EXPECT_EQ(read_bytes(trace_bytes(t)), t);
    if (*rec.config == '\0') continue;  // gc.pickle: the fraction it ran under is not recorded
    gpumem::replay_options ro;
    ASSERT_TRUE(t.device_memory.has_value());
    ro.device_memory = static_cast<std::size_t>(*t.device_memory);
    ro.config = gpumem::allocator_config::parse(rec.config);
    const gpumem::replay_result r = gpumem::replay_trace(gpumem::compile_trace(t), ro);
    EXPECT_EQ(r.oom_event_index, t.recorded_oom_event);  // the recorded out-of-memory, reproduced
    EXPECT_EQ(r.peak_reserved, figures(t).peak_reserved);
    if (rec.peak_without > 0) {
      allocation_trace without = t;
      without.events.erase(std::remove_if(without.events.begin(), without.events.end(),
                                          [](const trace_event& e) {
                                            return e.kind == trace_event_kind::empty_cache;
                                          }),
                           without.events.end());
      without.recorded_oom_event = *t.recorded_oom_event - 2;  // two empty_cache events before
      EXPECT_EQ(gpumem::replay_trace(gpumem::compile_trace(without), ro).peak_reserved,
                rec.peak_without);
    }
  }
}

TEST(Rebuild, OldSchemaBlocksWithoutAddress) {
  const auto old_block = [](std::int64_t size, std::int64_t requested, const char* state) {
    return pickle_value::make_dict(dict{{"size", size},
                                        {"requested_size", requested},
                                        {"state", state},
                                        {"history", pickle_value::make_list()}});
  };
  const allocation_trace t = read_value(
      snapshot({segment(seg_addr, mib2,
                        {old_block(4096, 4000, "active_allocated"), old_block(8192, 0, "inactive"),
                         old_block(mib2 - 12288, 0, "active_allocated")})},
               {event("snapshot", 0, 0)}));
  ASSERT_EQ(t.events.size(), 2u);
  const auto a = static_cast<std::uint64_t>(seg_addr);
  EXPECT_EQ(t.events[0], (trace_event{trace_event_kind::alloc, a, 4000, 0, no_time}));
  // requested_size 0: the block's size stands in.
  EXPECT_EQ(t.events[1], (trace_event{trace_event_kind::alloc, a + 12288,
                                      static_cast<std::uint64_t>(mib2 - 12288), 0, no_time}));
}

TEST(Rebuild, DeviceSelection) {
  pickle_value v = pickle_value::make_dict(dict{
      {"segments", pickle_value::make_list(seq{
                       segment(seg_addr, mib2, {block(seg_addr, mib2, 100, "active_allocated")}, 0),
                       segment(seg_addr + mib2, mib2,
                               {block(seg_addr + mib2, mib2, 200, "active_allocated")}, 1)})},
      {"device_traces",
       pickle_value::make_list(
           seq{pickle_value::make_list(),
               pickle_value::make_list(seq{event("free_requested", seg_addr + 3 * mib2, 8, 1),
                                           event("free_completed", seg_addr + 3 * mib2, 8, 2)})})},
  });
  const allocation_trace d0 = read_value(v, 0);
  ASSERT_EQ(d0.events.size(), 1u);
  EXPECT_EQ(d0.events[0].size, 100u);
  const allocation_trace d1 = read_value(v, 1);
  ASSERT_EQ(d1.events.size(), 4u);  // its block, the one freed in its trace, and the two frees
  EXPECT_EQ(d1.initial_events, 2u);
  EXPECT_EQ(first_violation(d1), "");
  EXPECT_THROW(read_value(v, 2), trace_error);
  EXPECT_THROW(read_value(v, -1), std::invalid_argument);
}

// --- Malformed snapshots ------------------------------------------------------------------------

// The trace_error of reading `v`: its message must contain every fragment; returns its offset.
std::size_t expect_refused(const pickle_value& v, std::initializer_list<std::string> fragments,
                           int device = 0) {
  try {
    read_value(v, device);
  } catch (const trace_error& e) {
    for (const std::string& f : fragments) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message: " << e.what() << "\nexpected to contain: " << f;
    }
    return e.offset();
  }
  ADD_FAILURE() << "not refused";
  return 0;
}

TEST(Malformed, Structure) {
  expect_refused(pickle_value::make_list(), {"top level", "a list, not a dict"});
  expect_refused(pickle_value::make_dict(dict{{"device_traces", pickle_value::make_list()}}),
                 {"no 'segments'"});
  expect_refused(pickle_value::make_dict(dict{{"segments", 5}}), {"'segments' is a int"});
  expect_refused(snapshot({5}, {}), {"segment 0", "a int, not a dict"});
  expect_refused(snapshot({segment(seg_addr, -1, {})}, {}),
                 {"segment 0", "'total_size' is negative"});
  expect_refused(snapshot({pickle_value::make_dict(dict{{"total_size", 1}})}, {}),
                 {"segment 0", "no 'address'"});
  // A block of negative size: the offset is the block dict's byte offset in the file.
  const pickle_value bad =
      snapshot({segment(seg_addr, mib2, {block(seg_addr, -512, 0, "inactive")})}, {});
  const std::string bytes = gpumem::detail::pickle_dumps(bad);
  try {
    read_bytes(bytes);
    ADD_FAILURE() << "not refused";
  } catch (const trace_error& e) {
    EXPECT_NE(std::string(e.what()).find("segment 0 block 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'size' is negative (-512)"), std::string::npos);
    EXPECT_EQ(static_cast<unsigned char>(bytes[e.offset()]), 0x7d);  // EMPTY_DICT
  }
  expect_refused(snapshot({segment(seg_addr, mib2, {block(seg_addr, 512, 0, "weird")})}, {}),
                 {"unknown block state 'weird'"});
  expect_refused(snapshot({segment(seg_addr, mib2,
                                   {block(seg_addr, 512, 0, "active_allocated"),
                                    block(seg_addr, 512, 0, "active_allocated")})},
                          {}),
                 {"a second active block"});
  expect_refused(
      snapshot({segment(seg_addr, mib2, {block(seg_addr, 0, 0, "active_allocated")})}, {}),
      {"an active block of 0 bytes"});
  expect_refused(
      pickle_value::make_dict(dict{{"segments", pickle_value::make_list()}, {"device_traces", 3}}),
      {"'device_traces' is a int"});
  expect_refused(snapshot({}, {}), {"device 0 has neither segments nor trace events"});
}

TEST(Malformed, EventsSayWhichEvent) {
  const seq one_segment{segment(seg_addr, mib2, {block(seg_addr, mib2, 0, "inactive")})};
  EXPECT_EQ(expect_refused(
                snapshot(one_segment, {event("alloc", seg_addr, 8), event("frobnicate", 1, 1)}),
                {"event 1", "unknown action 'frobnicate'"}),
            1u);
  // A free of an address that is not live.
  EXPECT_EQ(expect_refused(snapshot(one_segment, {event("alloc", seg_addr, 8),
                                                  event("free_requested", seg_addr, 8),
                                                  event("free_completed", seg_addr, 8),
                                                  event("free_requested", seg_addr + 512, 8)}),
                           {"event 3", "free_requested of 0x7f0000000200"}),
            3u);
  // An alloc of an address that stays live (the final state already has it).
  EXPECT_EQ(expect_refused(
                snapshot({segment(seg_addr, mib2, {block(seg_addr, 512, 8, "active_allocated")})},
                         {event("alloc", seg_addr, 8), event("alloc", seg_addr, 8)}),
                {"event 0", "alloc of 0x7f0000000000"}),
            0u);
  // free_completed with no free_requested.
  expect_refused(
      snapshot(one_segment, {event("alloc", seg_addr, 8), event("free_completed", seg_addr, 8)}),
      {"event 0", "event 1 frees (free_completed) with no free_requested"});
  // An alloc never freed, yet not in the final state.
  expect_refused(snapshot(one_segment, {event("alloc", seg_addr, 8)}),
                 {"event 0", "not live afterwards"});
  // A block live again after its free completed, with no alloc.
  expect_refused(snapshot({segment(seg_addr, mib2, {block(seg_addr, 512, 8, "active_allocated")})},
                          {event("free_completed", seg_addr, 8)}),
                 {"event 0", "live again afterwards"});
  expect_refused(snapshot(one_segment, {event("segment_alloc", seg_addr, 4 * mib2)}),
                 {"event 0", "more than the final segments"});
  expect_refused(snapshot(one_segment, {event("alloc", seg_addr, 0)}), {"event 0", "0 bytes"});
  expect_refused(snapshot(one_segment, {event("alloc", -5, 8)}), {"event 0", "'addr' is negative"});
  expect_refused(snapshot(one_segment, {pickle_value::make_dict(dict{{"action", 3}})}),
                 {"event 0", "'action' is a int"});
  expect_refused(snapshot(one_segment, {pickle_value::make_dict(dict{{"action", "alloc"}})}),
                 {"event 0", "no 'addr'"});
  expect_refused(snapshot(one_segment, {pickle_value::make_list()}), {"event 0", "not a dict"});
  // The device's memory at an out-of-memory (reserved + device_free) beyond 64 bits.
  constexpr std::int64_t most = std::numeric_limits<std::int64_t>::max();
  expect_refused(
      snapshot(
          {segment(0, most, {}), segment(0, most, {})},
          {event("alloc", seg_addr, 8), event("free_requested", seg_addr, 8),
           event("free_completed", seg_addr, 8),
           pickle_value::make_dict(dict{{"action", "oom"}, {"device_free", most}, {"size", 8}})}),
      {"event 3", "'device_free' and the reserved memory overflow 64 bits"});
}

// Pickle opcodes, for snapshots that pickle_dumps would not write (shared through the memo).
std::string op(std::initializer_list<int> bytes) {
  std::string s;
  for (int x : bytes) s += static_cast<char>(x);
  return s;
}
std::string str_op(const std::string& s) {  // SHORT_BINUNICODE
  return op({0x8c, static_cast<int>(s.size())}) + s;
}

TEST(Malformed, ContainersSharedThroughTheMemo) {
  // The same marker event twice (the first is refused: it is shared): walking shared events
  // again and again would take time quadratic in the input.
  const std::string marker = op({0x7d}) + str_op("action") + str_op("snapshot") + op({0x73});
  const std::string events_shared = op({0x80, 4, 0x7d, 0x28}) + str_op("segments") + op({0x5d}) +
                                    str_op("device_traces") + op({0x5d, 0x5d, 0x28}) + marker +
                                    op({0x94, 0x68, 0, 0x65, 0x61, 0x75, 0x2e});
  ASSERT_NO_THROW(gpumem::detail::unpickle(events_shared));
  try {
    read_bytes(events_shared);
    ADD_FAILURE() << "not refused";
  } catch (const trace_error& e) {
    EXPECT_NE(std::string(e.what()).find("event 0: this dict is also elsewhere"), std::string::npos)
        << e.what();
    EXPECT_EQ(e.offset(), 0u);
  }
  // Two segments with one list of blocks.
  const std::string blocks = op({0x5d}) + op({0x7d, 0x28}) + str_op("size") + op({0x4b, 8}) +
                             str_op("state") + str_op("inactive") + op({0x75, 0x61});
  const auto seg = [](int address, const std::string& blocks_op) {
    return op({0x7d, 0x28}) + str_op("address") + op({0x4b, address}) + str_op("total_size") +
           op({0x4b, 8}) + str_op("blocks") + blocks_op + op({0x75});
  };
  const std::string blocks_shared = op({0x80, 4, 0x7d}) + str_op("segments") + op({0x5d, 0x28}) +
                                    seg(16, blocks + op({0x94})) + seg(32, op({0x68, 0})) +
                                    op({0x65, 0x73, 0x2e});
  try {
    read_bytes(blocks_shared);
    ADD_FAILURE() << "not refused";
  } catch (const trace_error& e) {
    EXPECT_NE(std::string(e.what()).find("segment 0 (byte"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("this list is also elsewhere"), std::string::npos)
        << e.what();
  }
  // Without the sharing, the same snapshot reads.
  const std::string blocks_apart = op({0x80, 4, 0x7d}) + str_op("segments") + op({0x5d, 0x28}) +
                                   seg(16, blocks) + seg(32, blocks) + op({0x65, 0x73, 0x2e});
  EXPECT_EQ(read_bytes(blocks_apart).recorded_initial_reserved, std::optional<std::uint64_t>(16));
}

TEST(Malformed, NegativeTimeIsRefused) {
  // No reader or writer of the other formats can carry a negative time.
  const seq one_segment{segment(seg_addr, mib2, {block(seg_addr, mib2, 0, "inactive")})};
  EXPECT_EQ(expect_refused(snapshot(one_segment, {event("alloc", seg_addr, 8, 5),
                                                  event("free_requested", seg_addr, 8, -3),
                                                  event("free_completed", seg_addr, 8, 7)}),
                           {"event 1", "'time_us' is negative (-3)"}),
            1u);
}

using gpumem_test::best_seconds;

TEST(Scale, ReadingTimeGrowsWithTheEvents) {
  // n and 4n recorded events (alloc, free_requested, free_completed over 1000 addresses): 4x the
  // events may take about 4x the time, not 16x (the events list grew by exact reserves). The
  // bound is 6x, as a loaded machine made it up to 4.7x.
  const auto make = [](std::size_t n) {
    seq events;
    events.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      static const char* const actions[] = {"alloc", "free_requested", "free_completed"};
      const auto address = seg_addr + static_cast<std::int64_t>((i / 3) % 1000) * 512;
      events.push_back(event(actions[i % 3], address, 512, static_cast<std::int64_t>(i)));
    }
    return gpumem::detail::pickle_dumps(snapshot(
        {segment(seg_addr, mib2, {block(seg_addr, mib2, 0, "inactive")})}, std::move(events)));
  };
  const std::size_t n = 150000;
  const std::string small = make(n);
  const std::string large = make(4 * n);
  std::size_t small_events = 0;
  std::size_t large_events = 0;
  const auto [t1, t4] = best_seconds(
      3, [&] { small_events = read_bytes(small).events.size(); },
      [&] { large_events = read_bytes(large).events.size(); });
  EXPECT_EQ(small_events, n);
  EXPECT_EQ(large_events, 4 * n);
  std::cout << n << " events (" << small.size() / 1000 << " kB): " << t1 * 1e3 << " ms; " << 4 * n
            << " events (" << large.size() / 1000 << " kB): " << t4 * 1e3 << " ms ("
            << static_cast<double>(large.size()) / 1e6 / t4 << " MB/s)\n";
  EXPECT_LT(t4, 6 * t1) << "reading time grows faster than the number of events";
}

TEST(Malformed, BytesAndFiles) {
  EXPECT_THROW(read_bytes("not a pickle"), trace_error);
  EXPECT_THROW(read_bytes(""), trace_error);
  // Truncating a valid snapshot anywhere is a trace_error.
  const std::string whole = gpumem::detail::pickle_dumps(
      snapshot({segment(seg_addr, mib2, {block(seg_addr, 512, 8, "active_allocated")})},
               {event("alloc", seg_addr, 8, 1), event("free_requested", seg_addr, 8, 2),
                event("free_completed", seg_addr, 8, 3), event("alloc", seg_addr, 8, 4)}));
  EXPECT_EQ(read_bytes(whole).events.size(), 4u);
  for (std::size_t n = 0; n < whole.size(); ++n) {
    EXPECT_THROW(read_bytes(whole.substr(0, n)), trace_error) << n;
  }
  try {
    gpumem::read_pytorch_snapshot(std::string("/nonexistent/gpumem/snapshot.pickle"));
    ADD_FAILURE() << "not refused";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/gpumem/snapshot.pickle"), std::string::npos);
  }
  // Errors from a file name the file; the stream overload reads the same bytes.
  const std::string path = ::testing::TempDir() + "gpumem_bad_snapshot.pickle";
  {
    std::ofstream out(path, std::ios::binary);
    out << gpumem::detail::pickle_dumps(pickle_value::make_list());
  }
  try {
    gpumem::read_pytorch_snapshot(path);
    ADD_FAILURE() << "not refused";
  } catch (const trace_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ": PyTorch snapshot: top level", 0), 0u)
        << e.what();
  }
  {
    std::ofstream out(path, std::ios::binary);
    out << whole;
  }
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(gpumem::read_pytorch_snapshot(in), read_bytes(whole));
  std::remove(path.c_str());
}

}  // namespace
