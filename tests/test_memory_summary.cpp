// Golden tests of memory_summary() / pytorch_memory_summary() and of the cell formatters.
//
// The expected texts were derived from PyTorch's algorithm (torch/cuda/memory.py, memory_summary),
// re-implemented in a few lines of Python and checked against a summary printed by a real PyTorch
// run; they are spelled out in full so that any character that moves fails a test.
#include "gpumem/report/memory_summary.hpp"

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

using gpumem::device_stats;
using gpumem::stat;
using gpumem::summary_info;

constexpr std::int64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024, TiB = GiB * 1024,
                       PiB = TiB * 1024;

// Goldens are written starting on the line after R"txt( for readability; drop that newline.
std::string golden(const char* text) {
  return std::string(text + 1);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void put(stat& s, std::int64_t current, std::int64_t peak, std::int64_t allocated,
         std::int64_t freed) {
  s.current = current;
  s.peak = peak;
  s.allocated = allocated;
  s.freed = freed;
}

constexpr std::size_t all = 0, small = 1, large = 2;  // stat_type order

// Units switch per column: B / KiB / MiB / GiB / TiB / PiB, counts " " / K / M, boundaries on both
// sides of 768 KiB and 750 000, pool rows shown in the "all" row's unit, a negative pool value
// (Python floor division), and every pool row distinct so that large/small order is visible.
device_stats units_stats() {
  device_stats s;
  s.num_ooms = 2;
  s.num_alloc_retries = 17;
  put(s.allocated_bytes[all], 768 * KiB, 768 * KiB - 1, TiB, 800 * PiB);
  put(s.allocated_bytes[large], 1000, 768 * KiB - 1, 5 * GiB, 3);
  put(s.allocated_bytes[small], 768 * KiB - 1000, 0, TiB - 5 * GiB, 800 * PiB - 3);
  put(s.active_bytes[all], 768 * MiB, 768 * MiB - 1, 768 * TiB, 768 * GiB - 1);
  put(s.active_bytes[large], 768 * MiB - 1, 768 * MiB - 1, 768 * TiB, 768 * GiB - 1);
  put(s.active_bytes[small], 1, 0, 0, 0);
  put(s.requested_bytes[all], 512, 1000, 100000, 0);
  put(s.requested_bytes[large], 0, 0, 0, 0);
  put(s.requested_bytes[small], 512, 1000, 100000, 0);
  put(s.reserved_bytes[all], 20 * GiB, 80 * GiB, 2 * TiB, 2 * TiB - 20 * GiB);
  put(s.reserved_bytes[large], 20 * GiB - 2 * MiB, 80 * GiB - 2 * MiB, 2 * TiB - 4 * MiB,
      2 * TiB - 20 * GiB - 2 * MiB);
  put(s.reserved_bytes[small], 2 * MiB, 2 * MiB, 4 * MiB, 2 * MiB);
  put(s.inactive_split_bytes[all], MiB, 3 * MiB + 5, 0, 12345678);
  put(s.inactive_split_bytes[large], MiB + 1, 3 * MiB, 0, 12345678);
  put(s.inactive_split_bytes[small], -1, 5, 0, 0);
  put(s.allocation[all], 750000, 749999, 750000000, 2000000000);
  put(s.allocation[large], 5, 749999, 1000, 999);
  put(s.allocation[small], 749995, 0, 749999000, 1999999001);
  put(s.active[all], 1, 2, 3, 4);
  put(s.active[large], 1, 1, 2, 2);
  put(s.active[small], 0, 1, 1, 2);
  put(s.segment[all], 999999, 1000000, 1500000, 500001);
  put(s.segment[large], 999998, 999999, 1499999, 500000);
  put(s.segment[small], 1, 1, 1, 1);
  put(s.oversize_allocations, 1234567, 7, 987654321, -5);
  put(s.oversize_segments, 750000, 749999, 750000000, 0);
  return s;
}

summary_info units_info() {
  summary_info info;
  info.device = 3;
  info.largest_free_block = 20 * MiB;
  info.free_cached_bytes = GiB + 512 * MiB;
  info.fragmentation_bytes = 2 * GiB;
  info.peak_reserved_bytes = 80 * GiB;
  info.fragmentation_at_peak_bytes = 20 * GiB;
  info.device_alloc_calls = 120;
  info.device_free_calls = 30;
  info.device_sync_calls = 2;
  info.policy = "classic";
  info.config =
      "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,1024:4,>:8],"
      "garbage_collection_threshold:0.6,expandable_segments:False,policy:classic";
  return info;
}

void expect_boxed_77(const std::string& text) {
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  for (const auto& line : lines_of(text)) {
    EXPECT_EQ(line.size(), 77u) << "line: '" << line << "'";
    EXPECT_EQ(line.front(), '|') << line;
    EXPECT_EQ(line.back(), '|') << line;
  }
}

// ---- PyTorch's text -------------------------------------------------------------------------

TEST(PytorchMemorySummary, AllZeros) {
  const char* expected = R"txt(
|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |      0 B   |      0 B   |      0 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |
|---------------------------------------------------------------------------|
| Active memory         |      0 B   |      0 B   |      0 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |
|---------------------------------------------------------------------------|
| Requested memory      |      0 B   |      0 B   |      0 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |
|---------------------------------------------------------------------------|
| GPU reserved memory   |      0 B   |      0 B   |      0 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |
|---------------------------------------------------------------------------|
| Non-releasable memory |      0 B   |      0 B   |      0 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |
|---------------------------------------------------------------------------|
| Allocations           |       0    |       0    |       0    |       0    |
|       from large pool |       0    |       0    |       0    |       0    |
|       from small pool |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Active allocs         |       0    |       0    |       0    |       0    |
|       from large pool |       0    |       0    |       0    |       0    |
|       from small pool |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| GPU reserved segments |       0    |       0    |       0    |       0    |
|       from large pool |       0    |       0    |       0    |       0    |
|       from small pool |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Non-releasable allocs |       0    |       0    |       0    |       0    |
|       from large pool |       0    |       0    |       0    |       0    |
|       from small pool |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize allocations  |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |       0    |       0    |       0    |       0    |
|===========================================================================|
)txt";
  EXPECT_EQ(gpumem::pytorch_memory_summary(device_stats{}, 0, false), golden(expected));
  // The defaults are device 0, not abbreviated.
  EXPECT_EQ(gpumem::pytorch_memory_summary(device_stats{}), golden(expected));
}

