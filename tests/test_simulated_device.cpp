// Tests of the simulated device, its free-range index, the device concept traits, the call
// vocabulary and the size parser.
#include "gpumem/device/simulated_device.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gpumem/device/fault_injection.hpp"

namespace {

using gpumem::call_counters;
using gpumem::call_kind;
using gpumem::cost_model;
using gpumem::cuda_error;
using gpumem::event_completion;
using gpumem::fault_injection;
using gpumem::simulated_device;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

simulated_device::options with_capacity(std::size_t capacity) {
  simulated_device::options o;
  o.capacity = capacity;
  return o;
}

std::uintptr_t addr(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}
void* ptr(std::uintptr_t a) {
  return reinterpret_cast<void*>(a);
}

// Runs f, expects a cuda_error with `code`, returns its message ("" and a failure otherwise).
template <class F>
std::string expect_cuda_error(F&& f, int code) {
  try {
    f();
  } catch (const cuda_error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected cuda_error, got: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected cuda_error, nothing thrown";
  return {};
}

// Everything observable that misuse must leave unchanged.
struct device_state {
  std::size_t in_use, peak, segments, reservations, physical, mappings, events, streams, fallible;
  call_counters counters;
  double seconds;
  bool operator==(const device_state& o) const {
    return in_use == o.in_use && peak == o.peak && segments == o.segments &&
           reservations == o.reservations && physical == o.physical && mappings == o.mappings &&
           events == o.events && streams == o.streams && fallible == o.fallible &&
           counters == o.counters && seconds == o.seconds;
  }
};

device_state state_of(const simulated_device& d) {
  return {d.bytes_in_use(),   d.peak_bytes_in_use(), d.live_segments(),    d.live_reservations(),
          d.live_physical(),  d.live_mappings(),     d.live_events(),      d.live_streams(),
          d.fallible_calls(), d.counters(),          d.simulated_seconds()};
}

// --------------------------------------------------------------------------------------------
// Sizes
// --------------------------------------------------------------------------------------------

TEST(SizeUnits, ParsesBinaryUnitsAndFractions) {
  EXPECT_EQ(gpumem::parse_size("80GiB"), 80 * GiB);
  EXPECT_EQ(gpumem::parse_size("141GiB"), 141 * GiB);
  EXPECT_EQ(gpumem::parse_size("512MiB"), 512 * MiB);
  EXPECT_EQ(gpumem::parse_size("1.5GiB"), 3 * GiB / 2);
  EXPECT_EQ(gpumem::parse_size("1024"), 1024u);
  EXPECT_EQ(gpumem::parse_size(" 4 KiB "), 4 * KiB);
  EXPECT_EQ(gpumem::parse_size("64k"), 64 * KiB);
  EXPECT_EQ(gpumem::parse_size("2G"), 2 * GiB);
  EXPECT_EQ(gpumem::parse_size("1tib"), 1024 * GiB);
  EXPECT_EQ(gpumem::parse_size("7B"), 7u);
  EXPECT_EQ(gpumem::parse_size(".5K"), 512u);
  EXPECT_EQ(gpumem::parse_size("0.1KiB"), 102u);  // rounded down
  EXPECT_EQ(gpumem::parse_size("0"), 0u);
}

TEST(SizeUnits, RejectsMalformedInput) {
  for (const char* bad : {"", "  ", "GiB", "-1GiB", "+5", "1.2.3", "1e3", "10XB", "80GB", "5 mb",
                          "99999999999999999999", "16384PiB", "12 34"}) {
    EXPECT_THROW(gpumem::parse_size(bad), std::invalid_argument) << bad;
  }
  try {
    gpumem::parse_size("80GB");
    FAIL() << "80GB accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("\"80GB\""), std::string::npos) << what;
    EXPECT_NE(what.find("GiB"), std::string::npos) << what;
  }
}

TEST(SizeUnits, FormatsBytesAndRoundTrips) {
  EXPECT_EQ(gpumem::format_bytes(0), "0 B");
  EXPECT_EQ(gpumem::format_bytes(1023), "1023 B");
  EXPECT_EQ(gpumem::format_bytes(1024), "1 KiB");
  EXPECT_EQ(gpumem::format_bytes(80 * GiB), "80 GiB");
  EXPECT_EQ(gpumem::format_bytes(3 * GiB / 2), "1.50 GiB");
  EXPECT_EQ(gpumem::format_bytes(2 * MiB + 1), "2.00 MiB");
  for (std::size_t v : {std::size_t{0}, std::size_t{7}, 3 * KiB, 512 * MiB, 141 * GiB}) {
    EXPECT_EQ(gpumem::parse_size(gpumem::format_bytes(v)), v);
  }
}

// --------------------------------------------------------------------------------------------
// Concept traits and call vocabulary
// --------------------------------------------------------------------------------------------

struct fake_stream {
  int id;
  bool operator==(const fake_stream& o) const { return id == o.id; }
};
struct unhashable_stream {
  int id;
  bool operator==(const unhashable_stream& o) const { return id == o.id; }
};

}  // namespace

namespace std {
template <>
struct hash<fake_stream> {
  std::size_t operator()(const fake_stream& s) const noexcept { return std::hash<int>{}(s.id); }
};
}  // namespace std

