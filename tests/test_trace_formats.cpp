// The trace event model, the native text format and RMM's CSV log: parsing, writing, round trips,
// and the errors bad input gets.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <istream>
#include <random>
#include <sstream>
#include <streambuf>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

#include "gpumem/error.hpp"
#include "gpumem/trace/event.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/rmm_csv.hpp"
#include "gpumem/trace/trace_io.hpp"

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
  EXPECT_EQ(error_offset("gpumem-trace 3\n", &message), 13u);
  EXPECT_NE(message.find("version '3'"), std::string::npos) << message;
  // Version 1 has no empty_cache event (a reader of version 1 would not know it).
  EXPECT_EQ(error_offset("gpumem-trace 1\nempty_cache\n", &message), 15u);
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

TEST(NativeFormat, HeaderTextRoundTripsForEveryByte) {
  // What the reader accepts in header text, the writer writes back as it was; the rest (control
  // characters: '\r' used to be read into the value and cut by the writer) is refused.
  for (int c = 0; c < 256; ++c) {
    if (c == '\n') continue;  // ends the line
    SCOPED_TRACE(c);
    const std::string value = std::string("abc") + static_cast<char>(c) + "def";
    const std::string text = "gpumem-trace 1\n@source " + value + "\nalloc 0x10 8 0\n";
    allocation_trace t;
    try {
      t = gpumem::parse_native_trace(text);
    } catch (const trace_error& e) {
      EXPECT_TRUE(c < 0x20 || c == 0x7f) << e.what();
      EXPECT_EQ(e.offset(), 15u + 8 + 3);  // the control character itself
      EXPECT_NE(std::string(e.what()).find("control character"), std::string::npos) << e.what();
      continue;
    }
    EXPECT_EQ(t.source, value);
    EXPECT_EQ(gpumem::parse_native_trace(to_native(t)), t);
  }
  // A trace built in code: each control character becomes a space, on one line.
  allocation_trace built = sample_trace();
  built.source = "  one\r\ntwo\x01three\t";
  built.recorded_config = "a\nb";
  const allocation_trace back = gpumem::parse_native_trace(to_native(built));
  EXPECT_EQ(back.source, "one  two three");
  EXPECT_EQ(back.recorded_config, "a b");
  EXPECT_EQ(back.events, built.events);
}

TEST(NativeFormat, ByteOrderMarkIsSkipped) {
  const std::string bom = "\xef\xbb\xbf";
  const allocation_trace t = sample_trace();
  EXPECT_EQ(gpumem::parse_native_trace(bom + to_native(t)), t);
  // Offsets still count the mark: they are the file's.
  EXPECT_EQ(error_offset(bom + "gpumem-trace 1\nmalloc 0x10 8 0\n"), 18u);
  EXPECT_EQ(error_offset(bom + bom + "gpumem-trace 1\n"), 3u);  // one mark only
}

TEST(RmmCsv, ByteOrderMarkIsSkipped) {
  const std::string log =
      "\xef\xbb\xbfThread,Time,Action,Pointer,Size,Stream\r\n"
      "1,00:00:01.000000,allocate,0x10,8,0x0\r\n";
  const allocation_trace t = gpumem::parse_rmm_csv(log);
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0], (trace_event{K::alloc, 0x10, 8, 0, 1000000}));
}

TEST(RmmCsv, ErrorsNameTheirFormat) {
  try {
    gpumem::parse_rmm_csv("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:01.0,alloc,0x10,8,0\n");
    ADD_FAILURE() << "not refused";
  } catch (const trace_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("RMM memory event log: line 2, column 14", 0), 0u)
        << e.what();
  }
}

TEST(RmmCsv, TimesThatWouldOverflowAreRefused) {
  const std::string head = "Thread,Time,Action,Pointer,Size,Stream\n";
  const auto refused = [&](const std::string& rows, const std::string& fragment) {
    try {
      const allocation_trace t = gpumem::parse_rmm_csv(head + rows);
      ADD_FAILURE() << "read, first time " << (t.events.empty() ? 0 : t.events[0].time_us);
    } catch (const trace_error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      return e.offset();
    }
    return std::size_t{0};
  };
  // Hours of 10+ digits overflowed 64 bits (undefined behaviour) into negative times.
  EXPECT_EQ(refused("1,9999999999999:00:00.000000,allocate,0x10,8,0x0\n", "line 2, column 3"),
            head.size() + 2);
  refused("1,3074457345618258:00:00.0,allocate,0x10,8,0x0\n", "not HH:MM:SS");
  refused("1,1099511627777,allocate,0x10,8,0x0\n", "at most 2^40 seconds");
  // 2^40 s is the latest time, passes over midnight included.
  const std::string latest = "1,1099511627776.999999,allocate,0x10,8,0x0\n";
  EXPECT_EQ(gpumem::parse_rmm_csv(head + latest).events[0].time_us,
            gpumem::detail::max_csv_time_us);
  refused(latest + "1,1099511500000,free,0x10,8,0x0\n1,1099511627776,allocate,0x20,8,0x0\n",
          "line 4, column 3");
  refused(latest + "1,1099511500000,free,0x10,8,0x0\n1,1099511627776,allocate,0x20,8,0x0\n",
          "the time '1099511627776' is past 2^40 seconds once the clock's 1 passes over midnight");
}

