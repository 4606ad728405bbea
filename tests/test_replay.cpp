// Replaying traces on a simulated device: hand-built traces whose numbers are known by
// construction, the out-of-memory result, the search for the smallest device, and the recorder.
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../bench/workload_traces.hpp"
#include "gpumem/config.hpp"
#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/simulated_device.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/recorder.hpp"
#include "gpumem/trace/replay.hpp"

namespace {

using gpumem::allocation_trace;
using K = gpumem::trace_event_kind;
constexpr std::uint64_t MiB = std::uint64_t{1} << 20;

gpumem::replay_options options_for(const std::string& config, std::uint64_t device) {
  gpumem::replay_options o;
  o.config = gpumem::allocator_config::parse(config);
  o.device_memory = static_cast<std::size_t>(device);
  return o;
}

gpumem::replay_result replay(const allocation_trace& t, const std::string& config,
                             std::uint64_t device) {
  return gpumem::replay_trace(gpumem::compile_trace(t), options_for(config, device));
}

allocation_trace events(std::vector<gpumem::trace_event> e) {
  allocation_trace t;
  t.events = std::move(e);
  return t;
}

// Three 30 MiB tensors live at once, then freed: every figure is 90 MiB.
allocation_trace three_large() {
  return events({{K::alloc, 0x1000, 30 * MiB, 0, -1},
                 {K::alloc, 0x2000, 30 * MiB, 0, -1},
                 {K::alloc, 0x3000, 30 * MiB, 0, -1},
                 {K::free_requested, 0x1000, 30 * MiB, 0, -1},
                 {K::free_requested, 0x2000, 30 * MiB, 0, -1},
                 {K::free_requested, 0x3000, 30 * MiB, 0, -1}});
}

// A 60 MiB block is freed and a 20 MiB block is cut from its segment; a 50 MiB request then finds
// 40 MiB free in that segment (too small) and cannot release it (the segment is in use). Classic
// needs 60 + 50 = 110 MiB of device; 70 MiB are requested.
allocation_trace split_survivor() {
  return events({{K::alloc, 0x1000, 60 * MiB, 0, -1},
                 {K::free_requested, 0x1000, 60 * MiB, 0, -1},
                 {K::free_completed, 0x1000, 60 * MiB, 0, -1},
                 {K::alloc, 0x2000, 20 * MiB, 0, -1},
                 {K::alloc, 0x3000, 50 * MiB, 0, -1},
                 {K::free_requested, 0x2000, 20 * MiB, 0, -1},
                 {K::free_requested, 0x3000, 50 * MiB, 0, -1}});
}

TEST(CompileTrace, PairsFreesAndCountsRequestedBytes) {
  const allocation_trace t = events({{K::alloc, 0xa, 100, 0, -1},
                                     {K::alloc, 0xb, 50, 9, -1},
                                     {K::free_requested, 0xa, 100, 0, -1},
                                     {K::record_stream, 0xb, 0, 4, -1},
                                     {K::free_completed, 0xa, 100, 0, -1},
                                     {K::free_requested, 0xb, 50, 9, -1},
                                     {K::segment_alloc, 0x0, 4096, 0, -1}});
  const gpumem::compiled_trace c = gpumem::compile_trace(t);
  using op = gpumem::compiled_trace::op_kind;
  ASSERT_EQ(c.ops.size(), 7u);
  EXPECT_EQ(c.ops[2].kind, op::release);  // a free_completed follows
  EXPECT_EQ(c.ops[4].kind, op::free);
  EXPECT_EQ(c.ops[5].kind, op::release_free);  // none follows
  EXPECT_EQ(c.ops[6].kind, op::none);
  EXPECT_EQ(c.ops[1].slot, c.ops[5].slot);
  EXPECT_EQ(c.stream_ids, (std::vector<std::uint64_t>{0, 9, 4}));
  EXPECT_EQ(c.ops[3].stream, 2u);
  EXPECT_EQ(c.allocations, 2u);
  EXPECT_EQ(c.peak_requested, 150u);
  EXPECT_EQ(c.peak_requested_event, 1u);
  EXPECT_EQ(c.recorded_peak_reserved, std::optional<std::uint64_t>(4096));
}

TEST(CompileTrace, RecordedReservedFollowsTheSegmentEvents) {
  allocation_trace t = events({{K::segment_alloc, 0x0, 50, 0, -1},
                               {K::segment_free, 0x0, 100, 0, -1},
                               {K::segment_alloc, 0x0, 10, 0, -1}});
  t.recorded_initial_reserved = 100;
  const gpumem::compiled_trace c = gpumem::compile_trace(t);
  EXPECT_EQ(c.recorded_peak_reserved, std::optional<std::uint64_t>(150));
  EXPECT_EQ(c.recorded_segment_allocs, 2u);
  EXPECT_EQ(c.recorded_segment_frees, 1u);
  EXPECT_FALSE(gpumem::compile_trace(three_large()).recorded_peak_reserved);
}

TEST(CompileTrace, RejectsAnInvalidTraceWithTheEventIndex) {
  allocation_trace t = three_large();
  t.events[4].address = 0x9999;
  try {
    gpumem::compile_trace(t);
    FAIL() << "compiled";
  } catch (const gpumem::trace_error& e) {
    EXPECT_EQ(e.offset(), 4u);
  }
}

TEST(CompileTrace, RefusesTotalsPastTwoToTheSixtyFour) {
  // Two live blocks of 2^63 bytes: the peak used to wrap to 0.
  const std::uint64_t half = std::uint64_t{1} << 63;
  const auto refused_at = [](const allocation_trace& t) -> std::size_t {
    try {
      const gpumem::compiled_trace c = gpumem::compile_trace(t);
      ADD_FAILURE() << "compiled; peak requested " << c.peak_requested;
    } catch (const gpumem::trace_error& e) {
      EXPECT_NE(std::string(e.what()).find("pass 2^64"), std::string::npos) << e.what();
      return e.offset();
    }
    return 0;
  };
  EXPECT_EQ(refused_at(events({{K::alloc, 0xa, half - 1, 0, -1},
                               {K::alloc, 0xb, 1, 0, -1},
                               {K::free_requested, 0xb, 1, 0, -1},
                               {K::alloc, 0xc, half, 0, -1},
                               {K::alloc, 0xd, 1, 0, -1}})),
            4u);
  allocation_trace segments = events({{K::segment_alloc, 0x0, half, 0, -1},
                                      {K::segment_free, 0x0, 1, 0, -1},
                                      {K::segment_alloc, 0x0, half, 0, -1}});
  segments.recorded_initial_reserved = 1;
  EXPECT_EQ(refused_at(segments), 2u);
  // Up to 2^64 - 1 is fine.
  const gpumem::compiled_trace c = gpumem::compile_trace(
      events({{K::alloc, 0xa, half - 1, 0, -1}, {K::alloc, 0xb, half, 0, -1}}));
  EXPECT_EQ(c.peak_requested, UINT64_MAX);
  EXPECT_EQ(c.peak_requested_event, 1u);
}

// Steps: the trace again and again, what is live at a step's end freed before the next (0x4000,
// never freed, comes back each step), with each step's device calls. Classic's cache serves the
// second step without a device call.
TEST(ReplaySteps, RepeatTheTraceAndFreeWhatIsLiveBetweenSteps) {
  allocation_trace t = split_survivor();
  t.events.push_back({K::alloc, 0x4000, 5 * MiB, 0, -1});  // never freed
  gpumem::replay_options o = options_for("policy:classic", 1024 * MiB);
  o.steps = 3;
  o.check_invariants = true;
  o.record_samples = true;
  const gpumem::compiled_trace c = gpumem::compile_trace(t);
  const gpumem::replay_result r = gpumem::replay_trace(c, o);
  ASSERT_TRUE(r.completed);
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_EQ(r.events_replayed, 3 * c.ops.size());
  EXPECT_EQ(r.samples.size(), 3 * c.ops.size());
  EXPECT_EQ(r.samples.back().event_index, 3 * c.ops.size() - 1);
  EXPECT_GT(r.steps[0].device_calls(), 0u);
  EXPECT_EQ(r.steps[1].device_calls(), 0u);
  EXPECT_EQ(r.steps[2].device_calls(), 0u);
  EXPECT_EQ(r.steps[2].host_synchronizations(), 0u);
  // The program's peak: 20 + 50 MiB requested at once (released before 0x4000 comes), every step.
  EXPECT_EQ(r.peak_requested, (20 + 50) * MiB);
  // Each step starts from nothing live: the second step's samples begin where the first's did.
  EXPECT_EQ(r.samples[c.ops.size()].requested, r.samples[0].requested);
}

TEST(ReplaySteps, AnOutOfMemoryNamesItsStep) {
  // The trace holds 70 MiB at once: on 60 MiB its first step runs out, and replaying stops there.
  gpumem::replay_options o = options_for("policy:classic", 60 * MiB);
  o.steps = 2;
  const gpumem::replay_result r = gpumem::replay_trace(gpumem::compile_trace(split_survivor()), o);
  EXPECT_FALSE(r.completed);
  EXPECT_EQ(r.oom_step, 0u);
  ASSERT_TRUE(r.oom_event_index);
  EXPECT_EQ(r.steps.size(), 1u);
}

TEST(Replay, KnownPeaksAndDeviceCalls) {
  const gpumem::replay_result r = replay(three_large(), "policy:classic", 1024 * MiB);
  EXPECT_TRUE(r.completed);
  EXPECT_FALSE(r.oom_event_index);
  EXPECT_EQ(r.policy, "classic");
  EXPECT_EQ(r.events_replayed, 6u);
  EXPECT_EQ(r.peak_requested, 90 * MiB);
  EXPECT_EQ(r.peak_allocated, 90 * MiB);
  EXPECT_EQ(r.peak_reserved, 90 * MiB);
  EXPECT_EQ(r.device_alloc_calls(), 3u);
  EXPECT_EQ(r.device_free_calls(), 0u);  // the cache keeps them
  EXPECT_GT(r.simulated_seconds, 0.0);   // typical costs are charged
  EXPECT_GT(r.events_per_second(), 0.0);
}

TEST(Replay, AFreeIsReusableOnlyOnceCompleted) {
  // B is allocated between A's free_requested and free_completed: it cannot reuse A's block.
  const allocation_trace pending = events({{K::alloc, 0x1000, 30 * MiB, 0, -1},
                                           {K::free_requested, 0x1000, 30 * MiB, 0, -1},
                                           {K::alloc, 0x2000, 30 * MiB, 0, -1},
                                           {K::free_completed, 0x1000, 30 * MiB, 0, -1}});
  const gpumem::replay_result r = replay(pending, "policy:classic", 1024 * MiB);
  EXPECT_EQ(r.peak_requested, 30 * MiB);
  EXPECT_EQ(r.peak_reserved, 60 * MiB);
  // Without free_completed the block returns at free_requested and B reuses it.
  const allocation_trace at_once = events({{K::alloc, 0x1000, 30 * MiB, 0, -1},
                                           {K::free_requested, 0x1000, 30 * MiB, 0, -1},
                                           {K::alloc, 0x2000, 30 * MiB, 0, -1}});
  EXPECT_EQ(replay(at_once, "policy:classic", 1024 * MiB).peak_reserved, 30 * MiB);
}

TEST(Replay, StreamsKeepTheirOwnPools) {
  const allocation_trace t = events({{K::alloc, 0x1000, 30 * MiB, 5, -1},
                                     {K::free_requested, 0x1000, 30 * MiB, 5, -1},
                                     {K::alloc, 0x2000, 30 * MiB, 0, -1}});
  EXPECT_EQ(replay(t, "policy:classic", 1024 * MiB).peak_reserved, 60 * MiB);
}

TEST(Replay, ClassicRunsOutOfMemoryWhereStitchCompletes) {
  const gpumem::replay_result classic = replay(split_survivor(), "policy:classic", 100 * MiB);
  EXPECT_FALSE(classic.completed);
  ASSERT_TRUE(classic.oom_event_index);
  EXPECT_EQ(*classic.oom_event_index, 4u);
  EXPECT_EQ(classic.events_replayed, 4u);
  EXPECT_EQ(classic.oom_request_bytes, 50 * MiB);
  EXPECT_NE(classic.oom_message.find("Tried to allocate 50.00 MiB"), std::string::npos)
      << classic.oom_message;
  EXPECT_NE(classic.memory_summary.find("GPU reserved memory"), std::string::npos);
  EXPECT_EQ(classic.peak_reserved, 60 * MiB);
  EXPECT_EQ(classic.snapshot_event, std::optional<std::size_t>(4));
  ASSERT_EQ(classic.segments.size(), 1u);  // the segment the 20 MiB block holds on to
  EXPECT_EQ(classic.segments[0].total_size, 60 * MiB);

  const gpumem::replay_result stitch = replay(split_survivor(), "policy:stitch", 100 * MiB);
  EXPECT_TRUE(stitch.completed) << stitch.oom_message;
  EXPECT_EQ(stitch.policy, "stitch");
  EXPECT_EQ(stitch.peak_requested, 70 * MiB);
  EXPECT_LE(stitch.peak_reserved, 100 * MiB);
}

TEST(Replay, SegmentsSayWhichPagesAreMapped) {
  gpumem::replay_options o = options_for("policy:stitch", 100 * MiB);
  o.record_samples = true;
  o.snapshot_after_event = 4;  // the 50 MiB block was stitched from the freed 60 MiB's pages
  const gpumem::replay_result r = gpumem::replay_trace(gpumem::compile_trace(split_survivor()), o);
  ASSERT_TRUE(r.completed);
  std::uint64_t mapped = 0, counted = 0, total = 0, unmapped_blocks = 0;
  for (const auto& s : r.segments) {
    mapped += s.mapped_size;
    counted += s.reserved_size;
    EXPECT_LE(s.reserved_size, s.mapped_size);
    total += s.total_size;
    std::uint64_t mapped_blocks = 0;
    for (const gpumem::block_snapshot& b : s.blocks) {
      if (b.mapped) {
        mapped_blocks += b.size;
      } else {
        ++unmapped_blocks;
        EXPECT_EQ(b.state, gpumem::block_state::inactive);
      }
    }
    EXPECT_EQ(mapped_blocks, s.mapped_size);
  }
  // The 50 MiB block's pages are the freed 60 MiB block's, mapped at a second address: each
  // physical page counts once, so the segments' reserved sizes add up to reserved memory.
  EXPECT_EQ(counted, r.samples[4].reserved);
  EXPECT_GT(mapped, counted);
  EXPECT_GT(total, mapped);  // the address ranges span unmapped pages too
  EXPECT_GT(unmapped_blocks, 0u);
}

TEST(Replay, SamplesFollowEveryEvent) {
  gpumem::replay_options o = options_for("policy:classic", 1024 * MiB);
  o.record_samples = true;
  o.snapshot_after_event = 2;
  std::size_t last_done = 0, calls = 0;
  o.progress = [&](std::size_t done, std::size_t total) {
    EXPECT_EQ(total, 6u);
    last_done = done;
    ++calls;
  };
  const gpumem::replay_result r = gpumem::replay_trace(gpumem::compile_trace(three_large()), o);
  ASSERT_EQ(r.samples.size(), 6u);
  const std::uint64_t expected_requested[] = {30, 60, 90, 60, 30, 0};
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(r.samples[i].event_index, i);
    EXPECT_EQ(r.samples[i].requested, expected_requested[i] * MiB) << i;
    EXPECT_EQ(r.samples[i].reserved, std::min<std::uint64_t>(i + 1, 3) * 30 * MiB) << i;
  }
  EXPECT_EQ(r.samples[5].allocated, 0u);
  EXPECT_EQ(r.snapshot_event, std::optional<std::size_t>(2));
  EXPECT_EQ(r.segments.size(), 3u);
  EXPECT_EQ(last_done, 6u);
  EXPECT_GE(calls, 1u);
}