namespace {

// Declarations suffice: the traits only look at unevaluated expressions.
template <class Stream, bool WithQuery>
struct fake_device {
  using stream_type = Stream;
  using event_type = int;
  static constexpr bool supports_vmm = false;
  int index() const noexcept;
  std::size_t total_memory() const;
  void memory_info(std::size_t&, std::size_t&);
  void* allocate(std::size_t);
  void deallocate(void*, std::size_t);
  stream_type default_stream() const noexcept;
  event_type create_event();
  void destroy_event(event_type);
  void record_event(event_type, stream_type);
  template <bool Q = WithQuery, std::enable_if_t<Q, int> = 0>
  bool query_event(event_type);
  void synchronize_event(event_type);
  void synchronize();
};

TEST(DeviceConcept, TraitsAcceptModelsAndRejectOthers) {
  EXPECT_TRUE((gpumem::is_device_v<fake_device<fake_stream, true>>));
  EXPECT_FALSE((gpumem::is_device_v<fake_device<fake_stream, false>>));       // no query_event
  EXPECT_FALSE((gpumem::is_device_v<fake_device<unhashable_stream, true>>));  // no std::hash
  EXPECT_FALSE(gpumem::is_device_v<int>);
  EXPECT_FALSE((gpumem::is_vmm_device_v<fake_device<fake_stream, true>>));
  EXPECT_TRUE(gpumem::is_device_v<simulated_device>);
  EXPECT_TRUE(gpumem::is_vmm_device_v<simulated_device>);
}

TEST(CallVocabulary, NamesCountersAndDifferences) {
  EXPECT_EQ(gpumem::call_kind_name(call_kind::mem_map), "mem_map");
  EXPECT_EQ(gpumem::call_kind_name(call_kind::device_synchronize), "device_synchronize");
  EXPECT_EQ(gpumem::cuda_call_name(call_kind::malloc), "cudaMalloc");
  EXPECT_EQ(gpumem::cuda_call_name(call_kind::set_access), "cuMemSetAccess");

  call_counters c;
  std::size_t i = 1;
  for (call_kind k : gpumem::all_call_kinds) c[k] = i++;
  // Each kind must land in its own named field.
  const std::size_t fields[] = {c.malloc,
                                c.free,
                                c.mem_get_info,
                                c.event_create,
                                c.event_destroy,
                                c.event_record,
                                c.event_query,
                                c.event_synchronize,
                                c.device_synchronize,
                                c.stream_create,
                                c.stream_destroy,
                                c.address_reserve,
                                c.address_free,
                                c.mem_create,
                                c.mem_release,
                                c.mem_map,
                                c.mem_unmap,
                                c.set_access,
                                c.stream_wait_event};
  for (std::size_t f = 0; f < gpumem::call_kind_count; ++f) EXPECT_EQ(fields[f], f + 1);
  EXPECT_EQ(c.total(), 19u * 20u / 2u);
  // Memory calls: everything but mem_get_info, the event create/destroy/record/query calls, the
  // stream calls and stream waits (values 3, 4, 5, 6, 7, 10, 11, 19).
  EXPECT_EQ(c.memory_calls(), 19u * 20u / 2u - (3u + 4u + 5u + 6u + 7u + 10u + 11u + 19u));
  // Host synchronisations: cudaFree, the event and device synchronisations (values 2, 8, 9).
  EXPECT_EQ(c.host_synchronizations(), 2u + 8u + 9u);

  call_counters before = c;
  c[call_kind::free] += 5;
  const call_counters diff = c - before;
  EXPECT_EQ(diff.free, 5u);
  EXPECT_EQ(diff.total(), 5u);
  EXPECT_NE(c, before);
}

// --------------------------------------------------------------------------------------------
// The free-range index
// --------------------------------------------------------------------------------------------

TEST(FreeRanges, SkipsRangesThatFitOnlyUnaligned) {
  gpumem::detail::free_ranges r;
  const std::uintptr_t base = std::uintptr_t{1} << 40;
  r.reset(base, 8 * MiB);
  EXPECT_EQ(r.take(512, 512), base);
  const std::uintptr_t y = r.take(2 * MiB, 512);
  EXPECT_EQ(y, base + 512);
  EXPECT_EQ(r.take(512, 512), base + 2 * MiB + 512);
  r.give_back(y, 2 * MiB);  // a 2 MiB hole starting 512 bytes past an aligned address
  EXPECT_EQ(r.take(2 * MiB, 2 * MiB), base + 4 * MiB);
  EXPECT_EQ(r.range_count(), 3u);
  EXPECT_EQ(r.free_bytes(), 8 * MiB - 1024 - 2 * MiB);
  EXPECT_EQ(r.take(16 * MiB, 512), 0u);
  EXPECT_THROW(r.give_back(base + 1024, 512), std::logic_error);  // overlaps the free hole
}

// Exact first fit, lowest address, checked against a brute-force model.
TEST(FreeRanges, MatchesBruteForceFirstFit) {
  const std::uintptr_t base = std::uintptr_t{1} << 36;
  const std::size_t space = 256 * MiB;
  gpumem::detail::free_ranges r;
  r.reset(base, space);
  std::map<std::uintptr_t, std::size_t> model{{base, space}};
  std::map<std::uintptr_t, std::size_t> used;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 30000; ++step) {
    if (used.empty() || rng() % 100 < 55) {
      const std::size_t size = 512 * (1 + rng() % 8192);
      const std::size_t align = std::size_t{512} << (rng() % 13);
      std::uintptr_t expected = 0;
      for (auto it = model.begin(); it != model.end(); ++it) {
        const std::uintptr_t a = (it->first + align - 1) & ~(std::uintptr_t{align} - 1);
        if (a + size <= it->first + it->second) {
          expected = a;
          const std::uintptr_t s = it->first;
          const std::size_t len = it->second;
          model.erase(it);
          if (a > s) model.emplace(s, a - s);
          if (a + size < s + len) model.emplace(a + size, s + len - a - size);
          break;
        }
      }
      ASSERT_EQ(r.take(size, align), expected) << "step " << step;
      if (expected != 0) used.emplace(expected, size);
    } else {
      auto it = used.begin();
      std::advance(it, static_cast<long>(rng() % used.size()));
      std::uintptr_t s = it->first;
      std::size_t len = it->second;
      r.give_back(s, len);
      auto next = model.lower_bound(s);
      if (next != model.end() && s + len == next->first) {
        len += next->second;
        next = model.erase(next);
      }
      if (next != model.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == s) {
          s = prev->first;
          len += prev->second;
          model.erase(prev);
        }
      }
      model.emplace(s, len);
      used.erase(it);
    }
    ASSERT_EQ(r.range_count(), model.size());
  }
  std::vector<std::pair<std::uintptr_t, std::size_t>> got;
  r.for_each([&](std::uintptr_t s, std::size_t len) { got.emplace_back(s, len); });
  const std::vector<std::pair<std::uintptr_t, std::size_t>> expected(model.begin(), model.end());
  EXPECT_EQ(got, expected);
}

// --------------------------------------------------------------------------------------------
// Segments
// --------------------------------------------------------------------------------------------

TEST(SimulatedDevice, Simulates80GiBOnASmallMachine) {
  simulated_device d(gpumem::parse_size("80GiB"));
  EXPECT_EQ(d.total_memory(), 80 * GiB);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  d.memory_info(free_bytes, total_bytes);
  EXPECT_EQ(free_bytes, 80 * GiB);
  EXPECT_EQ(total_bytes, 80 * GiB);

  void* big = d.allocate(70 * GiB);
  ASSERT_NE(big, nullptr);
  EXPECT_TRUE(d.is_device_pointer(big));
  EXPECT_FALSE(d.is_device_pointer(&free_bytes));
  EXPECT_EQ(d.bytes_in_use(), 70 * GiB);
  d.memory_info(free_bytes, total_bytes);
  EXPECT_EQ(free_bytes, 10 * GiB);
  d.deallocate(big, 70 * GiB);
  EXPECT_EQ(d.bytes_in_use(), 0u);

  simulated_device h200(gpumem::parse_size("141GiB"));
  void* all = h200.allocate(141 * GiB);
  EXPECT_NE(all, nullptr);
  h200.deallocate(all, 141 * GiB);
}

TEST(SimulatedDevice, SegmentsAreAlignedAndDisjoint) {
  simulated_device d(16 * GiB);
  std::vector<std::pair<std::uintptr_t, std::size_t>> live;
  for (std::size_t size : {std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{511},
                           std::size_t{513}, std::size_t{1000}, MiB + 1}) {
    void* p = d.allocate(size);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(addr(p) % 512, 0u) << size;
    live.emplace_back(addr(p), size);
  }
  for (std::size_t size : {2 * MiB, 2 * MiB + 1, 20 * MiB, GiB + 3}) {
    void* p = d.allocate(size);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(addr(p) % (2 * MiB), 0u) << size;
    live.emplace_back(addr(p), size);
  }
  std::sort(live.begin(), live.end());
  for (std::size_t i = 1; i < live.size(); ++i) {
    EXPECT_LE(live[i - 1].first + live[i - 1].second, live[i].first);
  }
  for (auto& [a, size] : live) d.deallocate(ptr(a), size);
  EXPECT_EQ(d.bytes_in_use(), 0u);
  EXPECT_EQ(d.live_segments(), 0u);
}

TEST(SimulatedDevice, ExhaustionReturnsNullptrAndFreedRangesAreReused) {
  simulated_device d(100 * MiB);
  std::vector<void*> p;
  for (int i = 0; i < 5; ++i) {
    p.push_back(d.allocate(20 * MiB));
    ASSERT_NE(p.back(), nullptr);
  }
  EXPECT_EQ(d.allocate(20 * MiB), nullptr);
  EXPECT_EQ(d.allocate(1), nullptr);  // 1 byte still needs a 2 MiB granule
  EXPECT_EQ(d.out_of_memory_failures(), 2u);
  std::size_t free_bytes = 1;
  std::size_t total_bytes = 0;
  d.memory_info(free_bytes, total_bytes);
  EXPECT_EQ(free_bytes, 0u);

  d.deallocate(p[2], 20 * MiB);
  void* again = d.allocate(20 * MiB);
  EXPECT_EQ(again, p[2]);
  for (int i = 0; i < 5; ++i)
    d.deallocate(i == 2 ? again : p[static_cast<std::size_t>(i)], 20 * MiB);
  EXPECT_EQ(d.bytes_in_use(), 0u);
}