TEST(RmmCsv, ClockGoingBackMoreThanADay) {
  // Found by fuzz_rmm_csv: from 46:59:59.9 back to 00:00:00.1, midnight passed twice, not once
  // (once left the second time 23 hours before the first, and the written log read back another).
  const std::string log =
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,46:59:59.9,allocate,0x10,8,0x0\n"
      "1,00:00:00.1,free,0x10,9,0x0\n";
  const allocation_trace t = gpumem::parse_rmm_csv(log);
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.events[1].time_us, std::int64_t{48} * 3600 * 1000000 + 100000);
  std::ostringstream out;
  gpumem::write_rmm_csv(out, t);
  EXPECT_EQ(gpumem::parse_rmm_csv(out.str()), t) << out.str();
}

TEST(RmmCsv, ReadWriteReadKeepsTheTrace) {
  // Times past the first day (the clock passed midnight twice), a row without a time, a free of
  // another size than its allocation, and the out-of-memory row at the end.
  const std::string log =
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,23:00:00.000001,allocate,0x10,8,0x0\n"
      "1,01:00:00.5,allocate,0x20,16,0x7\n"
      "1,,free,0x10,4,0x0\n"
      "1,23:59:59.999999,free,0x20,16,0x7\n"
      "1,00:00:00.000000,allocate,0x10,8,0x0\n"
      "1,13:00:00.000000,allocate failure,(nil),99,0x0\n";
  const allocation_trace t = gpumem::parse_rmm_csv(log);
  ASSERT_EQ(t.events.size(), 5u);
  const std::int64_t day = std::int64_t{86400} * 1000000;
  EXPECT_EQ(t.events[1].time_us, day + 3600 * std::int64_t{1000000} + 500000);
  EXPECT_EQ(t.events[2].time_us, gpumem::no_time);
  EXPECT_EQ(t.events[4].time_us, 2 * day);
  std::ostringstream out;
  gpumem::write_rmm_csv(out, t);
  EXPECT_NE(out.str().find("1,48:00:00.000000,allocate,0x10,8,0x0\n"), std::string::npos)
      << out.str();
  EXPECT_EQ(gpumem::parse_rmm_csv(out.str()), t) << out.str();
  // A time no reader could take back is refused by the writer.
  allocation_trace negative = t;
  negative.events[3].time_us = -5;
  std::ostringstream ignored;
  EXPECT_THROW(gpumem::write_rmm_csv(ignored, negative), trace_error);
}

// An endless stream: `head`, then `fill` bytes forever; counts the bytes it hands out.
class endless_buf : public std::streambuf {
 public:
  endless_buf(std::string head, char fill) : head_(std::move(head)), chunk_(1 << 16, fill) {}
  std::uint64_t served() const { return served_; }

 protected:
  int_type underflow() override {
    std::string& next = head_done_ || head_.empty() ? chunk_ : head_;
    head_done_ = true;
    setg(next.data(), next.data(), next.data() + next.size());
    served_ += next.size();
    return traits_type::to_int_type(*gptr());
  }