TEST(PytorchMemorySummary, UnitsSwitchPerColumnAndPoolRowsFollowTheAllRow) {
  const char* expected = R"txt(
|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 3                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 2            |        cudaMalloc retries: 17        |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |    768 KiB | 786431 B   |   1024 GiB |    800 PiB |
|       from large pool |      0 KiB | 786431 B   |      5 GiB |      0 PiB |
|       from small pool |    767 KiB |      0 B   |   1019 GiB |    799 PiB |
|---------------------------------------------------------------------------|
| Active memory         |    768 MiB | 786431 KiB |    768 TiB | 786431 MiB |
|       from large pool |    767 MiB | 786431 KiB |    768 TiB | 786431 MiB |
|       from small pool |      0 MiB |      0 KiB |      0 TiB |      0 MiB |
|---------------------------------------------------------------------------|
| Requested memory      |    512 B   |   1000 B   | 100000 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |    512 B   |   1000 B   | 100000 B   |      0 B   |
|---------------------------------------------------------------------------|
| GPU reserved memory   |  20480 MiB |  81920 MiB |   2048 GiB |   2028 GiB |
|       from large pool |  20478 MiB |  81918 MiB |   2047 GiB |   2027 GiB |
|       from small pool |      2 MiB |      2 MiB |      0 GiB |      0 GiB |
|---------------------------------------------------------------------------|
| Non-releasable memory |   1024 KiB |   3072 KiB |      0 B   |  12056 KiB |
|       from large pool |   1024 KiB |   3072 KiB |      0 B   |  12056 KiB |
|       from small pool |     -1 KiB |      0 KiB |      0 B   |      0 KiB |
|---------------------------------------------------------------------------|
| Allocations           |     750 K  |  749999    |     750 M  |    2000 M  |
|       from large pool |       0 K  |  749999    |       0 M  |       0 M  |
|       from small pool |     749 K  |       0    |     749 M  |    1999 M  |
|---------------------------------------------------------------------------|
| Active allocs         |       1    |       2    |       3    |       4    |
|       from large pool |       1    |       1    |       2    |       2    |
|       from small pool |       0    |       1    |       1    |       2    |
|---------------------------------------------------------------------------|
| GPU reserved segments |     999 K  |    1000 K  |    1500 K  |  500001    |
|       from large pool |     999 K  |     999 K  |    1499 K  |  500000    |
|       from small pool |       0 K  |       0 K  |       0 K  |       1    |
|---------------------------------------------------------------------------|
| Non-releasable allocs |       0    |       0    |       0    |       0    |
|       from large pool |       0    |       0    |       0    |       0    |
|       from small pool |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize allocations  |    1234 K  |       7    |     987 M  |      -5    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |     750 K  |  749999    |     750 M  |       0    |
|===========================================================================|
)txt";
  EXPECT_EQ(gpumem::pytorch_memory_summary(units_stats(), 3, false), golden(expected));
}

