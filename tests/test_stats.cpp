// Tests of gpumem::stat semantics (stats.hpp) and of the PyTorch-named views of device_stats
// (stats_io.hpp): flat keys and order, lookup by key, flat and nested JSON.
//
// The expected key lists and JSON texts were produced by re-running PyTorch's flattening
// (torch/cuda/memory.py memory_stats: join the nested names of torch/csrc/cuda/Module.cpp
// memoryStats with '.', then sort) and Python's json.dumps on the same numbers.
#include "gpumem/stats_io.hpp"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gpumem/core/detail/pool_counters.hpp"
#include "gpumem/stats.hpp"

namespace {

using gpumem::device_stats;
using gpumem::stat;
using gpumem::stat_type;

// ---- stat -----------------------------------------------------------------------------------

TEST(Stat, IncreaseRaisesCurrentPeakAndAllocated) {
  stat s;
  s.increase(5);
  s.increase(7);
  EXPECT_EQ(s.current, 12);
  EXPECT_EQ(s.peak, 12);
  EXPECT_EQ(s.allocated, 12);
  EXPECT_EQ(s.freed, 0);
}

TEST(Stat, DecreaseLowersCurrentAndAddsToFreedButKeepsPeak) {
  stat s;
  s.increase(10);
  s.decrease(4);
  EXPECT_EQ(s.current, 6);
  EXPECT_EQ(s.peak, 10);
  EXPECT_EQ(s.allocated, 10);
  EXPECT_EQ(s.freed, 4);
}

TEST(Stat, PeakIsTheMaximumCurrentSinceReset) {
  stat s;
  s.increase(10);
  s.decrease(8);
  s.increase(5);  // current 7, below the old peak
  EXPECT_EQ(s.current, 7);
  EXPECT_EQ(s.peak, 10);
  s.increase(4);  // current 11, a new peak
  EXPECT_EQ(s.peak, 11);
  EXPECT_EQ(s.allocated, 19);
  EXPECT_EQ(s.freed, 8);
}

TEST(Stat, ResetPeakSetsPeakToCurrent) {
  stat s;
  s.increase(10);
  s.decrease(7);
  s.reset_peak();
  EXPECT_EQ(s.peak, 3);
  EXPECT_EQ(s.current, 3);
  EXPECT_EQ(s.allocated, 10);  // totals are untouched
  EXPECT_EQ(s.freed, 7);
  s.increase(1);
  EXPECT_EQ(s.peak, 4);
}

TEST(Stat, ResetAccumulatedClearsOnlyTheTotals) {
  stat s;
  s.increase(10);
  s.decrease(7);
  s.reset_accumulated();
  EXPECT_EQ(s.allocated, 0);
  EXPECT_EQ(s.freed, 0);
  EXPECT_EQ(s.current, 3);
  EXPECT_EQ(s.peak, 10);
}

TEST(Stat, EqualityComparesAllFourNumbers) {
  stat a, b;
  EXPECT_EQ(a, b);
  a.increase(1);
  EXPECT_NE(a, b);
  b.increase(1);
  EXPECT_EQ(a, b);
  a.reset_accumulated();
  EXPECT_NE(a, b);
  b.reset_accumulated();
  a.decrease(1);
  b.decrease(1);
  a.reset_peak();
  EXPECT_NE(a, b);  // only the peak differs
}

TEST(DeviceStats, PoolIndexesAreAllSmallLarge) {
  static_assert(gpumem::num_stat_types == 3);
  device_stats s;
  EXPECT_EQ(&s.get(s.allocation, stat_type::all), &s.allocation[0]);
  EXPECT_EQ(&s.get(s.allocation, stat_type::small_pool), &s.allocation[1]);
  EXPECT_EQ(&s.get(s.allocation, stat_type::large_pool), &s.allocation[2]);
  s.get(s.reserved_bytes, stat_type::large_pool).increase(42);
  EXPECT_EQ(s.reserved_bytes[2].current, 42);
}

// ---- flattening -----------------------------------------------------------------------------

// Every number distinct: the per-pool arrays in PyTorch's Module.cpp order get
// (array + 1) * 1000 + pool * 10 + field (pool: all, small_pool, large_pool; field: current, peak,
// allocated, freed), the oversize stats 20000 / 21000 + field, the counters 1..7.
device_stats distinct_stats() {
  device_stats s;
  s.num_alloc_retries = 1;
  s.num_ooms = 2;
  s.max_split_size = -1;
  s.num_sync_all_streams = 4;
  s.num_device_alloc = 5;
  s.num_device_free = 6;
  s.num_oom_rejections = 7;
  gpumem::stat_array* arrays[] = {
      &s.allocation,      &s.segment,        &s.active,       &s.inactive_split,
      &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes,
      &s.requested_bytes};
  const auto fill = [](stat& st, std::int64_t base) {
    st.current = base;
    st.peak = base + 1;
    st.allocated = base + 2;
    st.freed = base + 3;
  };
  for (std::size_t a = 0; a < 9; ++a) {
    for (std::size_t p = 0; p < 3; ++p) {
      fill((*arrays[a])[p], static_cast<std::int64_t>((a + 1) * 1000 + p * 10));
    }
  }
  fill(s.oversize_allocations, 20000);
  fill(s.oversize_segments, 21000);
  return s;
}

const std::vector<std::pair<std::string, std::int64_t>>& expected_flat() {
  static const std::vector<std::pair<std::string, std::int64_t>> pairs = {
      {"active.all.allocated", 3002},
      {"active.all.current", 3000},
      {"active.all.freed", 3003},
      {"active.all.peak", 3001},
      {"active.large_pool.allocated", 3022},
      {"active.large_pool.current", 3020},
      {"active.large_pool.freed", 3023},
      {"active.large_pool.peak", 3021},
      {"active.small_pool.allocated", 3012},
      {"active.small_pool.current", 3010},
      {"active.small_pool.freed", 3013},
      {"active.small_pool.peak", 3011},
      {"active_bytes.all.allocated", 7002},
      {"active_bytes.all.current", 7000},
      {"active_bytes.all.freed", 7003},
      {"active_bytes.all.peak", 7001},
      {"active_bytes.large_pool.allocated", 7022},
      {"active_bytes.large_pool.current", 7020},
      {"active_bytes.large_pool.freed", 7023},
      {"active_bytes.large_pool.peak", 7021},
      {"active_bytes.small_pool.allocated", 7012},
      {"active_bytes.small_pool.current", 7010},
      {"active_bytes.small_pool.freed", 7013},
      {"active_bytes.small_pool.peak", 7011},
      {"allocated_bytes.all.allocated", 5002},
      {"allocated_bytes.all.current", 5000},
      {"allocated_bytes.all.freed", 5003},
      {"allocated_bytes.all.peak", 5001},
      {"allocated_bytes.large_pool.allocated", 5022},
      {"allocated_bytes.large_pool.current", 5020},
      {"allocated_bytes.large_pool.freed", 5023},
      {"allocated_bytes.large_pool.peak", 5021},
      {"allocated_bytes.small_pool.allocated", 5012},
      {"allocated_bytes.small_pool.current", 5010},
      {"allocated_bytes.small_pool.freed", 5013},
      {"allocated_bytes.small_pool.peak", 5011},
      {"allocation.all.allocated", 1002},
      {"allocation.all.current", 1000},
      {"allocation.all.freed", 1003},
      {"allocation.all.peak", 1001},
      {"allocation.large_pool.allocated", 1022},
      {"allocation.large_pool.current", 1020},
      {"allocation.large_pool.freed", 1023},
      {"allocation.large_pool.peak", 1021},
      {"allocation.small_pool.allocated", 1012},
      {"allocation.small_pool.current", 1010},
      {"allocation.small_pool.freed", 1013},
      {"allocation.small_pool.peak", 1011},
      {"inactive_split.all.allocated", 4002},
      {"inactive_split.all.current", 4000},
      {"inactive_split.all.freed", 4003},
      {"inactive_split.all.peak", 4001},
      {"inactive_split.large_pool.allocated", 4022},
      {"inactive_split.large_pool.current", 4020},
      {"inactive_split.large_pool.freed", 4023},
      {"inactive_split.large_pool.peak", 4021},
      {"inactive_split.small_pool.allocated", 4012},
      {"inactive_split.small_pool.current", 4010},
      {"inactive_split.small_pool.freed", 4013},
      {"inactive_split.small_pool.peak", 4011},
      {"inactive_split_bytes.all.allocated", 8002},
      {"inactive_split_bytes.all.current", 8000},
      {"inactive_split_bytes.all.freed", 8003},
      {"inactive_split_bytes.all.peak", 8001},
      {"inactive_split_bytes.large_pool.allocated", 8022},
      {"inactive_split_bytes.large_pool.current", 8020},
      {"inactive_split_bytes.large_pool.freed", 8023},
      {"inactive_split_bytes.large_pool.peak", 8021},
      {"inactive_split_bytes.small_pool.allocated", 8012},
      {"inactive_split_bytes.small_pool.current", 8010},
      {"inactive_split_bytes.small_pool.freed", 8013},
      {"inactive_split_bytes.small_pool.peak", 8011},
      {"max_split_size", -1},
      {"num_alloc_retries", 1},
      {"num_device_alloc", 5},
      {"num_device_free", 6},
      {"num_oom_rejections", 7},
      {"num_ooms", 2},
      {"num_sync_all_streams", 4},
      {"oversize_allocations.allocated", 20002},
      {"oversize_allocations.current", 20000},
      {"oversize_allocations.freed", 20003},
      {"oversize_allocations.peak", 20001},
      {"oversize_segments.allocated", 21002},
      {"oversize_segments.current", 21000},
      {"oversize_segments.freed", 21003},
      {"oversize_segments.peak", 21001},
      {"requested_bytes.all.allocated", 9002},
      {"requested_bytes.all.current", 9000},
      {"requested_bytes.all.freed", 9003},
      {"requested_bytes.all.peak", 9001},
      {"requested_bytes.large_pool.allocated", 9022},
      {"requested_bytes.large_pool.current", 9020},
      {"requested_bytes.large_pool.freed", 9023},
      {"requested_bytes.large_pool.peak", 9021},
      {"requested_bytes.small_pool.allocated", 9012},
      {"requested_bytes.small_pool.current", 9010},
      {"requested_bytes.small_pool.freed", 9013},
      {"requested_bytes.small_pool.peak", 9011},
      {"reserved_bytes.all.allocated", 6002},
      {"reserved_bytes.all.current", 6000},
      {"reserved_bytes.all.freed", 6003},
      {"reserved_bytes.all.peak", 6001},
      {"reserved_bytes.large_pool.allocated", 6022},
      {"reserved_bytes.large_pool.current", 6020},
      {"reserved_bytes.large_pool.freed", 6023},
      {"reserved_bytes.large_pool.peak", 6021},
      {"reserved_bytes.small_pool.allocated", 6012},
      {"reserved_bytes.small_pool.current", 6010},
      {"reserved_bytes.small_pool.freed", 6013},
      {"reserved_bytes.small_pool.peak", 6011},
      {"segment.all.allocated", 2002},
      {"segment.all.current", 2000},
      {"segment.all.freed", 2003},
      {"segment.all.peak", 2001},
      {"segment.large_pool.allocated", 2022},
      {"segment.large_pool.current", 2020},
      {"segment.large_pool.freed", 2023},
      {"segment.large_pool.peak", 2021},
      {"segment.small_pool.allocated", 2012},
      {"segment.small_pool.current", 2010},
      {"segment.small_pool.freed", 2013},
      {"segment.small_pool.peak", 2011},
  };
  return pairs;
}

TEST(Flatten, ExactlyPytorchsKeysOrderAndValues) {
  const auto flat = gpumem::flatten(distinct_stats());
  ASSERT_EQ(flat.size(), 123u);
  ASSERT_EQ(expected_flat().size(), 123u);
  for (std::size_t i = 0; i < flat.size(); ++i) {
    EXPECT_EQ(flat[i].first, expected_flat()[i].first) << "position " << i;
    EXPECT_EQ(flat[i].second, expected_flat()[i].second) << flat[i].first;
  }
}

TEST(Flatten, KeysAreSortedUniqueAndMatchStatKeys) {
  const auto keys = gpumem::stat_keys();
  ASSERT_EQ(keys.size(), 123u);
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
  EXPECT_EQ(std::adjacent_find(keys.begin(), keys.end()), keys.end());
  const auto flat = gpumem::flatten(device_stats{});
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(flat[i].first, keys[i]);
  EXPECT_EQ(keys.front(), "active.all.allocated");
  EXPECT_EQ(keys.back(), "segment.small_pool.peak");
  // The counters sort among the arrays, not where Module.cpp inserts them.
  const auto pos = [&keys](std::string_view k) {
    return std::find(keys.begin(), keys.end(), k) - keys.begin();
  };
  EXPECT_EQ(pos("max_split_size"), 72);
  EXPECT_EQ(pos("num_alloc_retries"), 73);
  EXPECT_EQ(pos("num_device_alloc"), 74);
  EXPECT_EQ(pos("num_device_free"), 75);
  EXPECT_EQ(pos("num_oom_rejections"), 76);  // '_' sorts before 's'
  EXPECT_EQ(pos("num_ooms"), 77);
  EXPECT_EQ(pos("num_sync_all_streams"), 78);
}

TEST(Flatten, UnsetMaxSplitSizeReadsMinusOneAsInPytorch) {
  device_stats s;
  // What the allocator stores when max_split_size_mb is not set: SIZE_MAX cast to int64.
  s.max_split_size = static_cast<std::int64_t>(std::numeric_limits<std::size_t>::max());
  EXPECT_EQ(gpumem::stat_value(s, "max_split_size"), -1);
  const auto flat = gpumem::flatten(s);
  const auto it = std::find_if(flat.begin(), flat.end(),
                               [](const auto& kv) { return kv.first == "max_split_size"; });
  ASSERT_NE(it, flat.end());
  EXPECT_EQ(it->second, -1);
  EXPECT_NE(gpumem::to_json(s).find("\"max_split_size\": -1,"), std::string::npos);
}

// ---- stat_value -----------------------------------------------------------------------------

TEST(StatValue, EveryKeyReadsItsField) {
  const device_stats s = distinct_stats();
  for (const auto& [key, value] : expected_flat())
    EXPECT_EQ(gpumem::stat_value(s, key), value) << key;
}

TEST(StatValue, SeesUpdates) {
  device_stats s;
  s.get(s.requested_bytes, stat_type::small_pool).increase(512);
  s.get(s.requested_bytes, stat_type::small_pool).decrease(12);
  EXPECT_EQ(gpumem::stat_value(s, "requested_bytes.small_pool.current"), 500);
  EXPECT_EQ(gpumem::stat_value(s, "requested_bytes.small_pool.peak"), 512);
  EXPECT_EQ(gpumem::stat_value(s, "requested_bytes.small_pool.freed"), 12);
  EXPECT_EQ(gpumem::stat_value(s, "requested_bytes.large_pool.current"), 0);
  s.oversize_segments.increase(3);
  EXPECT_EQ(gpumem::stat_value(s, "oversize_segments.allocated"), 3);
}

TEST(StatValue, UnknownKeysThrowOutOfRangeNamingTheKey) {
  const device_stats s;
  for (const char* key :
       {"", "allocation", "allocation.all", "allocation.all.current.x", "Allocation.all.current",
        "allocation.medium_pool.current", "oversize_segments", "num_oom_rejection",
        "active.all.allocatedx", "zzz"}) {
    try {
      (void)gpumem::stat_value(s, key);
      ADD_FAILURE() << "no exception for '" << key << "'";
    } catch (const std::out_of_range& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + key + "'"), std::string::npos)
          << e.what();
    }
  }
}

