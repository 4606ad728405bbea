// Tests for gpumem::allocator_config. Expected PyTorch behaviour was checked against the real
// PyTorch 2.11.0 parser (libc10.so / libc10_cuda.so of the 2.11.0 wheel); where gpumem is
// deliberately stricter, the test says so.
// size_units.hpp first: its namespace-scope kib/mib/gib must not be shadowed by config.hpp
// (-Wshadow -Werror).
#include "gpumem/detail/size_units.hpp"
// clang-format off
#include "gpumem/config.hpp"
// clang-format on

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using gpumem::allocator_config;
using gpumem::allocator_policy;
using gpumem::config_error;

constexpr std::size_t kMiB = std::size_t{1} << 20;
using table = std::array<std::size_t, 16>;

// Runs parse() and returns the config_error it must throw.
config_error parse_error(const std::string& text) {
  try {
    allocator_config::parse(text);
  } catch (const config_error& e) {
    return e;
  }
  ADD_FAILURE() << "no config_error for '" << text << "'";
  return config_error("none", "", "", 0);
}

void expect_error(const std::string& text, const std::string& key, const std::string& value,
                  std::size_t position, const std::string& message) {
  const config_error e = parse_error(text);
  EXPECT_EQ(e.key(), key) << text;
  EXPECT_EQ(e.value(), value) << text;
  EXPECT_EQ(e.position(), position) << text;
  EXPECT_EQ(std::string(e.what()), message) << text;
}

// Saves and restores the variables from_environment reads, so tests cannot leak into each other.
class config_environment : public ::testing::Test {
 protected:
  static constexpr std::array<const char*, 3> names_{
      "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "GPUMEM_ALLOC_CONF"};
  void SetUp() override {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const char* value = std::getenv(names_[i]);
      saved_[i] = value ? std::optional<std::string>(value) : std::nullopt;
      ::unsetenv(names_[i]);
    }
  }
  void TearDown() override {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      if (saved_[i]) {
        ::setenv(names_[i], saved_[i]->c_str(), 1);
      } else {
        ::unsetenv(names_[i]);
      }
    }
  }
  std::array<std::optional<std::string>, 3> saved_;
};

// ---- defaults ------------------------------------------------------------------------------

TEST(config_defaults, equal_pytorch_2_11) {
  const allocator_config c;
  EXPECT_EQ(c.max_split_size, std::numeric_limits<std::size_t>::max());
  EXPECT_EQ(c.max_non_split_rounding, 20 * kMiB);
  EXPECT_EQ(c.large_segment_size, 20 * kMiB);
  EXPECT_EQ(c.roundup_power2_divisions, table{});
  EXPECT_EQ(c.garbage_collection_threshold, 0.0);
  EXPECT_FALSE(c.per_process_memory_fraction.has_value());
  EXPECT_FALSE(c.has_memory_cap());
  EXPECT_FALSE(c.expandable_segments);
  EXPECT_FALSE(c.release_lock_on_cudamalloc);
  EXPECT_FALSE(c.graph_capture_record_stream_reuse);
  EXPECT_FALSE(c.pinned_use_cuda_host_register);
  EXPECT_EQ(c.pinned_num_register_threads, 1u);
  EXPECT_FALSE(c.pinned_use_background_threads);
  EXPECT_EQ(c.pinned_reserve_segment_size, 0u);
  EXPECT_EQ(c.backend, "native");
  EXPECT_EQ(c.policy, allocator_policy::automatic);
}

TEST(config_defaults, empty_and_blank_strings_give_defaults) {
  EXPECT_EQ(allocator_config::parse(""), allocator_config{});
  EXPECT_EQ(allocator_config::parse(" \t\n "), allocator_config{});
}

// ---- each key ------------------------------------------------------------------------------

TEST(config_keys, max_split_size_mb_is_stored_in_bytes) {
  EXPECT_EQ(allocator_config::parse("max_split_size_mb:21").max_split_size, 21 * kMiB);
  EXPECT_EQ(allocator_config::parse("max_split_size_mb:512").max_split_size, 512 * kMiB);
}

TEST(config_keys, max_split_size_mb_of_20_is_accepted_as_in_pytorch_2_11) {
  // Older PyTorch releases required > 20; 2.11 requires >= large_segment_size_mb (20 by default).
  EXPECT_EQ(allocator_config::parse("max_split_size_mb:20").max_split_size, 20 * kMiB);
}

TEST(config_keys, huge_mib_counts_clamp_like_pytorch) {
  const std::size_t max_mib = std::numeric_limits<std::size_t>::max() / kMiB;
  EXPECT_EQ(allocator_config::parse("max_split_size_mb:18446744073709551615").max_split_size,
            max_mib * kMiB);
}

TEST(config_keys, max_non_split_rounding_mb) {
  EXPECT_EQ(allocator_config::parse("max_non_split_rounding_mb:64").max_non_split_rounding,
            64 * kMiB);
  EXPECT_EQ(allocator_config::parse("max_non_split_rounding_mb:20").max_non_split_rounding,
            20 * kMiB);
}

TEST(config_keys, large_segment_size_mb_moves_the_rounding_and_the_minimums) {
  const auto c = allocator_config::parse("large_segment_size_mb:64");
  EXPECT_EQ(c.large_segment_size, 64 * kMiB);
  EXPECT_EQ(c.max_non_split_rounding, 64 * kMiB);  // follows the segment size, as in PyTorch
  EXPECT_EQ(allocator_config::parse("large_segment_size_mb:11").large_segment_size, 11 * kMiB);
  // Read first wherever it appears, as PyTorch does.
  const auto d = allocator_config::parse("max_split_size_mb:64,large_segment_size_mb:64");
  EXPECT_EQ(d.max_split_size, 64 * kMiB);
  const auto e = allocator_config::parse("max_non_split_rounding_mb:100,large_segment_size_mb:32");
  EXPECT_EQ(e.max_non_split_rounding, 100 * kMiB);
}

