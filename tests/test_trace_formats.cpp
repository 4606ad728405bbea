// The trace event model, the native text format and RMM's CSV log: parsing, writing, round trips,
// and the errors bad input gets.
#include <cstdint>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "gpumem/error.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/rmm_csv.hpp"

namespace {

using gpumem::allocation_trace;
using gpumem::trace_error;
using gpumem::trace_event;
using gpumem::trace_event_kind;
using K = gpumem::trace_event_kind;

allocation_trace sample_trace() {
  allocation_trace t;
  t.source = "unit test";
  t.recorded_config = "expandable_segments:False";
  t.recorded_initial_reserved = 20u << 20;
  t.device_memory = std::uint64_t{80} << 30;
  t.initial_events = 1;
  t.events = {
      {K::alloc, 0x7f0000000000, 4194304, 0, gpumem::no_time},
      {K::alloc, 0x7f0000400000, 1024, 7, 100},
      {K::record_stream, 0x7f0000400000, 0, 3, 101},
      {K::segment_alloc, 0x7f0000800000, 20971520, 0, 102},
      {K::free_requested, 0x7f0000400000, 1024, 7, 103},
      {K::free_completed, 0x7f0000400000, 1024, 7, 110},
      {K::segment_free, 0x7f0000800000, 20971520, 0, 111},
      {K::free_requested, 0x7f0000000000, 4194304, 0, gpumem::no_time},
  };
  t.recorded_oom_event = 8;
  return t;
}

std::string to_native(const allocation_trace& t) {
  std::ostringstream out;
  gpumem::write_native_trace(out, t);
  return out.str();
}

// Parses `text` and returns the trace_error's offset; fails the test if it parses.
std::size_t error_offset(const std::string& text, std::string* message = nullptr) {
  try {
    gpumem::parse_native_trace(text);
  } catch (const trace_error& e) {
    if (message != nullptr) *message = e.what();
    return e.offset();
  }
  ADD_FAILURE() << "parsed without error:\n" << text;
  return static_cast<std::size_t>(-1);
}

TEST(TraceEvent, KindNamesRoundTrip) {
  for (K k : {K::alloc, K::free_requested, K::free_completed, K::record_stream, K::segment_alloc,
              K::segment_free}) {
    EXPECT_EQ(gpumem::trace_event_kind_from_string(gpumem::to_string(k)), k);
  }
  EXPECT_FALSE(gpumem::trace_event_kind_from_string("free"));
}

TEST(TraceEvent, ValidateNamesTheFirstBadEvent) {
  allocation_trace t = sample_trace();
  EXPECT_NO_THROW(gpumem::validate_trace(t));

  auto bad_at = [](allocation_trace tr) -> std::size_t {
    try {
      gpumem::validate_trace(tr);
    } catch (const trace_error& e) {
      return e.offset();
    }
    return static_cast<std::size_t>(-1);
  };
  allocation_trace free_unknown = sample_trace();
  free_unknown.events[4].address = 0x1234;
  EXPECT_EQ(bad_at(free_unknown), 4u);

  allocation_trace double_alloc = sample_trace();
  double_alloc.events[1].address = 0x7f0000000000;
  EXPECT_EQ(bad_at(double_alloc), 1u);

  allocation_trace completed_without_request = sample_trace();
  completed_without_request.events[4].kind = K::record_stream;
  EXPECT_EQ(bad_at(completed_without_request), 5u);

  allocation_trace zero = sample_trace();
  zero.events[1].size = 0;
  EXPECT_EQ(bad_at(zero), 1u);

  allocation_trace initial_not_alloc = sample_trace();
  initial_not_alloc.initial_events = 3;
  EXPECT_EQ(bad_at(initial_not_alloc), 2u);

  // A block whose free was requested but never completed may be allocated again (RMM logs).
  allocation_trace reuse;
  reuse.events = {{K::alloc, 0x100, 8, 0, -1},
                  {K::free_requested, 0x100, 8, 0, -1},
                  {K::alloc, 0x100, 16, 0, -1}};
  EXPECT_NO_THROW(gpumem::validate_trace(reuse));
}

TEST(NativeFormat, RoundTripsEveryField) {
  const allocation_trace t = sample_trace();
  const std::string text = to_native(t);
  EXPECT_EQ(text.rfind("gpumem-trace 1\n", 0), 0u);
  EXPECT_NE(text.find("record_stream 0x7f0000400000 0 3 101\n"), std::string::npos);
  EXPECT_EQ(gpumem::parse_native_trace(text), t);
}

TEST(NativeFormat, ReadsHandWrittenText) {
  const std::string text =
      "gpumem-trace 1\r\n"
      "# a comment\n"
      "\n"
      "@source  hand written  \n"
      "alloc 0xABC 100 0\n"
      "alloc\t0x1000\t200\t2\t55\n"
      "free_requested 0xabc 0 0\n";
  const allocation_trace t = gpumem::parse_native_trace(text);
  EXPECT_EQ(t.source, "hand written");
  ASSERT_EQ(t.events.size(), 3u);
  EXPECT_EQ(t.events[0], (trace_event{K::alloc, 0xabc, 100, 0, gpumem::no_time}));
  EXPECT_EQ(t.events[1], (trace_event{K::alloc, 0x1000, 200, 2, 55}));
  EXPECT_EQ(t.events[2].kind, K::free_requested);
}

TEST(NativeFormat, ErrorsCarryTheByteOffset) {
  const std::string head = "gpumem-trace 1\nalloc 0x10 8 0\n";
  std::string message;
  // Unknown kind: the offset is the start of the third line.
  EXPECT_EQ(error_offset(head + "malloc 0x10 8 0\n", &message), head.size());
  EXPECT_NE(message.find("line 3"), std::string::npos) << message;
  EXPECT_NE(message.find("malloc"), std::string::npos) << message;
  // A negative size points at the size field.
  EXPECT_EQ(error_offset(head + "alloc 0x20 -8 0\n", &message), head.size() + 11);
  EXPECT_NE(message.find("negative"), std::string::npos) << message;
  EXPECT_EQ(error_offset(head + "alloc 0x20 99999999999999999999 0\n", &message), head.size() + 11);
  EXPECT_NE(message.find("64 bits"), std::string::npos) << message;
  EXPECT_EQ(error_offset(head + "alloc 20 8 0\n"), head.size() + 6);   // address without 0x
  EXPECT_EQ(error_offset(head + "alloc 0x20 8\n"), head.size() + 12);  // missing stream
  EXPECT_EQ(error_offset(head + "alloc 0x20 8 0 1 2\n"), head.size() + 17);
  EXPECT_EQ(error_offset(head + "@source late\n"), head.size());
  EXPECT_EQ(error_offset("gpumem-trace 1\n@colour blue\n"), 15u);
  EXPECT_EQ(error_offset("gpumem-trace 1\n@source a\n@source b\n"), 25u);
  EXPECT_EQ(error_offset("gpumem-trace 2\n", &message), 13u);
  EXPECT_NE(message.find("version '2'"), std::string::npos) << message;
  EXPECT_EQ(error_offset("Thread,Time,Action,Pointer,Size,Stream\n"), 0u);
  EXPECT_EQ(error_offset(""), 0u);
}

TEST(NativeFormat, MeaningErrorsCarryTheEventIndex) {
  std::string message;
  EXPECT_EQ(error_offset("gpumem-trace 1\nalloc 0x10 8 0\nfree_requested 0x20 8 0\n", &message),
            1u);
  EXPECT_NE(message.find("event 1"), std::string::npos) << message;
  EXPECT_NE(message.find("not live"), std::string::npos) << message;
  EXPECT_EQ(error_offset("gpumem-trace 1\n@initial_events 5\nalloc 0x10 8 0\n"), 1u);
}

TEST(NativeFormat, EveryTruncationParsesOrThrowsTraceError) {
  const std::string text = to_native(sample_trace());
  for (std::size_t n = 0; n < text.size(); ++n) {
    try {
      gpumem::parse_native_trace(text.substr(0, n));
    } catch (const trace_error&) {
    }
  }
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    std::string corrupted = text;
    const std::size_t at = rng() % corrupted.size();
    corrupted[at] = static_cast<char>(rng() % 256);
    try {
      gpumem::parse_native_trace(corrupted);
    } catch (const trace_error&) {
    }
  }
}