 private:
  std::string head_;
  std::string chunk_;
  std::uint64_t served_ = 0;
  bool head_done_ = false;
};

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Runs `read` and returns the message of the exception of type E it throws ("" if none).
template <class E, class F>
std::string message_of(F&& read) {
  try {
    read();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return "";
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

TEST(TraceIo, UnknownInputIsRefusedAfterItsFirstBytes) {
  endless_buf zeros("", '\0');
  std::istream in(&zeros);
  const std::string message = message_of<trace_error>([&] { gpumem::read_trace(in, "zeros"); });
  EXPECT_TRUE(starts_with(message, "zeros: not a trace gpumem can read")) << message;
  EXPECT_LE(zeros.served(), std::uint64_t{1} << 16);
  // /dev/zero never ends: it used to be read until memory ran out (std::bad_alloc).
  if (std::filesystem::exists("/dev/zero")) {
    const std::string dev = message_of<trace_error>([] { gpumem::read_trace("/dev/zero"); });
    EXPECT_TRUE(starts_with(dev, "/dev/zero: not a trace gpumem can read")) << dev;
  }
}

TEST(TraceIo, InputPastTheLimitIsRefused) {
  // A trace that never ends is read up to the limit only.
  endless_buf comments("gpumem-trace 1\n", '\n');
  std::istream in(&comments);
  const std::uint64_t limit = std::uint64_t{1} << 20;
  const std::string message = message_of<trace_error>(
      [&] { gpumem::detail::read_trace_bytes(in, "endless", std::nullopt, 0, limit); });
  EXPECT_TRUE(starts_with(message, "endless: 1048577 bytes or more, larger than the 1 MiB"))
      << message;
  EXPECT_LE(comments.served(), limit + (1 << 16) + 256);
  // A regular file says its size before it is read.
  const std::string path =
      write_file("gpumem_long.trace", "gpumem-trace 1\n" + std::string(5000, '\n'));
  const std::string file = message_of<trace_error>(
      [&] { gpumem::detail::read_trace_file(path, gpumem::trace_format::native, 4096); });
  EXPECT_TRUE(starts_with(file, path + ": 5015 bytes or more, larger than the 4096 bytes")) << file;
  EXPECT_EQ(gpumem::detail::read_trace_file(path, gpumem::trace_format::native, 5015).size(),
            5015u);
  std::remove(path.c_str());
  EXPECT_EQ(gpumem::max_trace_bytes, std::uint64_t{8} << 30);
}

TEST(TraceIo, DirectoriesEmptyAndMissingFilesNameThePath) {
  std::string dir = ::testing::TempDir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const auto is_a_directory = [&](auto&& read) {
    const std::string message = message_of<std::system_error>(read);
    EXPECT_TRUE(starts_with(message, dir + ": ")) << message;
    EXPECT_NE(message.find("directory"), std::string::npos) << message;
  };
  is_a_directory([&] { gpumem::read_trace(dir); });
  is_a_directory([&] { gpumem::read_native_trace(dir); });
  is_a_directory([&] { gpumem::read_rmm_csv(dir); });
  is_a_directory([&] { gpumem::read_pytorch_snapshot(dir); });

  const std::string empty = write_file("gpumem_empty.trace", "");
  const std::string message = message_of<trace_error>([&] { gpumem::read_trace(empty); });
  EXPECT_TRUE(starts_with(message, empty + ": the file is empty (expected a gpumem trace"))
      << message;
  EXPECT_TRUE(starts_with(message_of<trace_error>([&] { gpumem::read_native_trace(empty); }),
                          empty + ": the file is empty (expected gpumem trace)"));
  std::remove(empty.c_str());
  EXPECT_TRUE(
      starts_with(message_of<trace_error>([] { gpumem::parse_trace(""); }), "the input is empty"));

  const std::string missing = dir + "/gpumem_no_such.trace";
  EXPECT_NE(message_of<std::system_error>([&] { gpumem::read_trace(missing); }).find(missing),
            std::string::npos);
}

TEST(TraceIo, ErrorsNameTheFileAndTheFormat) {
  const std::string native =
      write_file("gpumem_bad.trace", "gpumem-trace 1\nalloc 0x10 8 0\nmalloc 0x10 8 0\n");
  EXPECT_TRUE(starts_with(message_of<trace_error>([&] { gpumem::read_trace(native); }),
                          native + ": gpumem trace: line 3, column 1"));
  EXPECT_TRUE(starts_with(message_of<trace_error>([&] { gpumem::read_native_trace(native); }),
                          native + ": gpumem trace: line 3, column 1"));
  // A reader of one format refuses another at once.
  EXPECT_TRUE(starts_with(message_of<trace_error>([&] { gpumem::read_rmm_csv(native); }),
                          native + ": not an RMM memory event log"));
  EXPECT_TRUE(starts_with(message_of<trace_error>([&] { gpumem::read_pytorch_snapshot(native); }),
                          native + ": not a PyTorch memory snapshot"));
  std::remove(native.c_str());
  const std::string csv =
      write_file("gpumem_bad.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,,alloc,0x10,8,0x0\n");
  EXPECT_TRUE(starts_with(message_of<trace_error>([&] { gpumem::read_trace(csv); }),
                          csv + ": RMM memory event log: line 2, column 4"));
  std::remove(csv.c_str());
}

TEST(TraceIo, ReadsEveryFormatFromAStream) {
  const allocation_trace t = sample_trace();
  std::ostringstream csv;
  gpumem::write_rmm_csv(csv, t);
  for (const std::string& bytes :
       {to_native(t), "\xef\xbb\xbf" + to_native(t), csv.str(), "\xef\xbb\xbf" + csv.str()}) {
    std::istringstream in(bytes);
    EXPECT_EQ(gpumem::read_trace(in, "-"), gpumem::parse_trace(bytes));
  }
  std::istringstream bad("gpumem-trace 1\nfree_requested 0x10 8 0\n");
  EXPECT_TRUE(starts_with(message_of<trace_error>([&] { gpumem::read_trace(bad, "-"); }),
                          "-: trace: event 0"));
}

TEST(NativeFormat, EveryBundledTraceReadsAndRoundTrips) {
  const std::filesystem::path dir = GPUMEM_EXAMPLE_TRACES;
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir << " is not there";
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