TEST(PytorchMemorySummary, Abbreviated) {
  const char* expected = R"txt(
|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 3                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 2            |        cudaMalloc retries: 17        |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |    768 KiB | 786431 B   |   1024 GiB |    800 PiB |
|---------------------------------------------------------------------------|
| Active memory         |    768 MiB | 786431 KiB |    768 TiB | 786431 MiB |
|---------------------------------------------------------------------------|
| Requested memory      |    512 B   |   1000 B   | 100000 B   |      0 B   |
|---------------------------------------------------------------------------|
| GPU reserved memory   |  20480 MiB |  81920 MiB |   2048 GiB |   2028 GiB |
|---------------------------------------------------------------------------|
| Non-releasable memory |   1024 KiB |   3072 KiB |      0 B   |  12056 KiB |
|---------------------------------------------------------------------------|
| Allocations           |     750 K  |  749999    |     750 M  |    2000 M  |
|---------------------------------------------------------------------------|
| Active allocs         |       1    |       2    |       3    |       4    |
|---------------------------------------------------------------------------|
| GPU reserved segments |     999 K  |    1000 K  |    1500 K  |  500001    |
|---------------------------------------------------------------------------|
| Non-releasable allocs |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize allocations  |    1234 K  |       7    |     987 M  |      -5    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |     750 K  |  749999    |     750 M  |       0    |
|===========================================================================|
)txt";
  EXPECT_EQ(gpumem::pytorch_memory_summary(units_stats(), 3, true), golden(expected));
}

TEST(PytorchMemorySummary, EveryLineIs77Characters) {
  expect_boxed_77(gpumem::pytorch_memory_summary(device_stats{}));
  expect_boxed_77(gpumem::pytorch_memory_summary(units_stats(), 3, false));
  expect_boxed_77(gpumem::pytorch_memory_summary(units_stats(), 123456, true));
  EXPECT_EQ(lines_of(gpumem::pytorch_memory_summary(device_stats{})).size(), 47u);
  EXPECT_EQ(lines_of(gpumem::pytorch_memory_summary(device_stats{}, 0, true)).size(), 29u);
}

TEST(PytorchMemorySummary, HeaderNumbersAreLeftAligned) {
  device_stats s;
  s.num_ooms = 123456789012;       // fills its 12-character field exactly
  s.num_alloc_retries = 12345678;  // fills its 8-character field exactly
  const auto lines = lines_of(gpumem::pytorch_memory_summary(s, 7));
  EXPECT_EQ(lines[1],
            "|                  PyTorch CUDA memory summary, device ID 7                 |");
  EXPECT_EQ(lines[3],
            "|            CUDA OOMs: 123456789012 |        cudaMalloc retries: 12345678  |");
}

// ---- gpumem's text --------------------------------------------------------------------------