TEST(Replay, HistoryUsesTheAddressesOfTheAllocatorUnderTest) {
  allocation_trace t = three_large();
  t.initial_events = 1;
  gpumem::replay_options o = options_for("policy:classic", 1024 * MiB);
  o.record_history = true;
  o.snapshot_after_event = 2;  // all three live
  const gpumem::replay_result r = gpumem::replay_trace(gpumem::compile_trace(t), o);
  const allocation_trace& h = r.history;
  ASSERT_EQ(h.events.size(), 9u);  // 3 allocs, each free as requested + completed
  EXPECT_EQ(h.initial_events, 1u);
  std::vector<std::uint64_t> segment_starts;
  for (const auto& s : r.segments) segment_starts.push_back(s.address);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(h.events[i].kind, K::alloc);
    EXPECT_NE(h.events[i].address, t.events[i].address);  // not the recorded address
    EXPECT_NE(std::find(segment_starts.begin(), segment_starts.end(), h.events[i].address),
              segment_starts.end());
  }
  EXPECT_EQ(h.events[3].kind, K::free_requested);
  EXPECT_EQ(h.events[4].kind, K::free_completed);
  EXPECT_EQ(h.events[3].address, h.events[0].address);
  EXPECT_NO_THROW(gpumem::validate_trace(h));
}