TEST(config_keys, garbage_collection_threshold) {
  EXPECT_EQ(
      allocator_config::parse("garbage_collection_threshold:0.5").garbage_collection_threshold,
      0.5);
}

TEST(config_keys, per_process_memory_fraction) {
  const auto c = allocator_config::parse("per_process_memory_fraction:0.25");
  ASSERT_TRUE(c.per_process_memory_fraction.has_value());
  EXPECT_EQ(*c.per_process_memory_fraction, 0.25);
  EXPECT_TRUE(c.has_memory_cap());
  const auto zero = allocator_config::parse("per_process_memory_fraction:0");
  EXPECT_EQ(zero.per_process_memory_fraction, std::optional<double>(0.0));
  EXPECT_TRUE(zero.has_memory_cap());
  // Like PyTorch's setMemoryFraction, 1.0 is stored but caps nothing.
  const auto one = allocator_config::parse("per_process_memory_fraction:1");
  EXPECT_EQ(one.per_process_memory_fraction, std::optional<double>(1.0));
  EXPECT_FALSE(one.has_memory_cap());
  EXPECT_EQ(allocator_config::parse("per_process_memory_fraction:1e-1").per_process_memory_fraction,
            std::optional<double>(0.1));
}

TEST(config_keys, booleans) {
  EXPECT_TRUE(allocator_config::parse("expandable_segments:True").expandable_segments);
  EXPECT_FALSE(allocator_config::parse("expandable_segments:True,expandable_segments:False")
                   .expandable_segments);
  EXPECT_TRUE(
      allocator_config::parse("release_lock_on_cudamalloc:True").release_lock_on_cudamalloc);
  EXPECT_TRUE(allocator_config::parse("release_lock_on_hipmalloc:True").release_lock_on_cudamalloc);
  EXPECT_TRUE(allocator_config::parse("graph_capture_record_stream_reuse:True")
                  .graph_capture_record_stream_reuse);
  EXPECT_TRUE(
      allocator_config::parse("pinned_use_cuda_host_register:True").pinned_use_cuda_host_register);
  EXPECT_TRUE(
      allocator_config::parse("pinned_use_hip_host_register:True").pinned_use_cuda_host_register);
  EXPECT_TRUE(
      allocator_config::parse("pinned_use_background_threads:True").pinned_use_background_threads);
}

TEST(config_keys, pinned_sizes_and_threads) {
  EXPECT_EQ(allocator_config::parse("pinned_num_register_threads:8").pinned_num_register_threads,
            8u);
  EXPECT_EQ(allocator_config::parse("pinned_num_register_threads:128").pinned_num_register_threads,
            128u);
  EXPECT_EQ(
      allocator_config::parse("pinned_reserve_segment_size_mb:64").pinned_reserve_segment_size,
      64 * kMiB);
}

TEST(config_keys, backend_and_policy) {
  EXPECT_EQ(allocator_config::parse("backend:native").backend, "native");
  EXPECT_EQ(allocator_config::parse("backend:cudaMallocAsync").backend, "cudaMallocAsync");
  EXPECT_EQ(allocator_config::parse("policy:auto").policy, allocator_policy::automatic);
  EXPECT_EQ(allocator_config::parse("policy:classic").policy, allocator_policy::classic);
  EXPECT_EQ(allocator_config::parse("policy:expandable").policy, allocator_policy::expandable);
  EXPECT_EQ(allocator_config::parse("policy:stitch").policy, allocator_policy::stitch);
  EXPECT_EQ(gpumem::to_string(allocator_policy::automatic), "auto");
  EXPECT_EQ(gpumem::to_string(allocator_policy::stitch), "stitch");
}

TEST(config_keys, last_occurrence_wins) {
  EXPECT_EQ(allocator_config::parse("max_split_size_mb:100,max_split_size_mb:200").max_split_size,
            200 * kMiB);
}

TEST(config_syntax, whitespace_is_dropped_everywhere_like_pytorch) {
  // PyTorch's tokenizer drops whitespace even inside a word: "1 00" is 100.
  const auto c =
      allocator_config::parse(" expandable_segments : True ,\tmax_split_size_mb : 1 00 ");
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.max_split_size, 100 * kMiB);
}