// ---- JSON -----------------------------------------------------------------------------------

// A minimal JSON reader for what to_json writes (objects, string keys without escapes, integers):
// enough to prove the text is well-formed and round-trips, independently of the writer.
struct json_value {
  bool is_object = false;
  std::int64_t number = 0;
  std::vector<std::string> keys;
  std::vector<json_value> members;
};

class json_reader {
 public:
  explicit json_reader(std::string_view text) : text_(text) {}

  json_value parse() {
    json_value v = value();
    skip_space();
    if (pos_ != text_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(what + " at offset " + std::to_string(pos_));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n')) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (pos_ >= text_.size() || text_[pos_] != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool peek(char c) {
    skip_space();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  std::string string() {
    expect('"');
    const std::size_t end = text_.find('"', pos_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(text_.substr(pos_, end - pos_));
    if (s.find('\\') != std::string::npos) fail("unexpected escape");
    pos_ = end + 1;
    return s;
  }
  json_value value() {
    json_value v;
    if (peek('{')) {
      expect('{');
      v.is_object = true;
      if (peek('}')) fail("empty object");
      do {
        v.keys.push_back(string());
        expect(':');
        v.members.push_back(value());
      } while (peek(',') && (expect(','), true));
      expect('}');
      return v;
    }
    skip_space();
    const std::size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (pos_ == start || (pos_ == start + 1 && text_[start] == '-')) fail("expected a number");
    v.number = std::stoll(std::string(text_.substr(start, pos_ - start)));
    return v;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

TEST(Json, FlatIsPythonsJsonDumpsOfMemoryStats) {
  const std::string expected =
      "{\"active.all.allocated\": 3002, \"active.all.current\": 3000, \"active.all.freed\": 3"
      "003, \"active.all.peak\": 3001, \"active.large_pool.allocated\": 3022, \"active.large"
      "_pool.current\": 3020, \"active.large_pool.freed\": 3023, \"active.large_pool.peak\":"
      " 3021, \"active.small_pool.allocated\": 3012, \"active.small_pool.current\": 3010, \""
      "active.small_pool.freed\": 3013, \"active.small_pool.peak\": 3011, \"active_bytes.al"
      "l.allocated\": 7002, \"active_bytes.all.current\": 7000, \"active_bytes.all.freed\": "
      "7003, \"active_bytes.all.peak\": 7001, \"active_bytes.large_pool.allocated\": 7022, "
      "\"active_bytes.large_pool.current\": 7020, \"active_bytes.large_pool.freed\": 7023, "
      "\"active_bytes.large_pool.peak\": 7021, \"active_bytes.small_pool.allocated\": 7012,"
      " \"active_bytes.small_pool.current\": 7010, \"active_bytes.small_pool.freed\": 7013,"
      " \"active_bytes.small_pool.peak\": 7011, \"allocated_bytes.all.allocated\": 5002, \"a"
      "llocated_bytes.all.current\": 5000, \"allocated_bytes.all.freed\": 5003, \"allocated"
      "_bytes.all.peak\": 5001, \"allocated_bytes.large_pool.allocated\": 5022, \"allocated"
      "_bytes.large_pool.current\": 5020, \"allocated_bytes.large_pool.freed\": 5023, \"all"
      "ocated_bytes.large_pool.peak\": 5021, \"allocated_bytes.small_pool.allocated\": 501"
      "2, \"allocated_bytes.small_pool.current\": 5010, \"allocated_bytes.small_pool.freed"
      "\": 5013, \"allocated_bytes.small_pool.peak\": 5011, \"allocation.all.allocated\": 10"
      "02, \"allocation.all.current\": 1000, \"allocation.all.freed\": 1003, \"allocation.al"
      "l.peak\": 1001, \"allocation.large_pool.allocated\": 1022, \"allocation.large_pool.c"
      "urrent\": 1020, \"allocation.large_pool.freed\": 1023, \"allocation.large_pool.peak\""
      ": 1021, \"allocation.small_pool.allocated\": 1012, \"allocation.small_pool.current\""
      ": 1010, \"allocation.small_pool.freed\": 1013, \"allocation.small_pool.peak\": 1011,"
      " \"inactive_split.all.allocated\": 4002, \"inactive_split.all.current\": 4000, \"inac"
      "tive_split.all.freed\": 4003, \"inactive_split.all.peak\": 4001, \"inactive_split.la"
      "rge_pool.allocated\": 4022, \"inactive_split.large_pool.current\": 4020, \"inactive_"
      "split.large_pool.freed\": 4023, \"inactive_split.large_pool.peak\": 4021, \"inactive"
      "_split.small_pool.allocated\": 4012, \"inactive_split.small_pool.current\": 4010, \""
      "inactive_split.small_pool.freed\": 4013, \"inactive_split.small_pool.peak\": 4011, "
      "\"inactive_split_bytes.all.allocated\": 8002, \"inactive_split_bytes.all.current\": "
      "8000, \"inactive_split_bytes.all.freed\": 8003, \"inactive_split_bytes.all.peak\": 8"
      "001, \"inactive_split_bytes.large_pool.allocated\": 8022, \"inactive_split_bytes.la"
      "rge_pool.current\": 8020, \"inactive_split_bytes.large_pool.freed\": 8023, \"inactiv"
      "e_split_bytes.large_pool.peak\": 8021, \"inactive_split_bytes.small_pool.allocated"
      "\": 8012, \"inactive_split_bytes.small_pool.current\": 8010, \"inactive_split_bytes."
      "small_pool.freed\": 8013, \"inactive_split_bytes.small_pool.peak\": 8011, \"max_spli"
      "t_size\": -1, \"num_alloc_retries\": 1, \"num_device_alloc\": 5, \"num_device_free\": 6"
      ", \"num_oom_rejections\": 7"
      ", \"num_ooms\": 2, \"num_sync_all_streams\": 4, \"oversize_allocations.allocated\": 20"
      "002, \"oversize_allocations.current\": 20000, \"oversize_allocations.freed\": 20003,"
      " \"oversize_allocations.peak\": 20001, \"oversize_segments.allocated\": 21002, \"over"
      "size_segments.current\": 21000, \"oversize_segments.freed\": 21003, \"oversize_segme"
      "nts.peak\": 21001, \"requested_bytes.all.allocated\": 9002, \"requested_bytes.all.cu"
      "rrent\": 9000, \"requested_bytes.all.freed\": 9003, \"requested_bytes.all.peak\": 900"
      "1, \"requested_bytes.large_pool.allocated\": 9022, \"requested_bytes.large_pool.cur"
      "rent\": 9020, \"requested_bytes.large_pool.freed\": 9023, \"requested_bytes.large_po"
      "ol.peak\": 9021, \"requested_bytes.small_pool.allocated\": 9012, \"requested_bytes.s"
      "mall_pool.current\": 9010, \"requested_bytes.small_pool.freed\": 9013, \"requested_b"
      "ytes.small_pool.peak\": 9011, \"reserved_bytes.all.allocated\": 6002, \"reserved_byt"
      "es.all.current\": 6000, \"reserved_bytes.all.freed\": 6003, \"reserved_bytes.all.pea"
      "k\": 6001, \"reserved_bytes.large_pool.allocated\": 6022, \"reserved_bytes.large_poo"
      "l.current\": 6020, \"reserved_bytes.large_pool.freed\": 6023, \"reserved_bytes.large"
      "_pool.peak\": 6021, \"reserved_bytes.small_pool.allocated\": 6012, \"reserved_bytes."
      "small_pool.current\": 6010, \"reserved_bytes.small_pool.freed\": 6013, \"reserved_by"
      "tes.small_pool.peak\": 6011, \"segment.all.allocated\": 2002, \"segment.all.current\""
      ": 2000, \"segment.all.freed\": 2003, \"segment.all.peak\": 2001, \"segment.large_pool"
      ".allocated\": 2022, \"segment.large_pool.current\": 2020, \"segment.large_pool.freed"
      "\": 2023, \"segment.large_pool.peak\": 2021, \"segment.small_pool.allocated\": 2012, "
      "\"segment.small_pool.current\": 2010, \"segment.small_pool.freed\": 2013, \"segment.s"
      "mall_pool.peak\": 2011}";
  EXPECT_EQ(gpumem::to_json(distinct_stats()), expected);
}

TEST(Json, NestedIsPythonsJsonDumpsOfTheNestedDict) {
  const std::string expected =
      "{\"num_alloc_retries\": 1, \"num_ooms\": 2, \"max_split_size\": -1, \"num_sync_all_stre"
      "ams\": 4, \"num_device_alloc\": 5, \"num_device_free\": 6, \"num_oom_rejections\": 7, "
      "\"allocation\": {\"all\": {\"cu"
      "rrent\": 1000, \"peak\": 1001, \"allocated\": 1002, \"freed\": 1003}, \"small_pool\": {\"c"
      "urrent\": 1010, \"peak\": 1011, \"allocated\": 1012, \"freed\": 1013}, \"large_pool\": {\""
      "current\": 1020, \"peak\": 1021, \"allocated\": 1022, \"freed\": 1023}}, \"segment\": {\"a"
      "ll\": {\"current\": 2000, \"peak\": 2001, \"allocated\": 2002, \"freed\": 2003}, \"small_p"
      "ool\": {\"current\": 2010, \"peak\": 2011, \"allocated\": 2012, \"freed\": 2013}, \"large_"
      "pool\": {\"current\": 2020, \"peak\": 2021, \"allocated\": 2022, \"freed\": 2023}}, \"acti"
      "ve\": {\"all\": {\"current\": 3000, \"peak\": 3001, \"allocated\": 3002, \"freed\": 3003}, "
      "\"small_pool\": {\"current\": 3010, \"peak\": 3011, \"allocated\": 3012, \"freed\": 3013},"
      " \"large_pool\": {\"current\": 3020, \"peak\": 3021, \"allocated\": 3022, \"freed\": 3023}"
      "}, \"inactive_split\": {\"all\": {\"current\": 4000, \"peak\": 4001, \"allocated\": 4002, "
      "\"freed\": 4003}, \"small_pool\": {\"current\": 4010, \"peak\": 4011, \"allocated\": 4012,"
      " \"freed\": 4013}, \"large_pool\": {\"current\": 4020, \"peak\": 4021, \"allocated\": 4022"
      ", \"freed\": 4023}}, \"allocated_bytes\": {\"all\": {\"current\": 5000, \"peak\": 5001, \"a"
      "llocated\": 5002, \"freed\": 5003}, \"small_pool\": {\"current\": 5010, \"peak\": 5011, \""
      "allocated\": 5012, \"freed\": 5013}, \"large_pool\": {\"current\": 5020, \"peak\": 5021, "
      "\"allocated\": 5022, \"freed\": 5023}}, \"reserved_bytes\": {\"all\": {\"current\": 6000, "
      "\"peak\": 6001, \"allocated\": 6002, \"freed\": 6003}, \"small_pool\": {\"current\": 6010,"
      " \"peak\": 6011, \"allocated\": 6012, \"freed\": 6013}, \"large_pool\": {\"current\": 6020"
      ", \"peak\": 6021, \"allocated\": 6022, \"freed\": 6023}}, \"active_bytes\": {\"all\": {\"cu"
      "rrent\": 7000, \"peak\": 7001, \"allocated\": 7002, \"freed\": 7003}, \"small_pool\": {\"c"
      "urrent\": 7010, \"peak\": 7011, \"allocated\": 7012, \"freed\": 7013}, \"large_pool\": {\""
      "current\": 7020, \"peak\": 7021, \"allocated\": 7022, \"freed\": 7023}}, \"inactive_spli"
      "t_bytes\": {\"all\": {\"current\": 8000, \"peak\": 8001, \"allocated\": 8002, \"freed\": 80"
      "03}, \"small_pool\": {\"current\": 8010, \"peak\": 8011, \"allocated\": 8012, \"freed\": 8"
      "013}, \"large_pool\": {\"current\": 8020, \"peak\": 8021, \"allocated\": 8022, \"freed\": "
      "8023}}, \"requested_bytes\": {\"all\": {\"current\": 9000, \"peak\": 9001, \"allocated\": "
      "9002, \"freed\": 9003}, \"small_pool\": {\"current\": 9010, \"peak\": 9011, \"allocated\":"
      " 9012, \"freed\": 9013}, \"large_pool\": {\"current\": 9020, \"peak\": 9021, \"allocated\""
      ": 9022, \"freed\": 9023}}, \"oversize_allocations\": {\"current\": 20000, \"peak\": 2000"
      "1, \"allocated\": 20002, \"freed\": 20003}, \"oversize_segments\": {\"current\": 21000, "
      "\"peak\": 21001, \"allocated\": 21002, \"freed\": 21003}}";
  EXPECT_EQ(gpumem::to_json_nested(distinct_stats()), expected);
}

TEST(Json, NestedIndentedIsPythonsJsonDumpsWithIndent) {
  const char* expected = R"json(
{
  "num_alloc_retries": 0,
  "num_ooms": 0,
  "max_split_size": 0,
  "num_sync_all_streams": 0,
  "num_device_alloc": 0,
  "num_device_free": 0,
  "num_oom_rejections": 0,
  "allocation": {
    "all": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "small_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "large_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    }
  },
  "segment": {
    "all": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "small_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "large_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    }
  },
  "active": {
    "all": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "small_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "large_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    }
  },
  "inactive_split": {
    "all": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "small_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "large_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    }
  },
  "allocated_bytes": {
    "all": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "small_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "large_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    }
  },
  "reserved_bytes": {
    "all": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "small_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "large_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    }
  },
  "active_bytes": {
    "all": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "small_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "large_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    }
  },
  "inactive_split_bytes": {
    "all": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "small_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "large_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    }
  },
  "requested_bytes": {
    "all": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "small_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    },
    "large_pool": {
      "current": 0,
      "peak": 0,
      "allocated": 0,
      "freed": 0
    }
  },
  "oversize_allocations": {
    "current": 0,
    "peak": 0,
    "allocated": 0,
    "freed": 0
  },
  "oversize_segments": {
    "current": 0,
    "peak": 0,
    "allocated": 0,
    "freed": 0
  }
})json";
  EXPECT_EQ(gpumem::to_json_nested(device_stats{}, 2), std::string(expected + 1));
}