TEST(SimulatedDevice, LowestAddressFirstFitCoalescesFreedRanges) {
  simulated_device d(GiB);
  void* a = d.allocate(4 * MiB);
  void* b = d.allocate(4 * MiB);
  void* c = d.allocate(4 * MiB);
  EXPECT_EQ(addr(b), addr(a) + 4 * MiB);
  EXPECT_EQ(addr(c), addr(b) + 4 * MiB);
  d.deallocate(a, 4 * MiB);
  d.deallocate(b, 4 * MiB);
  void* ab = d.allocate(8 * MiB);  // fits only if a and b were merged
  EXPECT_EQ(ab, a);
  d.deallocate(ab, 8 * MiB);
  d.deallocate(c, 4 * MiB);
  void* all = d.allocate(GiB);
  EXPECT_EQ(all, a);  // everything merged back into one range
  d.deallocate(all, GiB);
}

TEST(SimulatedDevice, SegmentGranularityDecidesCapacityUsed) {
  {
    simulated_device d(10 * MiB);  // default: 2 MiB
    void* p = d.allocate(1);
    EXPECT_EQ(d.bytes_in_use(), 2 * MiB);
    void* q = d.allocate(3 * MiB);
    EXPECT_EQ(d.bytes_in_use(), 6 * MiB);
    void* r = d.allocate(2 * MiB);
    void* s = d.allocate(2 * MiB);
    EXPECT_NE(s, nullptr);
    EXPECT_EQ(d.allocate(1), nullptr);
    d.deallocate(p, 1);
    d.deallocate(q, 3 * MiB);
    d.deallocate(r, 2 * MiB);
    d.deallocate(s, 2 * MiB);
  }
  for (std::size_t exact : {std::size_t{0}, std::size_t{1}}) {
    auto o = with_capacity(10 * MiB);
    o.segment_granularity = exact;
    simulated_device d(o);
    void* p = d.allocate(1000);
    EXPECT_EQ(d.bytes_in_use(), 1000u);
    d.deallocate(p, 1000);
  }
  {
    auto o = with_capacity(GiB);
    o.segment_granularity = 20 * MiB;
    simulated_device d(o);
    void* p = d.allocate(21 * MiB);
    EXPECT_EQ(d.bytes_in_use(), 40 * MiB);
    d.deallocate(p, 21 * MiB);
    EXPECT_EQ(d.bytes_in_use(), 0u);
  }
}

TEST(SimulatedDevice, ZeroBytesAndNullptr) {
  simulated_device d(GiB);
  EXPECT_EQ(d.allocate(0), nullptr);
  EXPECT_EQ(d.bytes_in_use(), 0u);
  EXPECT_EQ(d.out_of_memory_failures(), 0u);
  EXPECT_EQ(d.fallible_calls(), 0u);
  EXPECT_NO_THROW(d.deallocate(nullptr, 0));
  EXPECT_EQ(d.counters().malloc, 1u);
  EXPECT_EQ(d.counters().free, 1u);
  expect_cuda_error([&] { d.deallocate(nullptr, 5); }, simulated_device::error_invalid_value);
}

TEST(SimulatedDevice, FreeMisuseThrowsAndChangesNothing) {
  simulated_device d(GiB);
  simulated_device other(GiB);
  void* p = d.allocate(4 * MiB);
  void* foreign = other.allocate(4 * MiB);
  const device_state before = state_of(d);

  std::string m = expect_cuda_error([&] { d.deallocate(ptr(addr(p) + 512), 4 * MiB); },
                                    simulated_device::error_invalid_value);
  EXPECT_NE(m.find("inside the segment"), std::string::npos) << m;
  m = expect_cuda_error([&] { d.deallocate(p, 4 * MiB - 1); },
                        simulated_device::error_invalid_value);
  EXPECT_NE(m.find("allocated with 4194304 bytes"), std::string::npos) << m;
  m = expect_cuda_error([&] { d.deallocate(ptr(addr(p) + 64 * MiB), 4 * MiB); },
                        simulated_device::error_invalid_value);
  EXPECT_NE(m.find("not a live segment"), std::string::npos) << m;
  expect_cuda_error([&] { d.deallocate(foreign, 4 * MiB); }, simulated_device::error_invalid_value);
  EXPECT_EQ(state_of(d), before);

  d.deallocate(p, 4 * MiB);
  const device_state after_free = state_of(d);
  m = expect_cuda_error([&] { d.deallocate(p, 4 * MiB); }, simulated_device::error_invalid_value);
  EXPECT_NE(m.find("already freed"), std::string::npos) << m;
  EXPECT_EQ(state_of(d), after_free);
  other.deallocate(foreign, 4 * MiB);
}

TEST(SimulatedDevice, TracksPeakBytesInUse) {
  simulated_device d(GiB);
  void* a = d.allocate(100 * MiB);
  void* b = d.allocate(50 * MiB);
  d.deallocate(a, 100 * MiB);
  EXPECT_EQ(d.bytes_in_use(), 50 * MiB);
  EXPECT_EQ(d.peak_bytes_in_use(), 150 * MiB);
  d.reset_peak_bytes_in_use();
  EXPECT_EQ(d.peak_bytes_in_use(), 50 * MiB);
  d.deallocate(b, 50 * MiB);
  EXPECT_EQ(d.peak_bytes_in_use(), 50 * MiB);
}

// Random segments against a model: only capacity makes allocate fail; no overlap; all returned.
TEST(SimulatedDevice, RandomSegmentsMatchCapacityModel) {
  const std::size_t capacity = 8 * GiB;
  simulated_device d(capacity);
  std::map<std::uintptr_t, std::size_t> live;
  std::size_t expected_in_use = 0;
  const auto charge = [](std::size_t n) { return (n + 2 * MiB - 1) / (2 * MiB) * (2 * MiB); };
  std::mt19937_64 rng(42);
  std::size_t failures = 0;
  for (int step = 0; step < 100000; ++step) {
    if (live.empty() || rng() % 100 < 52) {
      const std::size_t size = rng() % 4 == 0 ? 1 + rng() % (256 * MiB) : 1 + rng() % MiB;
      void* p = d.allocate(size);
      if (p == nullptr) {
        ASSERT_GT(expected_in_use + charge(size), capacity) << "step " << step;
        ++failures;
        continue;
      }
      const std::uintptr_t a = addr(p);
      ASSERT_EQ(a % (size >= 2 * MiB ? 2 * MiB : 512), 0u);
      auto next = live.lower_bound(a);
      if (next != live.end()) {
        ASSERT_LE(a + size, next->first);
      }
      if (next != live.begin()) {
        ASSERT_LE(std::prev(next)->first + std::prev(next)->second, a);
      }
      live.emplace(a, size);
      expected_in_use += charge(size);
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      d.deallocate(ptr(it->first), it->second);
      expected_in_use -= charge(it->second);
      live.erase(it);
    }
    ASSERT_EQ(d.bytes_in_use(), expected_in_use);
  }
  EXPECT_GT(failures, 0u);  // the mix does reach the capacity
  for (auto& [a, size] : live) d.deallocate(ptr(a), size);
  EXPECT_EQ(d.bytes_in_use(), 0u);
  void* all = d.allocate(capacity);  // the address space coalesced back
  EXPECT_NE(all, nullptr);
  d.deallocate(all, capacity);
}