TEST(NativeFormat, ReadsAFileAndReportsAMissingOne) {
  EXPECT_THROW(gpumem::read_native_trace("/nonexistent/gpumem.trace"), std::system_error);
}

TEST(RmmCsv, ReadsRmmsLog) {
  const std::string log =
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "140573312345856,23:59:59.999000,allocate,0x7f8a40000000,1024,0x0\n"
      "140573312345856,00:00:00.000500,allocate,0x7f8a40000400,2048,0x7f8a38001020\n"
      "140573312345856,00:00:00.001000,free,0x7f8a40000000,1024,0x0\n"
      "140573312345856,00:00:00.002000,allocate failure,(nil),1099511627776,0x0\n"
      "140573312345856,00:00:00.003000,deallocate,0x7f8a40000400,2048,0x7f8a38001020\n";
  const allocation_trace t = gpumem::parse_rmm_csv(log);
  EXPECT_EQ(t.source, "rmm-csv");
  ASSERT_EQ(t.events.size(), 4u);
  EXPECT_EQ(t.events[0], (trace_event{K::alloc, 0x7f8a40000000, 1024, 0, 86399999000}));
  // The clock passed midnight: times keep increasing.
  EXPECT_EQ(t.events[1],
            (trace_event{K::alloc, 0x7f8a40000400, 2048, 0x7f8a38001020, 86400000000 + 500}));
  EXPECT_EQ(t.events[2].kind, K::free_requested);
  EXPECT_EQ(t.recorded_oom_event, std::optional<std::size_t>(3));
  EXPECT_EQ(t.events[3].kind, K::free_requested);
}