TEST(Json, FlatIndented) {
  const std::string text = gpumem::to_json(device_stats{}, 2);
  EXPECT_EQ(text.substr(0, 29), "{\n  \"active.all.allocated\": 0");
  EXPECT_EQ(text.substr(29, 29), ",\n  \"active.all.current\": 0,\n");
  const std::string tail = "\n  \"segment.small_pool.peak\": 0\n}";
  ASSERT_GE(text.size(), tail.size());
  EXPECT_EQ(text.substr(text.size() - tail.size()), tail);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 124);
}

TEST(Json, FlatParsesBackToFlatten) {
  device_stats s = distinct_stats();
  s.allocated_bytes[0].allocated = std::numeric_limits<std::int64_t>::max();
  s.segment[2].freed = std::numeric_limits<std::int64_t>::min();
  const auto flat = gpumem::flatten(s);
  for (int indent : {-1, 0, 4}) {
    const json_value root = json_reader(gpumem::to_json(s, indent)).parse();
    ASSERT_TRUE(root.is_object);
    ASSERT_EQ(root.keys.size(), flat.size());
    for (std::size_t i = 0; i < flat.size(); ++i) {
      EXPECT_EQ(root.keys[i], flat[i].first);
      EXPECT_FALSE(root.members[i].is_object);
      EXPECT_EQ(root.members[i].number, flat[i].second) << flat[i].first;
    }
  }
}