// Churn with many live segments must cost about as much per call as with few: the free-range and
// segment indexes are logarithmic. A linear search would make the large case ~32x slower; the
// ratio is immune to build type, sanitizers and machine speed.
double churn_seconds(std::size_t live_segments, int pairs) {
  auto o = with_capacity(80 * GiB);
  o.segment_granularity = 1;  // 64k segments of up to 500 KiB fit
  simulated_device d(o);
  std::vector<std::pair<void*, std::size_t>> live;
  std::mt19937_64 rng(3);
  const auto random_size = [&] { return 512 * (1 + rng() % 1000); };
  for (std::size_t i = 0; i < live_segments; ++i) {
    const std::size_t size = random_size();
    live.emplace_back(d.allocate(size), size);
    EXPECT_NE(live.back().first, nullptr);
  }
  for (std::size_t i = 0; i < live.size(); i += 2) {  // fragment the space: every other one
    d.deallocate(live[i].first, live[i].second);
    live[i].first = nullptr;
  }
  live.erase(std::remove_if(live.begin(), live.end(), [](auto& x) { return x.first == nullptr; }),
             live.end());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < pairs; ++i) {
    const std::size_t size = random_size();
    void* p = d.allocate(size);
    EXPECT_NE(p, nullptr);
    const std::size_t k = rng() % live.size();
    d.deallocate(live[k].first, live[k].second);
    live[k] = {p, size};
  }
  const auto stop = std::chrono::steady_clock::now();
  for (auto& [p, size] : live) d.deallocate(p, size);
  EXPECT_EQ(d.bytes_in_use(), 0u);
  return std::chrono::duration<double>(stop - start).count();
}

TEST(SimulatedDevice, CallCostDoesNotGrowWithLiveSegments) {
  constexpr int pairs = 40000;
  double few = churn_seconds(2 * 1000, pairs);
  double many = churn_seconds(2 * 32000, pairs);
  if (many >= 12 * few) {  // measure again before blaming the code for machine noise
    few = std::min(few, churn_seconds(2 * 1000, pairs));
    many = std::min(many, churn_seconds(2 * 32000, pairs));
  }
  EXPECT_LT(many, 12 * few) << "few: " << few << " s, many: " << many << " s";
}

// --------------------------------------------------------------------------------------------
// VMM
// --------------------------------------------------------------------------------------------

TEST(SimulatedVmm, ReserveCreateMapAccessUnmapReleaseFree) {
  simulated_device d(GiB);
  const std::size_t g = d.granularity();
  ASSERT_EQ(g, 2 * MiB);
  const std::uintptr_t va = d.reserve_address(8 * MiB);
  EXPECT_EQ(va % g, 0u);
  EXPECT_EQ(d.bytes_in_use(), 0u);  // address space costs no capacity
  const auto h1 = d.create_physical(2 * MiB);
  const auto h2 = d.create_physical(4 * MiB);
  ASSERT_NE(h1, simulated_device::invalid_physical_handle);
  ASSERT_NE(h2, simulated_device::invalid_physical_handle);
  EXPECT_EQ(d.bytes_in_use(), 6 * MiB);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  d.memory_info(free_bytes, total_bytes);
  EXPECT_EQ(free_bytes, GiB - 6 * MiB);

  d.map(va, 2 * MiB, 0, h1);
  d.map(va + 2 * MiB, 4 * MiB, 0, h2);
  EXPECT_TRUE(d.is_mapped(va + 3 * MiB));
  EXPECT_FALSE(d.is_accessible(va + 3 * MiB));
  EXPECT_FALSE(d.is_mapped(va + 6 * MiB));
  d.set_access(va, 6 * MiB);  // one call over two mappings
  EXPECT_TRUE(d.is_accessible(va));
  EXPECT_TRUE(d.is_accessible(va + 6 * MiB - 1));
  EXPECT_EQ(d.live_mappings(), 2u);

  d.unmap(va, 6 * MiB);  // one call over two mappings, as PyTorch does
  EXPECT_FALSE(d.is_mapped(va));
  EXPECT_EQ(d.bytes_in_use(), 6 * MiB);  // still held by the handles
  d.release_physical(h1);
  d.release_physical(h2);
  EXPECT_EQ(d.bytes_in_use(), 0u);
  d.free_address(va, 8 * MiB);
  EXPECT_EQ(d.live_reservations(), 0u);
  EXPECT_EQ(d.live_physical(), 0u);
  EXPECT_EQ(d.live_mappings(), 0u);
  EXPECT_EQ(d.peak_bytes_in_use(), 6 * MiB);

  const call_counters c = d.counters();
  EXPECT_EQ(c.address_reserve, 1u);
  EXPECT_EQ(c.mem_create, 2u);
  EXPECT_EQ(c.mem_map, 2u);
  EXPECT_EQ(c.set_access, 1u);
  EXPECT_EQ(c.mem_unmap, 1u);
  EXPECT_EQ(c.mem_release, 2u);
  EXPECT_EQ(c.address_free, 1u);
  EXPECT_EQ(c.mem_get_info, 1u);
  EXPECT_EQ(c.total(), 11u);
}

TEST(SimulatedVmm, SegmentsAndPhysicalMemoryShareTheCapacity) {
  simulated_device d(10 * MiB);
  void* p = d.allocate(6 * MiB);
  ASSERT_NE(p, nullptr);
  const auto h = d.create_physical(4 * MiB);
  EXPECT_NE(h, simulated_device::invalid_physical_handle);
  EXPECT_EQ(d.create_physical(2 * MiB), simulated_device::invalid_physical_handle);
  EXPECT_EQ(d.allocate(1), nullptr);
  EXPECT_EQ(d.out_of_memory_failures(), 2u);
  EXPECT_EQ(d.counters().mem_create, 2u);
  d.release_physical(h);
  void* q = d.allocate(1);
  EXPECT_NE(q, nullptr);
  d.deallocate(q, 1);
  d.deallocate(p, 6 * MiB);
}

TEST(SimulatedVmm, SizesAndAddressesMustBeGranular) {
  simulated_device d(GiB);
  const std::uintptr_t va = d.reserve_address(4 * MiB);
  const auto h = d.create_physical(4 * MiB);
  const device_state before = state_of(d);
  const int invalid = simulated_device::error_invalid_value;
  std::string m = expect_cuda_error([&] { d.reserve_address(3 * MiB); }, invalid);
  EXPECT_NE(m.find("multiple of the granularity"), std::string::npos) << m;
  expect_cuda_error([&] { d.reserve_address(0); }, invalid);
  expect_cuda_error([&] { d.reserve_address(4 * MiB, 3 * MiB); }, invalid);
  expect_cuda_error([&] { d.create_physical(MiB); }, invalid);
  expect_cuda_error([&] { d.create_physical(0); }, invalid);
  expect_cuda_error([&] { d.map(va + MiB, 2 * MiB, 0, h); }, invalid);
  expect_cuda_error([&] { d.map(va, MiB, 0, h); }, invalid);
  expect_cuda_error([&] { d.map(va, 2 * MiB, MiB, h); }, invalid);
  EXPECT_EQ(state_of(d), before);
  d.release_physical(h);
  d.free_address(va, 4 * MiB);
}