TEST(MemorySummary, AllZeros) {
  const char* expected = R"txt(
|===========================================================================|
|                   gpumem CUDA memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |      0 B   |      0 B   |      0 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |
|---------------------------------------------------------------------------|
| Active memory         |      0 B   |      0 B   |      0 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |
|---------------------------------------------------------------------------|
| Requested memory      |      0 B   |      0 B   |      0 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |
|---------------------------------------------------------------------------|
| GPU reserved memory   |      0 B   |      0 B   |      0 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |
|---------------------------------------------------------------------------|
| Non-releasable memory |      0 B   |      0 B   |      0 B   |      0 B   |
|       from large pool |      0 B   |      0 B   |      0 B   |      0 B   |
|       from small pool |      0 B   |      0 B   |      0 B   |      0 B   |
|---------------------------------------------------------------------------|
| Allocations           |       0    |       0    |       0    |       0    |
|       from large pool |       0    |       0    |       0    |       0    |
|       from small pool |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Active allocs         |       0    |       0    |       0    |       0    |
|       from large pool |       0    |       0    |       0    |       0    |
|       from small pool |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| GPU reserved segments |       0    |       0    |       0    |       0    |
|       from large pool |       0    |       0    |       0    |       0    |
|       from small pool |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Non-releasable allocs |       0    |       0    |       0    |       0    |
|       from large pool |       0    |       0    |       0    |       0    |
|       from small pool |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize allocations  |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |       0    |       0    |       0    |       0    |
|===========================================================================|
|                         gpumem allocator details                          |
|---------------------------------------------------------------------------|
| Largest free block    | 0 bytes                                           |
| Free cached memory    | 0 bytes                                           |
| Fragmentation now     | 0 bytes                                           |
| Fragmentation at peak | 0 bytes                                           |
| Device calls          | alloc 0, free 0, sync 0                           |
| Allocator policy      | (not set)                                         |
| Allocator config      | (defaults)                                        |
|===========================================================================|
)txt";
  EXPECT_EQ(gpumem::memory_summary(device_stats{}, summary_info{}), golden(expected));
}

TEST(MemorySummary, AbbreviatedWithGpumemSection) {
  const char* expected = R"txt(
|===========================================================================|
|                   gpumem CUDA memory summary, device ID 3                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 2            |        cudaMalloc retries: 17        |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |    768 KiB | 786431 B   |   1024 GiB |    800 PiB |
|---------------------------------------------------------------------------|
| Active memory         |    768 MiB | 786431 KiB |    768 TiB | 786431 MiB |
|---------------------------------------------------------------------------|
| Requested memory      |    512 B   |   1000 B   | 100000 B   |      0 B   |
|---------------------------------------------------------------------------|
| GPU reserved memory   |  20480 MiB |  81920 MiB |   2048 GiB |   2028 GiB |
|---------------------------------------------------------------------------|
| Non-releasable memory |   1024 KiB |   3072 KiB |      0 B   |  12056 KiB |
|---------------------------------------------------------------------------|
| Allocations           |     750 K  |  749999    |     750 M  |    2000 M  |
|---------------------------------------------------------------------------|
| Active allocs         |       1    |       2    |       3    |       4    |
|---------------------------------------------------------------------------|
| GPU reserved segments |     999 K  |    1000 K  |    1500 K  |  500001    |
|---------------------------------------------------------------------------|
| Non-releasable allocs |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize allocations  |    1234 K  |       7    |     987 M  |      -5    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |     750 K  |  749999    |     750 M  |       0    |
|===========================================================================|
|                         gpumem allocator details                          |
|---------------------------------------------------------------------------|
| Largest free block    | 20.00 MiB                                         |
| Free cached memory    | 1.50 GiB (7.5% of reserved)                       |
| Fragmentation now     | 2.00 GiB (10.0% of reserved)                      |
| Fragmentation at peak | 20.00 GiB (25.0% of peak reserved 80.00 GiB)      |
| Device calls          | alloc 120, free 30, sync 2                        |
| Allocator policy      | classic                                           |
| Allocator config      | max_split_size_mb:128,                            |
|                       | roundup_power2_divisions:[256:1,512:2,1024:4,     |
|                       | >:8],garbage_collection_threshold:0.6,            |
|                       | expandable_segments:False,policy:classic          |
|===========================================================================|
)txt";
  EXPECT_EQ(gpumem::memory_summary(units_stats(), units_info(), true), golden(expected));
}