TEST(Replay, InitialEventsAreReplayedFirst) {
  allocation_trace t = three_large();
  t.initial_events = 2;
  const gpumem::replay_result r = replay(t, "policy:classic", 1024 * MiB);
  EXPECT_EQ(r.peak_reserved, 90 * MiB);
  // A device too small for the initial state runs out of memory on the second one.
  const gpumem::replay_result small = replay(t, "policy:classic", 50 * MiB);
  EXPECT_EQ(small.oom_event_index, std::optional<std::size_t>(1));
}

TEST(FindMinDeviceMemory, FindsTheSizeByConstruction) {
  const gpumem::compiled_trace three = gpumem::compile_trace(three_large());
  std::size_t probes = 0;
  const auto min_three =
      gpumem::find_min_device_memory(three, options_for("policy:classic", 0), std::size_t{1} << 40,
                                     1u << 20, [&](std::size_t, bool) { ++probes; });
  EXPECT_EQ(min_three, std::optional<std::size_t>(90 * MiB));
  EXPECT_EQ(probes, 1u);  // the peak requested already fits

  const gpumem::compiled_trace survivor = gpumem::compile_trace(split_survivor());
  const auto min_classic = gpumem::find_min_device_memory(
      survivor, options_for("policy:classic", 0), std::size_t{1} << 40);
  EXPECT_EQ(min_classic, std::optional<std::size_t>(110 * MiB));
  const auto min_stitch = gpumem::find_min_device_memory(survivor, options_for("policy:stitch", 0),
                                                         std::size_t{1} << 40);
  ASSERT_TRUE(min_stitch);
  EXPECT_GE(*min_stitch, 70 * MiB);
  EXPECT_LE(*min_stitch, 72 * MiB);
  // Nothing completes below what is requested at once.
  EXPECT_FALSE(gpumem::find_min_device_memory(survivor, options_for("policy:stitch", 0), 60 * MiB));
}