TEST(SimulatedVmm, ReservationsHonourAlignmentAndAvoidSegments) {
  simulated_device d(GiB);
  void* seg = d.allocate(4 * MiB);
  const std::uintptr_t a = d.reserve_address(2 * MiB, GiB);
  EXPECT_EQ(a % GiB, 0u);
  const std::uintptr_t b = d.reserve_address(4 * MiB, 512);
  EXPECT_EQ(b % (2 * MiB), 0u);
  EXPECT_TRUE(b + 4 * MiB <= addr(seg) || addr(seg) + 4 * MiB <= b);
  EXPECT_TRUE(d.is_device_pointer(ptr(a)));
  // Segments and reservations are different things.
  expect_cuda_error([&] { d.deallocate(ptr(b), 4 * MiB); }, simulated_device::error_invalid_value);
  expect_cuda_error([&] { d.free_address(addr(seg), 4 * MiB); },
                    simulated_device::error_invalid_value);
  d.free_address(a, 2 * MiB);
  d.free_address(b, 4 * MiB);
  d.deallocate(seg, 4 * MiB);
}

TEST(SimulatedVmm, MapMisuseThrowsAndChangesNothing) {
  simulated_device d(GiB);
  const std::uintptr_t va = d.reserve_address(8 * MiB);
  const auto h = d.create_physical(4 * MiB);
  d.map(va + 2 * MiB, 2 * MiB, 0, h);
  const device_state before = state_of(d);
  const int invalid = simulated_device::error_invalid_value;

  std::string m = expect_cuda_error([&] { d.map(va + 2 * MiB, 2 * MiB, 2 * MiB, h); }, invalid);
  EXPECT_NE(m.find("already mapped"), std::string::npos) << m;
  expect_cuda_error([&] { d.map(va, 4 * MiB, 0, h); }, invalid);  // runs into the mapping
  m = expect_cuda_error([&] { d.map(va + 6 * MiB, 4 * MiB, 0, h); }, invalid);  // past the end
  EXPECT_NE(m.find("not inside one reservation"), std::string::npos) << m;
  expect_cuda_error([&] { d.map(va - 2 * MiB, 2 * MiB, 0, h); }, invalid);  // before it
  m = expect_cuda_error([&] { d.map(va + 4 * MiB, 2 * MiB, 4 * MiB, h); }, invalid);
  EXPECT_NE(m.find("exceeds the handle"), std::string::npos) << m;
  expect_cuda_error([&] { d.map(va + 4 * MiB, 4 * MiB, 2 * MiB, h); }, invalid);
  m = expect_cuda_error([&] { d.map(va, 2 * MiB, 0, 9999); },
                        simulated_device::error_invalid_handle);
  EXPECT_NE(m.find("unknown physical handle"), std::string::npos) << m;
  EXPECT_EQ(state_of(d), before);

  // A mapping that starts inside an existing one (the overlap comes from below).
  const auto h4 = d.create_physical(4 * MiB);
  d.map(va + 4 * MiB, 4 * MiB, 0, h4);
  const device_state mid = state_of(d);
  expect_cuda_error([&] { d.map(va + 6 * MiB, 2 * MiB, 0, h); }, invalid);
  // A released handle cannot be mapped again, even while still mapped elsewhere.
  EXPECT_EQ(state_of(d), mid);
  d.release_physical(h);
  m = expect_cuda_error([&] { d.map(va, 2 * MiB, 2 * MiB, h); },
                        simulated_device::error_invalid_handle);
  EXPECT_NE(m.find("already released"), std::string::npos) << m;

  d.unmap(va + 2 * MiB, 6 * MiB);
  d.release_physical(h4);
  d.free_address(va, 8 * MiB);
  EXPECT_EQ(d.bytes_in_use(), 0u);
}

TEST(SimulatedVmm, UnmapAndSetAccessNeedWholeMappings) {
  simulated_device d(GiB);
  const std::uintptr_t va = d.reserve_address(8 * MiB);
  const auto h = d.create_physical(4 * MiB);
  d.map(va, 4 * MiB, 0, h);  // one 4 MiB mapping
  const device_state before = state_of(d);
  const int invalid = simulated_device::error_invalid_value;
  std::string m = expect_cuda_error([&] { d.unmap(va, 2 * MiB); }, invalid);
  EXPECT_NE(m.find("would split"), std::string::npos) << m;
  m = expect_cuda_error([&] { d.unmap(va + 2 * MiB, 2 * MiB); }, invalid);
  EXPECT_NE(m.find("would split"), std::string::npos) << m;
  m = expect_cuda_error([&] { d.unmap(va + 4 * MiB, 2 * MiB); }, invalid);
  EXPECT_NE(m.find("is not mapped"), std::string::npos) << m;
  expect_cuda_error([&] { d.unmap(va, 6 * MiB); }, invalid);  // beyond the mapping
  expect_cuda_error([&] { d.unmap(va, 0); }, invalid);
  expect_cuda_error([&] { d.unmap(va, SIZE_MAX); }, invalid);
  expect_cuda_error([&] { d.set_access(va, 2 * MiB); }, invalid);
  expect_cuda_error([&] { d.set_access(va + 4 * MiB, 2 * MiB); }, invalid);
  EXPECT_EQ(state_of(d), before);
  EXPECT_FALSE(d.is_accessible(va));
  d.unmap(va, 4 * MiB);
  m = expect_cuda_error([&] { d.unmap(va, 4 * MiB); }, invalid);  // unmapped twice
  EXPECT_NE(m.find("is not mapped"), std::string::npos) << m;
  d.release_physical(h);
  d.free_address(va, 8 * MiB);
}

// CUDA: "The generic memory handle can be freed when there are still outstanding mappings made
// with this handle"; the memory goes when the last mapping is unmapped.
TEST(SimulatedVmm, ReleaseWhileMappedFreesAtTheLastUnmap) {
  simulated_device d(GiB);
  const std::uintptr_t va = d.reserve_address(4 * MiB);
  const auto h = d.create_physical(4 * MiB);
  d.map(va + 2 * MiB, 2 * MiB, 0, h);  // the same handle twice, out of order
  d.map(va, 2 * MiB, 2 * MiB, h);
  d.release_physical(h);
  EXPECT_EQ(d.bytes_in_use(), 4 * MiB);
  EXPECT_EQ(d.live_physical(), 1u);
  const device_state before = state_of(d);
  expect_cuda_error([&] { d.release_physical(h); }, simulated_device::error_invalid_handle);
  EXPECT_EQ(state_of(d), before);
  d.unmap(va, 2 * MiB);
  EXPECT_EQ(d.bytes_in_use(), 4 * MiB);
  d.unmap(va + 2 * MiB, 2 * MiB);
  EXPECT_EQ(d.bytes_in_use(), 0u);
  EXPECT_EQ(d.live_physical(), 0u);
  expect_cuda_error([&] { d.release_physical(h); }, simulated_device::error_invalid_handle);
  d.free_address(va, 4 * MiB);
}

TEST(SimulatedVmm, FreeAddressMisuse) {
  simulated_device d(GiB);
  const std::uintptr_t va = d.reserve_address(4 * MiB);
  const auto h = d.create_physical(2 * MiB);
  d.map(va + 2 * MiB, 2 * MiB, 0, h);
  const device_state before = state_of(d);
  const int invalid = simulated_device::error_invalid_value;
  std::string m = expect_cuda_error([&] { d.free_address(va, 2 * MiB); }, invalid);
  EXPECT_NE(m.find("has 4194304 bytes"), std::string::npos) << m;
  m = expect_cuda_error([&] { d.free_address(va + 2 * MiB, 2 * MiB); }, invalid);
  EXPECT_NE(m.find("no reservation"), std::string::npos) << m;
  m = expect_cuda_error([&] { d.free_address(va, 4 * MiB); }, invalid);
  EXPECT_NE(m.find("still mapped"), std::string::npos) << m;
  EXPECT_EQ(state_of(d), before);
  d.unmap(va + 2 * MiB, 2 * MiB);
  d.release_physical(h);
  d.free_address(va, 4 * MiB);
  expect_cuda_error([&] { d.free_address(va, 4 * MiB); }, invalid);
  EXPECT_EQ(d.live_reservations(), 0u);
}