TEST(Json, NestedHasPytorchsShapeAndNumbers) {
  const device_stats s = distinct_stats();
  const json_value root = json_reader(gpumem::to_json_nested(s, 1)).parse();
  const std::vector<std::string> top = {"num_alloc_retries",
                                        "num_ooms",
                                        "max_split_size",
                                        "num_sync_all_streams",
                                        "num_device_alloc",
                                        "num_device_free",
                                        "num_oom_rejections",
                                        "allocation",
                                        "segment",
                                        "active",
                                        "inactive_split",
                                        "allocated_bytes",
                                        "reserved_bytes",
                                        "active_bytes",
                                        "inactive_split_bytes",
                                        "requested_bytes",
                                        "oversize_allocations",
                                        "oversize_segments"};
  ASSERT_EQ(root.keys, top);
  const std::vector<std::string> pools = {"all", "small_pool", "large_pool"};
  const std::vector<std::string> fields = {"current", "peak", "allocated", "freed"};
  for (std::size_t k = 0; k < top.size(); ++k) {
    const json_value& node = root.members[k];
    if (k < 7) {
      ASSERT_FALSE(node.is_object) << top[k];
      EXPECT_EQ(node.number, gpumem::stat_value(s, top[k]));
    } else if (k < 16) {
      ASSERT_EQ(node.keys, pools) << top[k];
      for (std::size_t p = 0; p < 3; ++p) {
        ASSERT_EQ(node.members[p].keys, fields);
        for (std::size_t f = 0; f < 4; ++f) {
          EXPECT_EQ(node.members[p].members[f].number,
                    gpumem::stat_value(s, top[k] + "." + pools[p] + "." + fields[f]));
        }
      }
    } else {
      ASSERT_EQ(node.keys, fields) << top[k];
      for (std::size_t f = 0; f < 4; ++f) {
        EXPECT_EQ(node.members[f].number, gpumem::stat_value(s, top[k] + "." + fields[f]));
      }
    }
  }
}