TEST(config_syntax, one_trailing_comma_is_accepted_like_pytorch) {
  EXPECT_TRUE(allocator_config::parse("expandable_segments:True,").expandable_segments);
  EXPECT_EQ(allocator_config::parse("roundup_power2_divisions:[64:8,]").roundup_power2_divisions,
            (table{8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(config_syntax, parse_layers_on_top_of_base) {
  allocator_config base;
  base.max_split_size = 100 * kMiB;
  base.expandable_segments = true;
  base.roundup_power2_divisions.fill(4);
  const auto c = allocator_config::parse("garbage_collection_threshold:0.5", base);
  EXPECT_EQ(c.max_split_size, 100 * kMiB);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.divisions_for(64 * kMiB), 4u);
  EXPECT_EQ(c.garbage_collection_threshold, 0.5);
  // The divisions key describes the whole table: it replaces base's.
  const auto d = allocator_config::parse("roundup_power2_divisions:[64:8]", base);
  EXPECT_EQ(d.roundup_power2_divisions, (table{8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(config_syntax, the_segment_size_and_kept_values_stay_consistent) {
  allocator_config base;
  base.max_non_split_rounding = 100 * kMiB;  // set apart from the segment size: kept
  EXPECT_EQ(allocator_config::parse("large_segment_size_mb:64", base).max_non_split_rounding,
            100 * kMiB);
  // A base segment size raises the minimum for later strings, as across PyTorch's calls.
  const auto big = allocator_config::parse("large_segment_size_mb:64");
  EXPECT_THROW(allocator_config::parse("max_split_size_mb:40", big), config_error);
}

// ---- roundup_power2_divisions --------------------------------------------------------------

TEST(config_divisions, single_power_of_two_fills_every_interval) {
  EXPECT_EQ(allocator_config::parse("roundup_power2_divisions:4").roundup_power2_divisions,
            (table{4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(allocator_config::parse("roundup_power2_divisions:1").roundup_power2_divisions,
            (table{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
}

TEST(config_divisions, list_gives_pytorch_2_11_table) {
  // First value fills below 64 MiB; unlisted 128 MiB and 512 MiB stay 0; '>' starts after 1024.
  EXPECT_EQ(allocator_config::parse("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]")
                .roundup_power2_divisions,
            (table{8, 8, 8, 8, 8, 8, 8, 0, 4, 0, 4, 1, 1, 1, 1, 1}));
}

TEST(config_divisions, greater_than_does_not_overwrite_the_last_listed_interval) {
  // Older PyTorch releases filled from the last listed index itself; 2.11 starts after it.
  EXPECT_EQ(allocator_config::parse("roundup_power2_divisions:[64:8,>:2]").roundup_power2_divisions,
            (table{8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2}));
  // With nothing listed before it, '>' starts at index 1 and leaves index 0 alone.
  EXPECT_EQ(allocator_config::parse("roundup_power2_divisions:[>:2]").roundup_power2_divisions,
            (table{0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}));
  // A later item overwrites what '>' filled.
  EXPECT_EQ(
      allocator_config::parse("roundup_power2_divisions:[64:8,>:2,256:4]").roundup_power2_divisions,
      (table{8, 8, 8, 8, 8, 8, 8, 2, 4, 2, 2, 2, 2, 2, 2, 2}));
}

TEST(config_divisions, first_value_fills_below_even_out_of_order) {
  EXPECT_EQ(
      allocator_config::parse("roundup_power2_divisions:[256:4,64:8]").roundup_power2_divisions,
      (table{4, 4, 4, 4, 4, 4, 8, 4, 4, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(config_divisions, interval_keys_clamp_to_the_table) {
  EXPECT_EQ(allocator_config::parse("roundup_power2_divisions:[1:4]").roundup_power2_divisions,
            (table{4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(allocator_config::parse("roundup_power2_divisions:[131072:4]").roundup_power2_divisions,
            (table{4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}));
}

TEST(config_divisions, zero_and_empty_list_are_accepted) {
  EXPECT_EQ(allocator_config::parse("roundup_power2_divisions:[64:0]").roundup_power2_divisions,
            table{});
  EXPECT_EQ(allocator_config::parse("roundup_power2_divisions:[]").roundup_power2_divisions,
            table{});
}

TEST(config_divisions, divisions_for_at_interval_edges) {
  allocator_config c;
  for (std::size_t i = 0; i < 16; ++i) c.roundup_power2_divisions[i] = i + 100;
  EXPECT_EQ(c.divisions_for(0), 100u);
  EXPECT_EQ(c.divisions_for(1), 100u);
  EXPECT_EQ(c.divisions_for(kMiB - 1), 100u);
  EXPECT_EQ(c.divisions_for(kMiB), 100u);
  EXPECT_EQ(c.divisions_for(2 * kMiB - 1), 100u);
  EXPECT_EQ(c.divisions_for(2 * kMiB), 101u);
  EXPECT_EQ(c.divisions_for(64 * kMiB - 1), 105u);
  EXPECT_EQ(c.divisions_for(64 * kMiB), 106u);
  EXPECT_EQ(c.divisions_for((std::size_t{1} << 35) - 1), 114u);  // just under 32 GiB
  EXPECT_EQ(c.divisions_for(std::size_t{1} << 35), 115u);        // 32 GiB: the last interval
  EXPECT_EQ(c.divisions_for(std::size_t{1} << 36), 115u);        // 64 GiB and above: clamped
  EXPECT_EQ(c.divisions_for(std::numeric_limits<std::size_t>::max()), 115u);
}

// ---- environment ---------------------------------------------------------------------------

TEST_F(config_environment, nothing_set_gives_defaults) {
  EXPECT_EQ(allocator_config::from_environment(), allocator_config{});
}

TEST_F(config_environment, code_wins_over_environment) {
  ::setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:100,expandable_segments:True", 1);
  const auto c = allocator_config::resolve("max_split_size_mb:200");
  EXPECT_EQ(c.max_split_size, 200 * kMiB);
  EXPECT_TRUE(c.expandable_segments);  // kept from the environment
}

TEST_F(config_environment, pytorch_cuda_alloc_conf_wins_over_pytorch_alloc_conf_as_in_2_11_0) {
  // Checked against libc10_cuda.so 2.11.0: with both set, both halves of PyTorch's config read
  // PYTORCH_CUDA_ALLOC_CONF (the header comment claiming the opposite is not what the code does).
  ::setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:100,per_process_memory_fraction:0.5", 1);
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:200", 1);
  const auto c = allocator_config::from_environment();
  EXPECT_EQ(c.max_split_size, 200 * kMiB);
  EXPECT_FALSE(c.per_process_memory_fraction.has_value());  // not merged
}

TEST_F(config_environment, pytorch_alloc_conf_is_read_when_the_cuda_variable_is_unset) {
  ::setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:100", 1);
  EXPECT_EQ(allocator_config::from_environment().max_split_size, 100 * kMiB);
}

TEST_F(config_environment, a_set_but_empty_cuda_variable_still_counts) {
  ::setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:100", 1);
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "", 1);
  EXPECT_EQ(allocator_config::from_environment(), allocator_config{});
}

TEST_F(config_environment, gpumem_alloc_conf_applies_on_top) {
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:100,expandable_segments:True", 1);
  ::setenv("GPUMEM_ALLOC_CONF", "max_split_size_mb:300,policy:classic", 1);
  const auto c = allocator_config::from_environment();
  EXPECT_EQ(c.max_split_size, 300 * kMiB);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.policy, allocator_policy::classic);
  EXPECT_EQ(allocator_config::resolve("policy:stitch").policy, allocator_policy::stitch);
}

TEST_F(config_environment, errors_name_the_variable) {
  ::setenv("PYTORCH_ALLOC_CONF", "expandable_segments:Yes", 1);
  try {
    allocator_config::from_environment();
    FAIL() << "no config_error";
  } catch (const config_error& e) {
    EXPECT_EQ(e.key(), "expandable_segments");
    EXPECT_EQ(e.value(), "Yes");
    EXPECT_EQ(e.position(), 20u);
    EXPECT_EQ(std::string(e.what()),
              "gpumem config: invalid value 'Yes' for key 'expandable_segments' at position 20 of "
              "PYTORCH_ALLOC_CONF: expected True or False");
  }
}

TEST_F(config_environment, gpumem_keys_are_refused_in_pytorch_variables) {
  ::setenv("PYTORCH_ALLOC_CONF", "policy:stitch", 1);
  try {
    allocator_config::from_environment();
    FAIL() << "no config_error";
  } catch (const config_error& e) {
    EXPECT_EQ(e.key(), "policy");
    EXPECT_EQ(e.value(), "stitch");
    EXPECT_EQ(e.position(), 0u);
    EXPECT_NE(std::string(e.what()).find("GPUMEM_ALLOC_CONF"), std::string::npos);
  }
}

// ---- to_string -----------------------------------------------------------------------------

TEST(config_to_string, default_is_empty) {
  EXPECT_EQ(allocator_config{}.to_string(), "");
}

TEST(config_to_string, canonical_form) {
  const auto c = allocator_config::parse(
      "policy:stitch, expandable_segments:True, max_split_size_mb:256, "
      "roundup_power2_divisions:[64:8,256:4,1024:4,>:1], per_process_memory_fraction:0.5, "
      "garbage_collection_threshold:0.8, backend:cudaMallocAsync");
  EXPECT_EQ(c.to_string(),
            "backend:cudaMallocAsync,max_split_size_mb:256,"
            "roundup_power2_divisions:[64:8,256:4,1024:4,>:1],garbage_collection_threshold:0.8,"
            "per_process_memory_fraction:0.5,expandable_segments:True,policy:stitch");
}

TEST(config_to_string, round_trips_every_key) {
  const std::string text =
      "backend:cudaMallocAsync,large_segment_size_mb:32,max_split_size_mb:64,"
      "max_non_split_rounding_mb:48,roundup_power2_divisions:[>:2],"
      "garbage_collection_threshold:0.6,per_process_memory_fraction:1,expandable_segments:True,"
      "release_lock_on_hipmalloc:True,graph_capture_record_stream_reuse:True,"
      "pinned_use_hip_host_register:True,pinned_num_register_threads:16,"
      "pinned_use_background_threads:True,pinned_reserve_segment_size_mb:128,policy:expandable";
  const auto c = allocator_config::parse(text);
  EXPECT_EQ(allocator_config::parse(c.to_string()), c) << c.to_string();
  EXPECT_EQ(allocator_config::parse("large_segment_size_mb:64").to_string(),
            "large_segment_size_mb:64");
}

TEST(config_keys, stitch_thresholds) {
  const auto c = allocator_config::parse(
      "policy:stitch,stitch_headroom:0,stitch_settle_limit:0.05,stitch_recurring_limit:0.1,"
      "stitch_recurring_misses:7,stitch_settled_allocations:99");
  EXPECT_EQ(c.stitch_headroom, 0.0);
  EXPECT_EQ(c.stitch_settle_limit, 0.05);
  EXPECT_EQ(c.stitch_recurring_limit, 0.1);
  EXPECT_EQ(c.stitch_recurring_misses, 7u);
  EXPECT_EQ(c.stitch_settled_allocations, 99u);
  EXPECT_EQ(allocator_config::parse(c.to_string()), c) << c.to_string();
  EXPECT_TRUE(c.notes().empty());
  EXPECT_THROW(allocator_config::parse("stitch_headroom:1"), config_error);
  EXPECT_THROW(allocator_config::parse("stitch_settle_limit:-0.1"), config_error);
  EXPECT_THROW(allocator_config::parse("stitch_recurring_misses:0"), config_error);
  EXPECT_THROW(allocator_config::parse("stitch_settled_allocations:0"), config_error);
  // gpumem's own keys: not in PyTorch's variables.
  EXPECT_TRUE(allocator_config::parse("policy:classic,stitch_headroom:0.1").notes().size() == 1);
  allocator_config bad;
  bad.stitch_recurring_limit = 1.5;
  EXPECT_THROW(bad.validate(), config_error);
}

// oom_snapshot takes a directory; the string syntax cannot hold spaces, ':', ',', '[' or ']'.
TEST(config_keys, oom_snapshot_is_a_directory_and_its_ring_a_count) {
  const auto c =
      allocator_config::parse("oom_snapshot:/scratch/job-7/oom,oom_snapshot_max_entries:500");
  EXPECT_EQ(c.oom_snapshot, "/scratch/job-7/oom");
  EXPECT_EQ(c.oom_snapshot_max_entries, 500u);
  EXPECT_EQ(c.to_string(), "oom_snapshot:/scratch/job-7/oom,oom_snapshot_max_entries:500");
  EXPECT_EQ(allocator_config::parse(c.to_string()), c);
  EXPECT_TRUE(c.notes().empty());
  EXPECT_TRUE(allocator_config{}.oom_snapshot.empty());  // off by default
  EXPECT_THROW(allocator_config::parse("oom_snapshot:"), config_error);
  EXPECT_THROW(allocator_config::parse("oom_snapshot:[a:b]"), config_error);
  EXPECT_THROW(allocator_config::parse("oom_snapshot_max_entries:0"), config_error);
  EXPECT_THROW(allocator_config::parse("oom_snapshot_max_entries:10000001"), config_error);
  // The ring's size alone does nothing, and says so.
  EXPECT_EQ(allocator_config::parse("oom_snapshot_max_entries:5").notes().size(), 1u);
  allocator_config in_code;
  in_code.oom_snapshot = "/tmp/two words";
  EXPECT_THROW(in_code.validate(), config_error);
  in_code.oom_snapshot = "/tmp/a:b";
  EXPECT_THROW(in_code.validate(), config_error);
  in_code.oom_snapshot = "relative/dir";
  EXPECT_NO_THROW(in_code.validate());
}

// expandable_segments_handle_type: PyTorch's name for the setting, and its enumerators' names too.
TEST(config_keys, expandable_segments_handle_type_takes_gpumems_and_pytorchs_names) {
  using gpumem::vmm_handle_type;
  EXPECT_EQ(allocator_config{}.expandable_segments_handle_type, vmm_handle_type::automatic);
  const auto type = [](const char* text) {
    return allocator_config::parse(text).expandable_segments_handle_type;
  };
  EXPECT_EQ(type("expandable_segments_handle_type:auto"), vmm_handle_type::automatic);
  EXPECT_EQ(type("expandable_segments_handle_type:unspecified"), vmm_handle_type::automatic);
  EXPECT_EQ(type("expandable_segments_handle_type:posix_fd"), vmm_handle_type::posix_fd);
  EXPECT_EQ(type("expandable_segments_handle_type:fabric"), vmm_handle_type::fabric);
  EXPECT_EQ(type("expandable_segments_handle_type:fabric_handle"), vmm_handle_type::fabric);
  const auto c = allocator_config::parse("policy:stitch,expandable_segments_handle_type:fabric");
  EXPECT_EQ(c.to_string(), "policy:stitch,expandable_segments_handle_type:fabric");
  EXPECT_EQ(allocator_config::parse(c.to_string()), c);
  EXPECT_NE(c, allocator_config::parse("policy:stitch"));
  EXPECT_THROW(allocator_config::parse("expandable_segments_handle_type:ipc"), config_error);
  EXPECT_THROW(allocator_config::parse("expandable_segments_handle_type:True"), config_error);
}

TEST(config_to_string, round_trips_any_divisions_table) {
  std::mt19937 rng(12345);
  const std::array<std::size_t, 6> values{0, 1, 2, 4, 8, 16};
  for (int round = 0; round < 2000; ++round) {
    allocator_config c;
    for (auto& d : c.roundup_power2_divisions) d = values[rng() % (round % 3 == 0 ? 2 : 6)];
    EXPECT_EQ(allocator_config::parse(c.to_string()).roundup_power2_divisions,
              c.roundup_power2_divisions)
        << c.to_string();
  }
}

// ---- notes ---------------------------------------------------------------------------------

TEST(config_notes, none_when_everything_takes_effect) {
  EXPECT_TRUE(allocator_config{}.notes().empty());
  EXPECT_TRUE(allocator_config::parse("max_split_size_mb:128,roundup_power2_divisions:4,"
                                      "per_process_memory_fraction:0.5,"
                                      "garbage_collection_threshold:0.8,expandable_segments:True")
                  .notes()
                  .empty());
}

TEST(config_notes, one_line_per_key_not_honoured) {
  const auto c = allocator_config::parse(
      "backend:cudaMallocAsync,release_lock_on_cudamalloc:True,"
      "graph_capture_record_stream_reuse:True,garbage_collection_threshold:0.8,"
      "expandable_segments:True,policy:classic,pinned_use_cuda_host_register:True,"
      "pinned_num_register_threads:4,pinned_use_background_threads:True,"
      "pinned_reserve_segment_size_mb:64");
  const std::vector<std::string> notes = c.notes();
  // pinned_use_cuda_host_register and pinned_num_register_threads are honoured by the pinned pool.
  ASSERT_EQ(notes.size(), 6u);
  const std::array<const char*, 6> starts{"backend:cudaMallocAsync",
                                          "release_lock_on_cudamalloc:True",
                                          "garbage_collection_threshold:0.8",
                                          "expandable_segments:True",
                                          "pinned_use_background_threads:True",
                                          "pinned_reserve_segment_size_mb:64"};
  for (std::size_t i = 0; i < notes.size(); ++i) {
    EXPECT_EQ(notes[i].rfind(starts[i], 0), 0u) << notes[i];
  }
  EXPECT_NE(notes[2].find("per_process_memory_fraction"), std::string::npos);
  EXPECT_NE(notes[3].find("policy:classic"), std::string::npos);
}

TEST(config_notes, gc_threshold_needs_a_fraction_below_one) {
  EXPECT_EQ(
      allocator_config::parse("garbage_collection_threshold:0.8,per_process_memory_fraction:1")
          .notes()
          .size(),
      1u);
  EXPECT_TRUE(
      allocator_config::parse("garbage_collection_threshold:0.8,per_process_memory_fraction:0.9")
          .notes()
          .empty());
}

// ---- effective_policy ----------------------------------------------------------------------

TEST(config_policy, effective_policy) {
  allocator_config c;
  EXPECT_EQ(c.effective_policy(true), allocator_policy::stitch);
  EXPECT_EQ(c.effective_policy(false), allocator_policy::classic);
  c.expandable_segments = true;
  EXPECT_EQ(c.effective_policy(true), allocator_policy::expandable);
  EXPECT_EQ(c.effective_policy(false), allocator_policy::classic);
  c.policy = allocator_policy::stitch;  // an explicit policy wins over expandable_segments
  EXPECT_EQ(c.effective_policy(true), allocator_policy::stitch);
  EXPECT_EQ(c.effective_policy(false), allocator_policy::classic);
  c.policy = allocator_policy::classic;
  EXPECT_EQ(c.effective_policy(true), allocator_policy::classic);
  c.policy = allocator_policy::expandable;
  c.expandable_segments = false;
  EXPECT_EQ(c.effective_policy(true), allocator_policy::expandable);
}

TEST(config_policy, equality) {
  allocator_config a;
  allocator_config b;
  EXPECT_EQ(a, b);
  b.per_process_memory_fraction = 1.0;  // set differs from unset
  EXPECT_NE(a, b);
  b = a;
  b.roundup_power2_divisions[15] = 2;
  EXPECT_NE(a, b);
}

// ---- errors: each names key, value and position --------------------------------------------

TEST(config_errors, unknown_key) {
  const config_error e = parse_error("expandable_segments:True,max_split_size:100");
  EXPECT_EQ(e.key(), "max_split_size");
  EXPECT_EQ(e.value(), "100");
  EXPECT_EQ(e.position(), 25u);
  EXPECT_EQ(std::string(e.what()).rfind(
                "gpumem config: unknown key 'max_split_size' (value '100') at position 25: known "
                "keys are backend, large_segment_size_mb, max_split_size_mb,",
                0),
            0u)
      << e.what();
}

TEST(config_errors, bracket_never_closed) {
  expect_error("roundup_power2_divisions:[64:8,256:4", "roundup_power2_divisions", "[64:8,256:4",
               25,
               "gpumem config: syntax error in the entry for key 'roundup_power2_divisions' at "
               "position 25: '[' is never closed: expected ']' before the end of the string, "
               "found '[64:8,256:4'");
}

TEST(config_errors, stray_closing_bracket) {
  // PyTorch 2.11 silently ignores this one; gpumem does not.
  expect_error("expandable_segments:True]", "expandable_segments", "]", 24,
               "gpumem config: syntax error in the entry for key 'expandable_segments' at "
               "position 24: ']' without a matching '[', found ']'");
}

TEST(config_errors, boolean_other_than_true_or_false) {
  expect_error("expandable_segments:Yes", "expandable_segments", "Yes", 20,
               "gpumem config: invalid value 'Yes' for key 'expandable_segments' at position 20: "
               "expected True or False");
  EXPECT_THROW(allocator_config::parse("expandable_segments:true"), config_error);
  EXPECT_THROW(allocator_config::parse("pinned_use_background_threads:1"), config_error);
}

TEST(config_errors, max_split_size_mb_19) {
  expect_error("max_split_size_mb:19", "max_split_size_mb", "19", 18,
               "gpumem config: invalid value '19' for key 'max_split_size_mb' at position 18: "
               "must be at least 20 (MiB, the large segment size), as PyTorch 2.11 requires");
}

TEST(config_errors, max_split_size_mb_20_is_not_an_error_in_pytorch_2_11) {
  EXPECT_NO_THROW(allocator_config::parse("max_split_size_mb:20"));
  // ...but it is below a larger segment size.
  expect_error("large_segment_size_mb:64,max_split_size_mb:20", "max_split_size_mb", "20", 43,
               "gpumem config: invalid value '20' for key 'max_split_size_mb' at position 43: "
               "must be at least 64 (MiB, the large segment size), as PyTorch 2.11 requires");
}

TEST(config_errors, max_non_split_rounding_mb_below_segment_size) {
  expect_error("max_non_split_rounding_mb:19", "max_non_split_rounding_mb", "19", 26,
               "gpumem config: invalid value '19' for key 'max_non_split_rounding_mb' at position "
               "26: must be at least 20 (MiB, the large segment size), as PyTorch 2.11 requires");
}

TEST(config_errors, large_segment_size_mb_10) {
  expect_error("large_segment_size_mb:10", "large_segment_size_mb", "10", 22,
               "gpumem config: invalid value '10' for key 'large_segment_size_mb' at position 22: "
               "must be greater than 10 (MiB, the large-allocation threshold)");
}

TEST(config_errors, large_segment_size_above_a_kept_max_split_size) {
  allocator_config base;
  base.max_split_size = 40 * kMiB;
  try {
    allocator_config::parse("large_segment_size_mb:64", base);
    FAIL() << "no config_error";
  } catch (const config_error& e) {
    EXPECT_EQ(e.key(), "large_segment_size_mb");
    EXPECT_EQ(e.value(), "64");
    EXPECT_EQ(e.position(), 22u);
    EXPECT_EQ(std::string(e.what()),
              "gpumem config: invalid value '64' for key 'large_segment_size_mb' at position 22: "
              "must not exceed max_split_size_mb (40 MiB, set before)");
  }
}

TEST(config_errors, fraction_negative) {
  expect_error("per_process_memory_fraction:-0.1", "per_process_memory_fraction", "-0.1", 28,
               "gpumem config: invalid value '-0.1' for key 'per_process_memory_fraction' at "
               "position 28: must be in [0, 1]");
}

TEST(config_errors, fraction_above_one) {
  expect_error("per_process_memory_fraction:1.5", "per_process_memory_fraction", "1.5", 28,
               "gpumem config: invalid value '1.5' for key 'per_process_memory_fraction' at "
               "position 28: must be in [0, 1]");
}

TEST(config_errors, fraction_nan) {
  expect_error("per_process_memory_fraction:nan", "per_process_memory_fraction", "nan", 28,
               "gpumem config: invalid value 'nan' for key 'per_process_memory_fraction' at "
               "position 28: must be in [0, 1]");
}

TEST(config_errors, gc_threshold_zero) {
  expect_error("garbage_collection_threshold:0", "garbage_collection_threshold", "0", 29,
               "gpumem config: invalid value '0' for key 'garbage_collection_threshold' at "
               "position 29: must be in (0, 1), both ends excluded");
}

TEST(config_errors, gc_threshold_one) {
  expect_error("garbage_collection_threshold:1", "garbage_collection_threshold", "1", 29,
               "gpumem config: invalid value '1' for key 'garbage_collection_threshold' at "
               "position 29: must be in (0, 1), both ends excluded");
}

TEST(config_errors, divisions_not_a_power_of_two_single_form) {
  expect_error("roundup_power2_divisions:3", "roundup_power2_divisions", "3", 25,
               "gpumem config: invalid value '3' for key 'roundup_power2_divisions' at position "
               "25: must be a power of two (divisions per power-of-two interval)");
  EXPECT_THROW(allocator_config::parse("roundup_power2_divisions:0"), config_error);  // as PyTorch
}

TEST(config_errors, divisions_not_a_power_of_two_list_form) {
  expect_error("roundup_power2_divisions:[64:8,256:3]", "roundup_power2_divisions", "3", 35,
               "gpumem config: invalid value '3' for key 'roundup_power2_divisions' at position "
               "35: divisions must be 0 (off) or a power of two");
}

TEST(config_errors, interval_key_not_a_power_of_two) {
  expect_error("roundup_power2_divisions:[48:4]", "roundup_power2_divisions", "48", 26,
               "gpumem config: invalid value '48' for key 'roundup_power2_divisions' at position "
               "26: interval start (MiB) must be a power of two");
  EXPECT_THROW(allocator_config::parse("roundup_power2_divisions:[0:4]"), config_error);
  EXPECT_THROW(allocator_config::parse("roundup_power2_divisions:[64MB:4]"), config_error);
}

TEST(config_errors, empty_value) {
  expect_error("max_split_size_mb:", "max_split_size_mb", "", 18,
               "gpumem config: invalid value '' for key 'max_split_size_mb' at position 18: "
               "missing value: expected a non-negative integer");
  expect_error("expandable_segments:,max_split_size_mb:100", "expandable_segments", "", 20,
               "gpumem config: invalid value '' for key 'expandable_segments' at position 20: "
               "expected True or False");
}

TEST(config_errors, empty_entries_between_or_before_commas) {
  // One trailing comma is fine (see config_syntax); PyTorch also rejects these two.
  expect_error("expandable_segments:True,,max_split_size_mb:100", "", ",", 25,
               "gpumem config: syntax error at position 25: expected a key, found ','");
  expect_error(",expandable_segments:True", "", ",", 0,
               "gpumem config: syntax error at position 0: expected a key, found ','");
}

TEST(config_errors, missing_colon) {
  // PyTorch 2.11 reads "expandable_segments,True" as if it had a ':'; gpumem does not.
  expect_error("expandable_segments,True", "expandable_segments", ",", 19,
               "gpumem config: syntax error in the entry for key 'expandable_segments' at "
               "position 19: expected ':' after the key, found ','");
  expect_error("expandable_segments", "expandable_segments", "end", 19,
               "gpumem config: syntax error in the entry for key 'expandable_segments' at "
               "position 19: expected ':' after the key, found 'end'");
}

TEST(config_errors, missing_comma_between_entries) {
  expect_error("expandable_segments:True:max_split_size_mb:100", "expandable_segments", ":", 24,
               "gpumem config: syntax error in the entry for key 'expandable_segments' at "
               "position 24: expected ',' between entries or the end of the string, found ':'");
}

TEST(config_errors, negative_number) {
  // PyTorch's stoull wraps -1 to 2^64-1 and accepts it.
  expect_error("max_split_size_mb:-1", "max_split_size_mb", "-1", 18,
               "gpumem config: invalid value '-1' for key 'max_split_size_mb' at position 18: "
               "negative numbers are not allowed: expected a non-negative integer");
}

TEST(config_errors, trailing_garbage) {
  // PyTorch reads "100abc" as 100.
  expect_error("max_split_size_mb:100abc", "max_split_size_mb", "100abc", 18,
               "gpumem config: invalid value '100abc' for key 'max_split_size_mb' at position 18: "
               "expected a non-negative decimal integer (digits only)");
  expect_error("per_process_memory_fraction:.5x", "per_process_memory_fraction", ".5x", 28,
               "gpumem config: invalid value '.5x' for key 'per_process_memory_fraction' at "
               "position 28: expected a decimal number");
}

TEST(config_errors, not_a_number) {
  expect_error("max_split_size_mb:abc", "max_split_size_mb", "abc", 18,
               "gpumem config: invalid value 'abc' for key 'max_split_size_mb' at position 18: "
               "expected a non-negative decimal integer (digits only)");
}

TEST(config_errors, overflow) {
  expect_error("max_split_size_mb:99999999999999999999999", "max_split_size_mb",
               "99999999999999999999999", 18,
               "gpumem config: invalid value '99999999999999999999999' for key "
               "'max_split_size_mb' at position 18: too large: does not fit in 64 bits");
  EXPECT_THROW(allocator_config::parse("pinned_reserve_segment_size_mb:18446744073709551615"),
               config_error);
}

TEST(config_errors, list_for_a_single_value_key) {
  expect_error("max_split_size_mb:[100]", "max_split_size_mb", "]", 22,
               "gpumem config: syntax error in the entry for key 'max_split_size_mb' at position "
               "22: expected ':' inside an 'interval:value' item, found ']'");
  expect_error("max_split_size_mb:[64:1]", "max_split_size_mb", "[64:1]", 18,
               "gpumem config: invalid value '[64:1]' for key 'max_split_size_mb' at position 18: "
               "expected a single value, not a '[...]' list");
}

TEST(config_errors, pinned_and_backend_values) {
  expect_error("pinned_num_register_threads:3", "pinned_num_register_threads", "3", 28,
               "gpumem config: invalid value '3' for key 'pinned_num_register_threads' at "
               "position 28: must be a power of two no greater than 128");
  EXPECT_THROW(allocator_config::parse("pinned_num_register_threads:256"), config_error);
  EXPECT_THROW(allocator_config::parse("pinned_num_register_threads:0"), config_error);
  EXPECT_THROW(allocator_config::parse("pinned_reserve_segment_size_mb:0"), config_error);
  expect_error("backend:hipMallocAsync", "backend", "hipMallocAsync", 8,
               "gpumem config: invalid value 'hipMallocAsync' for key 'backend' at position 8: "
               "expected native or cudaMallocAsync");
  expect_error("policy:fast", "policy", "fast", 7,
               "gpumem config: invalid value 'fast' for key 'policy' at position 7: expected "
               "auto, classic, expandable or stitch");
}

TEST(config_errors, segment_sizes_are_bounded_at_one_tib) {
  // A segment size the device arithmetic cannot hold (2^44 MiB overflows a size_t in bytes, and
  // slightly less overflows rounding to pages) is refused by name, with the limit.
  expect_error("large_segment_size_mb:17592186044415", "large_segment_size_mb", "17592186044415",
               22,
               "gpumem config: invalid value '17592186044415' for key 'large_segment_size_mb' at "
               "position 22: must be at most 1048576 (MiB, 1 TiB: the largest segment gpumem "
               "asks the device for)");
  EXPECT_THROW(allocator_config::parse("expandable_segments:True,large_segment_size_mb:"
                                       "99999999999999999"),
               config_error);
  EXPECT_THROW(allocator_config::parse("pinned_reserve_segment_size_mb:1048577"), config_error);
  EXPECT_EQ(allocator_config::parse("large_segment_size_mb:1048576").large_segment_size,
            std::size_t{1} << 40);
  EXPECT_EQ(
      allocator_config::parse("pinned_reserve_segment_size_mb:1048576").pinned_reserve_segment_size,
      std::size_t{1} << 40);
  // Thresholds are not allocated: as in PyTorch, a huge value means "no limit".
  EXPECT_NO_THROW(
      allocator_config::parse("max_split_size_mb:17592186044415,"
                              "max_non_split_rounding_mb:99999999999999999"));
}

TEST(config_errors, validate_refuses_out_of_range_settings_made_in_code) {
  EXPECT_NO_THROW(allocator_config{}.validate());
  auto refused = [](auto change, const char* key) {
    allocator_config c;
    change(c);
    try {
      c.validate();
      ADD_FAILURE() << "no error for " << key;
    } catch (const config_error& e) {
      EXPECT_EQ(e.key(), key);
    }
  };
  refused([](allocator_config& c) { c.large_segment_size = std::size_t{1} << 62; },
          "large_segment_size_mb");
  refused([](allocator_config& c) { c.large_segment_size = 0; }, "large_segment_size_mb");
  refused([](allocator_config& c) { c.max_split_size = 1 * kMiB; }, "max_split_size_mb");
  refused([](allocator_config& c) { c.max_non_split_rounding = 0; }, "max_non_split_rounding_mb");
  refused([](allocator_config& c) { c.pinned_reserve_segment_size = SIZE_MAX; },
          "pinned_reserve_segment_size_mb");
  refused([](allocator_config& c) { c.per_process_memory_fraction = 2.0; },
          "per_process_memory_fraction");
  refused([](allocator_config& c) { c.garbage_collection_threshold = 1.0; },
          "garbage_collection_threshold");
  refused([](allocator_config& c) { c.roundup_power2_divisions[3] = 3; },
          "roundup_power2_divisions");
  refused([](allocator_config& c) { c.pinned_num_register_threads = 0; },
          "pinned_num_register_threads");
}

TEST(config_errors, parse_leaves_nothing_half_applied) {
  allocator_config base;
  base.max_split_size = 100 * kMiB;
  EXPECT_THROW(allocator_config::parse("max_split_size_mb:200,expandable_segments:Yes", base),
               config_error);
  EXPECT_EQ(base.max_split_size, 100 * kMiB);
}

}  // namespace

// The keys that may change at run time, shared by caching_allocator and the LibTorch adapter.
TEST(config_run_time, take_run_time_settings_copies_those_five_keys_only) {
  const allocator_config from = allocator_config::parse(
      "max_split_size_mb:64,max_non_split_rounding_mb:128,roundup_power2_divisions:8,"
      "garbage_collection_threshold:0.7,per_process_memory_fraction:0.5,"
      "expandable_segments:True,policy:classic,release_lock_on_cudamalloc:True");
  allocator_config to = allocator_config::parse("large_segment_size_mb:40");
  to.take_run_time_settings(from);
  EXPECT_EQ(to.max_split_size, from.max_split_size);
  EXPECT_EQ(to.max_non_split_rounding, from.max_non_split_rounding);
  EXPECT_EQ(to.large_segment_size, from.large_segment_size);
  EXPECT_EQ(to.roundup_power2_divisions, from.roundup_power2_divisions);
  EXPECT_EQ(to.garbage_collection_threshold, from.garbage_collection_threshold);
  // Everything else keeps its value.
  allocator_config expected = from;
  expected.per_process_memory_fraction = std::nullopt;
  expected.expandable_segments = false;
  expected.policy = allocator_policy::automatic;
  expected.release_lock_on_cudamalloc = false;
  EXPECT_EQ(to, expected);
}