TEST(SimulatedVmm, AddressSpaceExhaustion) {
  auto o = with_capacity(GiB);
  o.address_space = 64 * MiB;
  o.segment_granularity = 1;
  simulated_device d(o);
  void* p = d.allocate(64 * MiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(d.allocate(2 * MiB), nullptr);  // capacity left, addresses not
  std::string m =
      expect_cuda_error([&] { d.reserve_address(2 * MiB); }, simulated_device::error_out_of_memory);
  EXPECT_NE(m.find("exhausted"), std::string::npos) << m;
  EXPECT_EQ(d.out_of_memory_failures(), 2u);
  d.deallocate(p, 64 * MiB);
  const std::uintptr_t va = d.reserve_address(64 * MiB);
  d.free_address(va, 64 * MiB);
}

// --------------------------------------------------------------------------------------------
// Streams and events
// --------------------------------------------------------------------------------------------

TEST(SimulatedEvents, ImmediateCompletion) {
  simulated_device d(GiB);
  const auto e = d.create_event();
  EXPECT_TRUE(d.query_event(e));  // never recorded
  d.record_event(e, d.default_stream());
  EXPECT_TRUE(d.query_event(e));
  const auto s = d.create_stream();
  EXPECT_NE(s, d.default_stream());
  d.record_event(e, s);
  EXPECT_TRUE(d.query_event(e));
  d.synchronize_event(e);
  d.destroy_stream(s);
  d.destroy_event(e);
  EXPECT_EQ(d.live_events(), 0u);
  EXPECT_EQ(d.live_streams(), 0u);
}

TEST(SimulatedEvents, ManualCompletion) {
  auto o = with_capacity(GiB);
  o.completion = event_completion::manual;
  simulated_device d(o);
  const auto s1 = d.create_stream();
  const auto s2 = d.create_stream();
  const auto e1 = d.create_event();
  const auto e2 = d.create_event();
  const auto e3 = d.create_event();
  const auto e4 = d.create_event();
  EXPECT_TRUE(d.query_event(e1));
  d.record_event(e1, s1);
  d.record_event(e2, s2);
  EXPECT_FALSE(d.query_event(e1));
  EXPECT_FALSE(d.query_event(e2));
  d.complete_stream(s1);
  EXPECT_TRUE(d.query_event(e1));
  EXPECT_FALSE(d.query_event(e2));

  d.record_event(e3, s1);
  d.record_event(e4, s1);
  d.synchronize_event(e3);  // completes s1 up to e3 only
  EXPECT_TRUE(d.query_event(e3));
  EXPECT_FALSE(d.query_event(e4));
  EXPECT_FALSE(d.query_event(e2));
  d.complete_all();
  EXPECT_TRUE(d.query_event(e4));
  EXPECT_TRUE(d.query_event(e2));

  d.record_event(e1, s2);  // re-recording makes it pending again
  EXPECT_FALSE(d.query_event(e1));
  d.record_event(e2, d.default_stream());
  EXPECT_FALSE(d.query_event(e2));
  d.synchronize();
  EXPECT_TRUE(d.query_event(e1));
  EXPECT_TRUE(d.query_event(e2));
  EXPECT_DOUBLE_EQ(d.now(), 0.0);  // manual mode never moves the clock
}

TEST(SimulatedEvents, DeallocateSynchronisesTheDevice) {
  auto o = with_capacity(GiB);
  o.completion = event_completion::manual;
  simulated_device d(o);
  const auto s = d.create_stream();
  const auto e = d.create_event();
  void* p = d.allocate(MiB);
  d.record_event(e, s);
  EXPECT_FALSE(d.query_event(e));
  d.deallocate(p, MiB);
  EXPECT_TRUE(d.query_event(e));
  EXPECT_EQ(d.counters().device_synchronize, 0u);  // implied, not an explicit call
}

TEST(SimulatedEvents, TimedCompletion) {
  auto o = with_capacity(GiB);
  o.completion = event_completion::timed;
  o.event_delay_seconds = 1.0;
  simulated_device d(o);
  const auto s = d.create_stream();
  const auto e = d.create_event();
  d.record_event(e, s);  // ready at 1.0
  EXPECT_FALSE(d.query_event(e));
  d.advance_time(0.5);
  EXPECT_FALSE(d.query_event(e));
  d.advance_time(0.5);
  EXPECT_TRUE(d.query_event(e));
  EXPECT_DOUBLE_EQ(d.sync_wait_seconds(), 0.0);

  d.record_event(e, s);  // ready at 2.0
  d.synchronize_event(e);
  EXPECT_DOUBLE_EQ(d.now(), 2.0);
  EXPECT_DOUBLE_EQ(d.sync_wait_seconds(), 1.0);
  EXPECT_TRUE(d.query_event(e));

  const auto e2 = d.create_event();
  d.record_event(e, s);  // ready at 3.0
  d.advance_time(0.25);
  d.record_event(e2, d.default_stream());  // ready at 3.25
  d.synchronize();
  EXPECT_DOUBLE_EQ(d.now(), 3.25);
  EXPECT_TRUE(d.query_event(e));
  EXPECT_TRUE(d.query_event(e2));

  void* p = d.allocate(MiB);
  d.record_event(e, s);  // ready at 4.25; cudaFree waits for it
  d.deallocate(p, MiB);
  EXPECT_DOUBLE_EQ(d.now(), 4.25);
  EXPECT_TRUE(d.query_event(e));
  EXPECT_THROW(d.advance_time(-1), std::invalid_argument);
}

// One clock: time charged by the cost model lets timed work progress, so polling terminates.
TEST(SimulatedEvents, CostModelTimeAdvancesTheEventClock) {
  auto o = with_capacity(GiB);
  o.completion = event_completion::timed;
  o.event_delay_seconds = 1.0;
  o.costs.event_query = 0.25;
  simulated_device d(o);
  const auto e = d.create_event();
  d.record_event(e, d.default_stream());
  int polls = 1;
  while (!d.query_event(e)) ++polls;
  EXPECT_EQ(polls, 5);  // at 0, 0.25, 0.5, 0.75 pending; at 1.0 done
  EXPECT_DOUBLE_EQ(d.simulated_seconds(), 1.25);
  EXPECT_DOUBLE_EQ(d.now(), 1.25);
  EXPECT_DOUBLE_EQ(d.sync_wait_seconds(), 0.0);
}

TEST(SimulatedEvents, StreamAndEventMisuseThrowsAndChangesNothing) {
  auto o = with_capacity(GiB);
  o.completion = event_completion::manual;
  simulated_device d(o);
  const auto s = d.create_stream();
  const auto e = d.create_event();
  const auto gone = d.create_stream();
  d.destroy_stream(gone);
  const auto dead = d.create_event();
  d.destroy_event(dead);
  const device_state before = state_of(d);
  const int handle = simulated_device::error_invalid_handle;
  std::string m = expect_cuda_error([&] { d.destroy_stream(d.default_stream()); }, handle);
  EXPECT_NE(m.find("default stream"), std::string::npos) << m;
  expect_cuda_error([&] { d.destroy_stream(gone); }, handle);
  expect_cuda_error([&] { d.destroy_stream(gpumem::simulated_stream{999}); }, handle);
  expect_cuda_error([&] { d.record_event(e, gone); }, handle);
  expect_cuda_error([&] { d.record_event(dead, s); }, handle);
  expect_cuda_error([&] { d.query_event(dead); }, handle);
  expect_cuda_error([&] { d.synchronize_event(dead); }, handle);
  expect_cuda_error([&] { d.destroy_event(dead); }, handle);
  expect_cuda_error([&] { d.complete_stream(gone); }, handle);
  EXPECT_EQ(state_of(d), before);
}

TEST(SimulatedEvents, WorkOnADestroyedStreamStillCompletes) {
  auto o = with_capacity(GiB);
  o.completion = event_completion::manual;
  simulated_device d(o);
  const auto s = d.create_stream();
  const auto e = d.create_event();
  d.record_event(e, s);
  d.destroy_stream(s);
  EXPECT_EQ(d.live_streams(), 0u);
  EXPECT_FALSE(d.query_event(e));
  d.complete_all();
  EXPECT_TRUE(d.query_event(e));
}

// --------------------------------------------------------------------------------------------
// Counters and costs
// --------------------------------------------------------------------------------------------

TEST(SimulatedCounters, CountEveryCallKind) {
  simulated_device d(GiB);
  void* p = d.allocate(MiB);
  d.deallocate(p, MiB);
  std::size_t f = 0;
  std::size_t t = 0;
  d.memory_info(f, t);
  const auto e = d.create_event();
  const auto s = d.create_stream();
  d.record_event(e, s);
  (void)d.query_event(e);
  d.synchronize_event(e);
  d.stream_wait_event(d.default_stream(), e);
  d.synchronize();
  d.destroy_event(e);
  d.destroy_stream(s);
  const std::uintptr_t va = d.reserve_address(2 * MiB);
  const auto h = d.create_physical(2 * MiB);
  d.map(va, 2 * MiB, 0, h);
  d.set_access(va, 2 * MiB);
  d.unmap(va, 2 * MiB);
  d.release_physical(h);
  d.free_address(va, 2 * MiB);
  d.complete_all();  // simulation controls are not device calls
  d.advance_time(1.0);

  const call_counters c = d.counters();
  for (call_kind k : gpumem::all_call_kinds) {
    EXPECT_EQ(c[k], 1u) << gpumem::call_kind_name(k);
  }
  (void)d.allocate(2 * GiB);  // out of memory still counts
  EXPECT_EQ(d.counters().malloc, 2u);
  d.reset_counters();
  EXPECT_EQ(d.counters().total(), 0u);
  EXPECT_EQ(d.out_of_memory_failures(), 0u);
}

TEST(SimulatedCosts, OffByDefault) {
  simulated_device d(GiB);
  EXPECT_FALSE(d.costs().enabled());
  void* p = d.allocate(100 * MiB);
  d.deallocate(p, 100 * MiB);
  d.synchronize();
  EXPECT_EQ(d.simulated_seconds(), 0.0);
  EXPECT_EQ(d.now(), 0.0);
}

TEST(SimulatedCosts, ChargesPerCallAndPerByte) {
  auto o = with_capacity(GiB);
  o.costs.malloc = 1e-3;
  o.costs.malloc_per_byte = 1e-9;
  o.costs.free = 2e-3;
  o.costs.mem_map = 1e-4;
  o.costs.mem_map_per_byte = 1e-12;
  simulated_device d(o);
  void* p = d.allocate(1000);
  EXPECT_DOUBLE_EQ(d.simulated_seconds(), 1e-3 + 1e-6);
  d.deallocate(p, 1000);
  EXPECT_DOUBLE_EQ(d.simulated_seconds(), 3e-3 + 1e-6);
  EXPECT_EQ(d.allocate(2 * GiB), nullptr);  // a failed call costs its fixed part only
  EXPECT_DOUBLE_EQ(d.simulated_seconds(), 4e-3 + 1e-6);
  const std::uintptr_t va = d.reserve_address(2 * MiB);
  const auto h = d.create_physical(2 * MiB);
  d.map(va, 2 * MiB, 0, h);
  EXPECT_DOUBLE_EQ(d.simulated_seconds(), 4e-3 + 1e-6 + 1e-4 + 2 * MiB * 1e-12);
  d.unmap(va, 2 * MiB);
  d.release_physical(h);
  d.free_address(va, 2 * MiB);
  EXPECT_DOUBLE_EQ(d.now(), d.simulated_seconds());
}

TEST(SimulatedCosts, TypicalPresetIsPlausibleAndSettable) {
  const cost_model t = cost_model::typical();
  EXPECT_TRUE(t.enabled());
  for (call_kind k : gpumem::all_call_kinds) {
    EXPECT_GT(t.seconds(k), 0.0) << gpumem::call_kind_name(k);
    EXPECT_LT(t.seconds(k), 1e-3) << gpumem::call_kind_name(k);
  }
  EXPECT_GE(t.free, t.device_synchronize);  // cudaFree includes a synchronisation
  EXPECT_GT(t.seconds(call_kind::malloc, GiB), t.seconds(call_kind::malloc, MiB));
  EXPECT_LT(t.seconds(call_kind::malloc, 80 * GiB), 1.0);

  simulated_device d(GiB);
  d.set_costs(t);
  void* p = d.allocate(GiB);
  EXPECT_DOUBLE_EQ(d.simulated_seconds(), t.seconds(call_kind::malloc, GiB));
  d.deallocate(p, GiB);
  cost_model bad;
  bad.mem_unmap = -1;
  EXPECT_THROW(d.set_costs(bad), std::invalid_argument);
  bad = cost_model{};
  bad.set_access_per_byte = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(d.set_costs(bad), std::invalid_argument);
  EXPECT_DOUBLE_EQ(d.costs().malloc, t.malloc);  // unchanged by the rejected models
}

// --------------------------------------------------------------------------------------------
// Fault injection
// --------------------------------------------------------------------------------------------

TEST(SimulatedFaults, FailTheNthFallibleCall) {
  auto o = with_capacity(GiB);
  o.faults.fail_nth_call = 3;
  simulated_device d(o);
  void* a = d.allocate(MiB);        // fallible #1
  const auto e = d.create_event();  // not fallible
  void* b = d.allocate(MiB);        // #2
  std::size_t f = 0;
  std::size_t t = 0;
  d.memory_info(f, t);                  // not fallible
  EXPECT_EQ(d.allocate(MiB), nullptr);  // #3 fails
  void* c = d.allocate(MiB);            // #4 succeeds again
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
  EXPECT_NE(c, nullptr);
  EXPECT_EQ(d.injected_faults(), 1u);
  EXPECT_EQ(d.out_of_memory_failures(), 0u);
  EXPECT_EQ(d.fallible_calls(), 4u);
  EXPECT_EQ(d.bytes_in_use(), 6 * MiB);
  EXPECT_EQ(d.counters().malloc, 4u);
  d.destroy_event(e);
  for (void* p : {a, b, c}) d.deallocate(p, MiB);
}

TEST(SimulatedFaults, EveryFallibleKindCanBeFailed) {
  simulated_device d(GiB);
  fault_injection f;
  f.fail_nth_call = 1;
  d.set_faults(f);
  EXPECT_EQ(d.create_physical(2 * MiB), simulated_device::invalid_physical_handle);
  d.set_faults(f);
  std::string m =
      expect_cuda_error([&] { d.reserve_address(2 * MiB); }, simulated_device::error_out_of_memory);
  EXPECT_NE(m.find("injected"), std::string::npos) << m;
  EXPECT_EQ(d.counters().address_reserve, 1u);  // a counted call, unlike misuse
  const std::uintptr_t va = d.reserve_address(2 * MiB);
  const auto h = d.create_physical(2 * MiB);
  f.fail_nth_call = 1;
  d.set_faults(f);
  m = expect_cuda_error([&] { d.map(va, 2 * MiB, 0, h); }, simulated_device::error_out_of_memory);
  EXPECT_NE(m.find("injected"), std::string::npos) << m;
  EXPECT_EQ(d.live_mappings(), 0u);
  d.map(va, 2 * MiB, 0, h);  // the 2nd call goes through
  EXPECT_EQ(d.injected_faults(), 3u);
  EXPECT_EQ(d.fallible_calls(), 2u);
  d.unmap(va, 2 * MiB);
  d.release_physical(h);
  d.free_address(va, 2 * MiB);
  EXPECT_EQ(d.bytes_in_use(), 0u);
}

TEST(SimulatedFaults, FailAboveASize) {
  auto o = with_capacity(GiB);
  o.faults.fail_above_bytes = 4 * MiB;
  simulated_device d(o);
  void* ok = d.allocate(4 * MiB);
  EXPECT_NE(ok, nullptr);
  EXPECT_EQ(d.allocate(4 * MiB + 1), nullptr);
  EXPECT_EQ(d.create_physical(6 * MiB), simulated_device::invalid_physical_handle);
  const auto h = d.create_physical(4 * MiB);
  EXPECT_NE(h, simulated_device::invalid_physical_handle);
  expect_cuda_error([&] { d.reserve_address(8 * MiB); }, simulated_device::error_out_of_memory);
  const std::uintptr_t va = d.reserve_address(4 * MiB);
  EXPECT_EQ(d.injected_faults(), 3u);
  EXPECT_EQ(d.bytes_in_use(), 8 * MiB);
  d.free_address(va, 4 * MiB);
  d.release_physical(h);
  d.deallocate(ok, 4 * MiB);
}

std::vector<bool> failure_pattern(std::uint64_t seed, double probability) {
  auto o = with_capacity(GiB);
  o.faults.fail_probability = probability;
  o.faults.seed = seed;
  simulated_device d(o);
  std::vector<bool> failed;
  for (int i = 0; i < 2000; ++i) {
    void* p = d.allocate(512);
    failed.push_back(p == nullptr);
    if (p != nullptr) d.deallocate(p, 512);
  }
  return failed;
}

TEST(SimulatedFaults, RandomFailuresAreReproducibleFromTheSeed) {
  const auto a = failure_pattern(11, 0.3);
  EXPECT_EQ(a, failure_pattern(11, 0.3));
  EXPECT_NE(a, failure_pattern(12, 0.3));
  const auto failures = static_cast<double>(std::count(a.begin(), a.end(), true));
  EXPECT_GT(failures / 2000.0, 0.25);
  EXPECT_LT(failures / 2000.0, 0.35);
  const auto none = failure_pattern(11, 0.0);
  EXPECT_EQ(std::count(none.begin(), none.end(), true), 0);
  const auto all = failure_pattern(11, 1.0);
  EXPECT_EQ(std::count(all.begin(), all.end(), true), 2000);
}

TEST(SimulatedFaults, SetFaultsRestartsTheCountAndValidates) {
  simulated_device d(GiB);
  fault_injection f;
  f.fail_nth_call = 2;
  d.set_faults(f);
  void* a = d.allocate(MiB);  // #1
  d.set_faults(f);            // count restarts
  void* b = d.allocate(MiB);  // #1 again
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(d.allocate(MiB), nullptr);  // #2
  EXPECT_EQ(d.faults().fail_nth_call, 2u);
  fault_injection bad;
  bad.fail_probability = 1.5;
  EXPECT_THROW(d.set_faults(bad), std::invalid_argument);
  EXPECT_EQ(d.faults().fail_nth_call, 2u);
  EXPECT_EQ(d.fallible_calls(), 2u);
  d.set_faults(fault_injection{});
  EXPECT_FALSE(d.faults().enabled());
  d.deallocate(a, MiB);
  d.deallocate(b, MiB);
}

// --------------------------------------------------------------------------------------------
// Threads, options, lifetime
// --------------------------------------------------------------------------------------------

TEST(SimulatedDevice, TwoThreadsSmoke) {
  auto o = with_capacity(64 * GiB);
  o.completion = event_completion::manual;
  simulated_device d(o);
  constexpr int iterations = 20000;
  std::vector<std::size_t> overlaps(2, 0);
  auto work = [&](int id) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(id));
    const auto s = d.create_stream();
    const auto e = d.create_event();
    std::unordered_map<std::uintptr_t, std::size_t> mine;
    for (int i = 0; i < iterations; ++i) {
      const std::size_t size = 512 * (1 + rng() % 4096);
      void* p = d.allocate(size);
      if (p == nullptr || !mine.emplace(addr(p), size).second) ++overlaps[id];
      d.record_event(e, s);
      (void)d.query_event(e);
      if (i % 64 == 0) {
        const std::uintptr_t va = d.reserve_address(4 * MiB);
        const auto h = d.create_physical(2 * MiB);
        d.map(va + 2 * MiB, 2 * MiB, 0, h);
        d.set_access(va + 2 * MiB, 2 * MiB);
        d.unmap(va + 2 * MiB, 2 * MiB);
        d.release_physical(h);
        d.free_address(va, 4 * MiB);
      }
      if (rng() % 2 == 0 && p != nullptr) {
        d.deallocate(p, size);
        mine.erase(addr(p));
      }
    }
    for (auto& [a, size] : mine) d.deallocate(ptr(a), size);
    d.destroy_event(e);
    d.destroy_stream(s);
  };
  std::thread t0(work, 0);
  std::thread t1(work, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(overlaps[0] + overlaps[1], 0u);
  EXPECT_EQ(d.bytes_in_use(), 0u);
  EXPECT_EQ(d.live_segments(), 0u);
  EXPECT_EQ(d.live_reservations(), 0u);
  const call_counters c = d.counters();
  EXPECT_EQ(c.malloc, 2u * iterations);
  EXPECT_EQ(c.free, 2u * iterations);
  EXPECT_EQ(c.event_record, 2u * iterations);
  EXPECT_EQ(c.mem_map, 2u * ((iterations + 63) / 64));
}