TEST(FindMinDeviceMemory, APeakAboveTheLimitProbesNothing) {
  // Rounding a peak near 2^64 up to the resolution wrapped to 0: the search probed tiny devices.
  std::size_t probes = 0;
  const auto found = gpumem::search_min_device_memory(UINT64_MAX - 5, std::size_t{1} << 40,
                                                      std::size_t{1} << 20, [&](std::size_t) {
                                                        ++probes;
                                                        return false;
                                                      });
  EXPECT_FALSE(found);
  EXPECT_EQ(probes, 0u);
}

TEST(Recorder, RecordsWhatTheProgramAsked) {
  gpumem::simulated_device device(std::size_t{1} << 30);
  gpumem::caching_allocator<gpumem::simulated_device> alloc(
      device, gpumem::allocator_config::parse("policy:classic"));
  gpumem::recording_allocator recorder(alloc);
  const gpumem::simulated_stream side = device.create_stream();
  void* a = recorder.allocate(1000, device.default_stream());
  void* b = recorder.allocate(3 * MiB, side);
  recorder.record_stream(a, side);
  recorder.deallocate(a);
  EXPECT_THROW(recorder.allocate(std::size_t{2} << 30, side), gpumem::out_of_memory);
  recorder.deallocate(b);
  const allocation_trace t = recorder.trace();
  ASSERT_EQ(t.events.size(), 5u);
  EXPECT_EQ(t.events[0].kind, K::alloc);
  EXPECT_EQ(t.events[0].address, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(t.events[0].size, 1000u);
  EXPECT_EQ(t.events[1].stream, side.id);
  EXPECT_EQ(t.events[2].kind, K::record_stream);
  EXPECT_EQ(t.events[3].kind, K::free_requested);
  EXPECT_EQ(t.events[3].size, 1000u);
  EXPECT_EQ(t.recorded_oom_event, std::optional<std::size_t>(4));
  EXPECT_EQ(t.events[4].size, 3 * MiB);
  for (std::size_t i = 1; i < t.events.size(); ++i) {
    EXPECT_GE(t.events[i].time_us, t.events[i - 1].time_us);
  }
  // What was recorded replays to what the allocator itself saw.
  const gpumem::replay_result r = replay(t, "policy:classic", std::uint64_t{1} << 30);
  EXPECT_TRUE(r.completed);
  EXPECT_EQ(static_cast<std::int64_t>(r.peak_reserved), alloc.stats().reserved_bytes[0].peak);
}

TEST(Recorder, StreamsTheNativeFormat) {
  gpumem::simulated_device device(std::size_t{1} << 30);
  gpumem::caching_allocator<gpumem::simulated_device> alloc(
      device, gpumem::allocator_config::parse("policy:classic"));
  std::ostringstream sink;
  {
    gpumem::recording_allocator recorder(alloc, sink);
    std::vector<void*> live;
    for (int i = 0; i < 10000; ++i) {
      live.push_back(recorder.allocate(static_cast<std::size_t>(512 + i % 7 * 4096)));
      if (i % 3 == 2) {
        recorder.deallocate(live.front());
        live.erase(live.begin());
      }
    }
    for (void* p : live) recorder.deallocate(p);
  }
  const allocation_trace back = gpumem::parse_native_trace(sink.str());
  EXPECT_EQ(back.events.size(), 20000u);
  EXPECT_EQ(back.source, "gpumem recording_allocator");
  const gpumem::replay_result r = replay(back, "policy:classic", std::uint64_t{1} << 30);
  EXPECT_TRUE(r.completed);
  EXPECT_EQ(static_cast<std::int64_t>(r.peak_allocated), alloc.stats().allocated_bytes[0].peak);
}

TEST(WorkloadTraces, ReplayingAWorkloadsTraceIsRunningTheWorkload) {
  // The benchmark's workloads written down as traces replay to exactly what the workload does to
  // the allocator when run directly.
  for (const char* name : {"split_survivor_123548", "two_pass_weights", "llm_training_varlen"}) {
    const gpumem::bench::workload_info* w = gpumem::bench::find_workload(name);
    ASSERT_NE(w, nullptr) << name;
    for (const char* config : {"policy:classic", "policy:stitch"}) {
      gpumem::simulated_device device(std::size_t{80} << 30);
      gpumem::caching_allocator<gpumem::simulated_device> alloc(
          device, gpumem::allocator_config::parse(config));
      std::vector<gpumem::simulated_stream> streams{device.default_stream()};
      auto stream_of = [&](gpumem::bench::stream_id id) {
        while (streams.size() <= id) streams.push_back(device.create_stream());
        return streams[id];
      };
      gpumem::bench::workload_context ctx(gpumem::bench::allocator_ops{
          [&](std::size_t bytes, gpumem::bench::stream_id s) {
            return alloc.allocate(bytes, stream_of(s));
          },
          [&](void* p) { alloc.deallocate(p); },
          [&](void* p, gpumem::bench::stream_id s) { alloc.record_stream(p, stream_of(s)); },
          [&] { alloc.empty_cache(); }});
      w->run(ctx, 1);
      const allocation_trace t = gpumem::bench::record_workload(*w, 1);
      const gpumem::replay_result r = replay(t, config, std::uint64_t{80} << 30);
      ASSERT_TRUE(r.completed) << name << " " << config;
      EXPECT_EQ(r.peak_requested, ctx.peak_requested()) << name << " " << config;
      EXPECT_EQ(static_cast<std::int64_t>(r.peak_reserved), alloc.stats().reserved_bytes[0].peak)
          << name << " " << config;
      EXPECT_EQ(static_cast<std::int64_t>(r.peak_allocated), alloc.stats().allocated_bytes[0].peak)
          << name << " " << config;
    }
  }
}

}  // namespace