TEST(RmmCsv, RoundTripsWhatItCanSay) {
  allocation_trace t;
  t.events = {{K::alloc, 0x1000, 100, 0, 5},
              {K::alloc, 0x2000, 200, 9, 6},
              {K::free_requested, 0x1000, 100, 0, 7},
              {K::free_requested, 0x2000, 200, 9, 8}};
  t.recorded_oom_event = 2;
  std::ostringstream out;
  gpumem::write_rmm_csv(out, t);
  allocation_trace back = gpumem::parse_rmm_csv(out.str());
  back.source.clear();
  EXPECT_EQ(back, t);

  // free_completed, record_stream and segment events have no RMM equivalent: they are dropped,
  // and a free carries the size of its allocation even when the trace did not know it.
  const allocation_trace rich = sample_trace();
  std::ostringstream rich_out;
  gpumem::write_rmm_csv(rich_out, rich);
  const allocation_trace lossy = gpumem::parse_rmm_csv(rich_out.str());
  std::size_t frees = 0;
  for (const trace_event& e : lossy.events) {
    EXPECT_TRUE(e.kind == K::alloc || e.kind == K::free_requested);
    if (e.kind == K::free_requested) {
      ++frees;
      EXPECT_GT(e.size, 0u);
    }
  }
  EXPECT_EQ(frees, 2u);
}

TEST(RmmCsv, BadRowsCarryTheByteOffset) {
  const std::string head = "Thread,Time,Action,Pointer,Size,Stream\n";
  auto offset_of = [](const std::string& text, std::string* message = nullptr) {
    try {
      gpumem::parse_rmm_csv(text);
    } catch (const trace_error& e) {
      if (message != nullptr) *message = e.what();
      return e.offset();
    }
    return static_cast<std::size_t>(-1);
  };
  std::string message;
  EXPECT_EQ(offset_of(head + "1,00:00:01.0,alloc,0x10,8,0x0\n", &message), head.size() + 13);
  EXPECT_NE(message.find("unknown action"), std::string::npos) << message;
  EXPECT_EQ(offset_of(head + "1,00:00:01.0,allocate,0x10,-8,0x0\n"), head.size() + 27);
  EXPECT_EQ(offset_of(head + "1,99:77:01.0,allocate,0x10,8,0x0\n"), head.size() + 2);
  EXPECT_EQ(offset_of(head + "1,00:00:01.0,allocate,0x10,8\n"), head.size() + 28);
  EXPECT_EQ(offset_of(head + "1,00:00:01.0,allocate,0x10,8,0x0,extra\n"), head.size() + 33);
  EXPECT_EQ(offset_of("Thread,When,Action\n"), 0u);
  EXPECT_EQ(offset_of(head + "1,00:00:01.0,free,0x10,8,0x0\n", &message), 0u);  // event 0
  EXPECT_NE(message.find("event 0"), std::string::npos) << message;
}

TEST(NativeFormat, EveryBundledTraceReadsAndRoundTrips) {
  const std::filesystem::path dir =
      std::filesystem::path(__FILE__).parent_path().parent_path() / "examples" / "traces";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " is not there";
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".trace") continue;
    ++files;
    const allocation_trace t = gpumem::read_native_trace(entry.path().string());
    EXPECT_GT(t.events.size(), 1000u) << entry.path();
    EXPECT_EQ(t.source.rfind("trace_model.py ", 0), 0u) << entry.path();
    EXPECT_EQ(gpumem::parse_native_trace(to_native(t)), t) << entry.path();
  }
  EXPECT_GE(files, 5u);
}

}  // namespace