TEST(SimulatedDevice, OptionsAreValidated) {
  auto o = with_capacity(GiB);
  o.vmm_granularity = 3 * MiB;
  EXPECT_THROW(simulated_device{o}, std::invalid_argument);
  o.vmm_granularity = 0;
  EXPECT_THROW(simulated_device{o}, std::invalid_argument);
  o = with_capacity(GiB);
  o.event_delay_seconds = -1;
  EXPECT_THROW(simulated_device{o}, std::invalid_argument);
  o = with_capacity(GiB);
  o.costs.malloc = std::numeric_limits<double>::infinity();
  EXPECT_THROW(simulated_device{o}, std::invalid_argument);
  o = with_capacity(GiB);
  o.faults.fail_probability = 2;
  EXPECT_THROW(simulated_device{o}, std::invalid_argument);
  o = with_capacity(GiB);
  o.vmm_granularity = 64 * KiB;
  o.index = 3;
  simulated_device d(o);
  EXPECT_EQ(d.granularity(), 64 * KiB);
  EXPECT_EQ(d.index(), 3);
  EXPECT_EQ(d.config().capacity, GiB);
  const std::uintptr_t va = d.reserve_address(64 * KiB);
  d.free_address(va, 64 * KiB);
}

TEST(SimulatedDevice, DestroyingWithLiveResourcesDoesNotThrow) {
  EXPECT_NO_THROW({
    simulated_device d(GiB);
    (void)d.allocate(MiB);
    const std::uintptr_t va = d.reserve_address(2 * MiB);
    d.map(va, 2 * MiB, 0, d.create_physical(2 * MiB));
    (void)d.create_event();
    (void)d.create_stream();
    EXPECT_EQ(d.bytes_in_use(), 4 * MiB);  // what a leak check would see
  });
}

}  // namespace