TEST(Json, ReaderRejectsMalformedText) {
  // The reader above must be able to fail, or the round-trip tests prove nothing.
  EXPECT_THROW(json_reader("{\"a\": 1").parse(), std::runtime_error);
  EXPECT_THROW(json_reader("{\"a\" 1}").parse(), std::runtime_error);
  EXPECT_THROW(json_reader("{\"a\": 1,}").parse(), std::runtime_error);
  EXPECT_THROW(json_reader("{\"a\": -}").parse(), std::runtime_error);
  EXPECT_THROW(json_reader("{\"a\": 1} x").parse(), std::runtime_error);
  EXPECT_NO_THROW(json_reader("{\"a\": {\"b\": -2}, \"c\": 3}").parse());
}

// ---- pool_counters::check (the invariant checker's recount) ---------------------------------

TEST(PoolCounters, CheckComparesEveryEntryWithTheRecount) {
  using gpumem::detail::counter;
  gpumem::detail::pool_counters counts;
  counts.increase(true, counter::allocation, 2);
  counts.increase(false, counter::reserved_bytes, 4096);
  gpumem::detail::pool_counters::recount expected{};
  expected[static_cast<std::size_t>(counter::allocation)] = {2, 2, 0};
  expected[static_cast<std::size_t>(counter::reserved_bytes)] = {4096, 0, 4096};
  EXPECT_NO_THROW(counts.check(expected));
  expected[static_cast<std::size_t>(counter::reserved_bytes)][2] = 4095;  // the large pool's
  try {
    counts.check(expected);
    FAIL() << "a wrong large-pool entry passed";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("stat reserved_bytes[2] is 4096"), std::string::npos)
        << e.what();
  }
}

}  // namespace