TEST(MemorySummary, TableIsPytorchsWithOnlyTheTitleChanged) {
  const auto ours = lines_of(gpumem::memory_summary(units_stats(), units_info(), false));
  const auto theirs = lines_of(gpumem::pytorch_memory_summary(units_stats(), 3, false));
  ASSERT_GT(ours.size(), theirs.size());
  for (std::size_t i = 0; i < theirs.size(); ++i) {
    if (i == 1) continue;
    EXPECT_EQ(ours[i], theirs[i]) << "line " << i;
  }
  EXPECT_EQ(ours[1],
            "|                   gpumem CUDA memory summary, device ID 3                 |");
  EXPECT_NE(ours[1], theirs[1]);
  // "device ID" and the device number sit in PyTorch's columns.
  EXPECT_EQ(ours[1].find("device ID 3"), theirs[1].find("device ID 3"));
  // After the table comes the same gpumem section as in the abbreviated golden.
  const auto abbreviated = lines_of(gpumem::memory_summary(units_stats(), units_info(), true));
  const std::size_t section = abbreviated.size() - 13;
  ASSERT_EQ(ours.size() - theirs.size(), 13u);
  for (std::size_t i = 0; i < 13; ++i) {
    EXPECT_EQ(ours[theirs.size() + i], abbreviated[section + i]) << "section line " << i;
  }
}

TEST(MemorySummary, EveryLineIs77CharactersEvenWithLongValues) {
  expect_boxed_77(gpumem::memory_summary(device_stats{}, summary_info{}));
  expect_boxed_77(gpumem::memory_summary(units_stats(), units_info(), false));
  summary_info info = units_info();
  info.config = std::string(120, 'x');  // no break point: cut at 49 characters
  info.policy = "stitch";
  info.largest_free_block = std::numeric_limits<std::size_t>::max();
  info.fragmentation_bytes = std::numeric_limits<std::size_t>::max();
  info.device = std::numeric_limits<int>::min();
  const std::string text = gpumem::memory_summary(units_stats(), info, true);
  expect_boxed_77(text);
  const auto lines = lines_of(text);
  const std::size_t n = lines.size();
  EXPECT_EQ(lines[n - 4], "| Allocator config      | " + std::string(49, 'x') + " |");
  EXPECT_EQ(lines[n - 3], "|                       | " + std::string(49, 'x') + " |");
  EXPECT_EQ(lines[n - 2],
            "|                       | " + std::string(22, 'x') + std::string(27, ' ') + " |");
  EXPECT_EQ(lines[n - 5], "| Allocator policy      | stitch" + std::string(43, ' ') + " |");
}

TEST(MemorySummary, SharesOfReserved) {
  device_stats s;
  s.reserved_bytes[all].current = 4 * GiB;
  summary_info info;
  info.free_cached_bytes = GiB;
  info.fragmentation_bytes = 3 * GiB / 2;
  info.peak_reserved_bytes = static_cast<std::size_t>(6 * GiB);
  info.fragmentation_at_peak_bytes = static_cast<std::size_t>(2 * GiB);
  const std::string text = gpumem::memory_summary(s, info);
  // c10's size printer writes exactly 1 GiB as MiB.
  EXPECT_NE(text.find("| Free cached memory    | 1024.00 MiB (25.0% of reserved)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("| Fragmentation now     | 1.50 GiB (37.5% of reserved)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("| Fragmentation at peak | 2.00 GiB (33.3% of peak reserved 6.00 GiB)"),
            std::string::npos)
      << text;
}

// ---- cell formatters ------------------------------------------------------------------------

TEST(TableFormat, SizeUnits) {
  using gpumem::detail::pytorch_table_size;
  EXPECT_EQ(pytorch_table_size(0, 0), "     0 B  ");
  EXPECT_EQ(pytorch_table_size(786431, 786431), "786431 B  ");
  EXPECT_EQ(pytorch_table_size(786432, 786432), "   768 KiB");
  EXPECT_EQ(pytorch_table_size(1048576000000, 1048576000000), "   976 GiB");
  EXPECT_EQ(pytorch_table_size(768 * PiB, 768 * PiB), "   768 PiB");
  // PiB is the last unit, however large the value.
  EXPECT_EQ(pytorch_table_size(std::numeric_limits<std::int64_t>::max(),
                               std::numeric_limits<std::int64_t>::max()),
            "  8191 PiB");
  // The unit comes from `preferred`, not from the value.
  EXPECT_EQ(pytorch_table_size(5, -std::numeric_limits<std::int64_t>::max()), "     5 B  ");
  EXPECT_EQ(pytorch_table_size(5, MiB), "     0 KiB");
}

TEST(TableFormat, SizeFollowsPythonArithmetic) {
  using gpumem::detail::pytorch_table_size;
  // Floor division, as Python's //.
  EXPECT_EQ(pytorch_table_size(-1, MiB), "    -1 KiB");
  EXPECT_EQ(pytorch_table_size(-1025, MiB), "    -2 KiB");
  EXPECT_EQ(pytorch_table_size(std::numeric_limits<std::int64_t>::min(),
                               std::numeric_limits<std::int64_t>::max()),
            " -8192 PiB");
  // After the first step Python compares a float: 3 * 2^58 - 1 rounds up to 3 * 2^58 and so
  // reaches PiB, where exact integers would stay at 786431 TiB.
  EXPECT_EQ(pytorch_table_size(3 * (std::int64_t{1} << 58) - 1, 3 * (std::int64_t{1} << 58) - 1),
            "   767 PiB");
}

TEST(TableFormat, CountUnits) {
  using gpumem::detail::pytorch_table_count;
  EXPECT_EQ(pytorch_table_count(749999, 749999), " 749999   ");
  EXPECT_EQ(pytorch_table_count(750000, 750000), "    750 K ");
  EXPECT_EQ(pytorch_table_count(749999999, 749999999), " 749999 K ");
  EXPECT_EQ(pytorch_table_count(750000000, 750000000), "    750 M ");
  EXPECT_EQ(pytorch_table_count(-1, 1000000), "     -1 K ");
  EXPECT_EQ(pytorch_table_count(-1001, 1000000), "     -2 K ");
  EXPECT_EQ(pytorch_table_count(5, -3), "      5   ");
  // M is the last unit; the field then grows, as in PyTorch.
  EXPECT_EQ(pytorch_table_count(std::numeric_limits<std::int64_t>::max(),
                                std::numeric_limits<std::int64_t>::max()),
            "9223372036854 M ");
}

TEST(TableFormat, FloorDiv) {
  using gpumem::detail::floor_div;
  EXPECT_EQ(floor_div(7, 2), 3);
  EXPECT_EQ(floor_div(-7, 2), -4);
  EXPECT_EQ(floor_div(-8, 2), -4);
  EXPECT_EQ(floor_div(0, 5), 0);
  EXPECT_EQ(floor_div(-1, 1024), -1);
  static_assert(floor_div(-7, 2) == -4, "usable in constant expressions");
}

TEST(ProseFormat, SizeLikeC10) {
  using gpumem::detail::format_size;
  EXPECT_EQ(format_size(0), "0 bytes");
  EXPECT_EQ(format_size(1024), "1024 bytes");
  EXPECT_EQ(format_size(1025), "1.00 KiB");
  EXPECT_EQ(format_size(1024 * 1024), "1024.00 KiB");
  EXPECT_EQ(format_size(1024 * 1024 + 1), "1.00 MiB");
  EXPECT_EQ(format_size(62 * 1024 * 1024), "62.00 MiB");
  EXPECT_EQ(format_size(std::uint64_t{1} << 30), "1024.00 MiB");
  EXPECT_EQ(format_size((std::uint64_t{3} << 30) / 2), "1.50 GiB");
  EXPECT_EQ(format_size(std::uint64_t{15} << 40), "15360.00 GiB");
}

TEST(ProseFormat, WrapText) {
  using gpumem::detail::wrap_text;
  using v = std::vector<std::string>;
  EXPECT_EQ(wrap_text("", 10), v{""});
  EXPECT_EQ(wrap_text("short", 10), v{"short"});
  EXPECT_EQ(wrap_text("exactly10!", 10), v{"exactly10!"});
  EXPECT_EQ(wrap_text("a:1,b:2,c:3", 8), (v{"a:1,b:2,", "c:3"}));
  EXPECT_EQ(wrap_text("hello big world", 10), (v{"hello big", "world"}));
  EXPECT_EQ(wrap_text("abcdefghijklmnopqrstuvwxy", 10), (v{"abcdefghij", "klmnopqrst", "uvwxy"}));
}

}  // namespace
