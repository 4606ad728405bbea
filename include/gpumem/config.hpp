// gpumem — allocator_config: every setting a user can give the allocator.
//
// The string syntax and every key are PyTorch 2.11's (PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF,
// c10/core/AllocatorConfig.cpp and c10/cuda/CUDAAllocatorConfig.cpp), so settings carry over
// unchanged: `key:value,key2:[a:b,c:d]`, booleans exactly `True`/`False`, sizes in MiB. gpumem adds
// its own keys (`policy:...`). Where PyTorch 2.11 silently accepts a malformed string (it does not
// check separators, wraps "-1", reads "100abc" as 100, ignores a final stray "]"), gpumem throws a
// config_error naming the key, the value and the position instead.
//
// See docs/configuration.md for the table of keys, defaults and what each policy honours.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpumem/detail/config_parser.hpp"
#include "gpumem/error.hpp"

namespace gpumem {

/// How the caching allocator obtains and reuses device memory (see DESIGN.md, "The caching
/// allocator"). `automatic` is resolved by allocator_config::effective_policy.
enum class allocator_policy { automatic, classic, expandable, stitch };

/// The spelling used in configuration strings: "auto", "classic", "expandable", "stitch".
/// Thread-safe; never throws.
inline std::string_view to_string(allocator_policy policy) noexcept {
  switch (policy) {
    case allocator_policy::automatic:
      return "auto";
    case allocator_policy::classic:
      return "classic";
    case allocator_policy::expandable:
      return "expandable";
    case allocator_policy::stitch:
      return "stitch";
  }
  return "auto";
}

/// All allocator settings. A plain value type: copy it, compare it, build it in code or from a
/// string. Sizes are in bytes here and in MiB in strings. Defaults are PyTorch 2.11's.
///
/// Thread safety: const member functions may run concurrently; parse/resolve/from_environment
/// return new objects and share nothing (from_environment reads the process environment, which
/// must not be modified concurrently, as POSIX requires of getenv).
struct allocator_config {
  // ---- PyTorch 2.11's keys ---------------------------------------------------------------
  /// max_split_size_mb: blocks of at least this size are never split. SIZE_MAX = unset.
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  /// max_non_split_rounding_mb: how much larger than the request a cached unsplittable block may
  /// be and still serve it. Follows large_segment_size unless set.
  std::size_t max_non_split_rounding = std::size_t{20} << 20;
  /// large_segment_size_mb (new in 2.11): the segment obtained for requests of 1–10 MiB, and the
  /// growth step of expandable segments. Also the minimum of the two keys above.
  std::size_t large_segment_size = std::size_t{20} << 20;
  /// roundup_power2_divisions: divisions per power-of-two interval; index i covers request sizes
  /// [2^i MiB, 2^(i+1) MiB) (index 0 also everything smaller, index 15 everything larger).
  /// 0 or 1 = round to 512 bytes only.
  std::array<std::size_t, 16> roundup_power2_divisions{};
  /// garbage_collection_threshold in (0, 1); 0 = off. Only acts with a memory cap (has_memory_cap).
  double garbage_collection_threshold = 0.0;
  /// per_process_memory_fraction in [0, 1]: caps reserved bytes at fraction × device memory.
  /// Unset = no cap; like PyTorch, 1.0 also means no cap.
  std::optional<double> per_process_memory_fraction;
  /// expandable_segments: True selects the expandable policy when `policy` is automatic.
  bool expandable_segments = false;
  /// release_lock_on_cudamalloc (alias release_lock_on_hipmalloc). Accepted, not honoured.
  bool release_lock_on_cudamalloc = false;
  /// graph_capture_record_stream_reuse. Accepted, not honoured.
  bool graph_capture_record_stream_reuse = false;
  /// pinned_use_cuda_host_register (alias pinned_use_hip_host_register). Pinned host pool setting.
  bool pinned_use_cuda_host_register = false;
  /// pinned_num_register_threads: a power of two, at most 128. Pinned host pool setting.
  std::size_t pinned_num_register_threads = 1;
  /// pinned_use_background_threads. Pinned host pool setting.
  bool pinned_use_background_threads = false;
  /// pinned_reserve_segment_size_mb, in bytes here; 0 = unset (the string must give > 0).
  std::size_t pinned_reserve_segment_size = 0;
  /// backend: "native" or "cudaMallocAsync". gpumem is itself the allocator; see notes().
  std::string backend = "native";

  // ---- gpumem's own keys -----------------------------------------------------------------
  /// policy: auto | classic | expandable | stitch.
  allocator_policy policy = allocator_policy::automatic;
  /// stitch_headroom: while reserved memory stays within this fraction above the high-water mark
  /// of requested bytes, a stitch miss creates new pages before it shares free ones (see
  /// docs/configuration.md, "Stitch's thresholds"). In [0, 1).
  double stitch_headroom = 0.015;
  /// stitch_settle_limit: the same bound once the workload has settled. In [0, 1).
  double stitch_settle_limit = 0.02;
  /// stitch_recurring_limit: the bound for a whole request in a pool that keeps missing after the
  /// workload settled. In [0, 1).
  double stitch_recurring_limit = 0.03;
  /// stitch_recurring_misses: how many misses since the workload settled make a pool's misses
  /// recurring. At least 1.
  std::uint32_t stitch_recurring_misses = 3;
  /// stitch_settled_allocations: allocations without a new high-water mark of requested bytes
  /// after which the workload counts as settled. At least 1.
  std::uint64_t stitch_settled_allocations = 1024;

  /// PyTorch's roundup_power2_divisions(size): the entry for floor(log2(size)) - 20, clamped to
  /// [0, 15]. (PyTorch would index 15 for size 0 through unsigned wrap-around; it never asks for 0,
  /// and here 0 maps to index 0.) Thread-safe; never throws.
  std::size_t divisions_for(std::size_t size) const noexcept;

  /// True when per_process_memory_fraction caps reserved memory (set and below 1, as PyTorch
  /// decides). Garbage collection only runs then. Thread-safe; never throws.
  bool has_memory_cap() const noexcept;

  /// Applies `text` on top of `base` and returns the result; keys absent from `text` keep base's
  /// values, a key given twice keeps the last value. Accepts every PyTorch 2.11 key and gpumem's
  /// own. Throws config_error (naming key, value and 0-based position) on any malformed input;
  /// `base` is never modified. Thread-safe.
  ///
  /// Unlike PyTorch's runtime re-parse (torch.cuda.memory._set_allocator_settings), which resets
  /// max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions and
  /// garbage_collection_threshold to their defaults whenever they are absent, this layers: that is
  /// what makes "code wins over the environment" keep the environment's other settings.
  static allocator_config parse(std::string_view text, allocator_config base);
  /// parse(text, allocator_config{}). (Two overloads: a `base = {}` default argument cannot use
  /// the member initializers inside the class's own definition.)
  static allocator_config parse(std::string_view text);

  /// The environment's settings, read as PyTorch 2.11.0 reads them: PYTORCH_CUDA_ALLOC_CONF if it
  /// is set (even to ""), else PYTORCH_ALLOC_CONF — in 2.11.0 the CUDA variable wins when both are
  /// set, despite PyTorch's comments — then GPUMEM_ALLOC_CONF applied on top. The PYTORCH_
  /// variables may not hold gpumem-only keys (PyTorch itself would reject them at startup).
  /// Throws config_error whose message names the variable. Not safe against concurrent setenv.
  static allocator_config from_environment();

  /// parse(code_settings, from_environment()): values set in code win over the environment.
  /// Throws config_error. Not safe against concurrent setenv.
  static allocator_config resolve(std::string_view code_settings);

  /// The canonical PyTorch-syntax string of the settings that differ from the defaults, keys in a
  /// fixed order; "" for a default config. parse(to_string()) == *this for every config that parse
  /// can produce (sizes set in code are written in whole MiB, rounded down). Contains `policy:`
  /// when set, which only parse()/GPUMEM_ALLOC_CONF accept. Thread-safe; may throw std::bad_alloc.
  std::string to_string() const;

  /// Checks the ranges the allocators rely on, for settings made in code (parse() only produces
  /// valid configs): large_segment_size above 10 MiB and at most 1 TiB, max_split_size and
  /// max_non_split_rounding not below it, pinned_reserve_segment_size at most 1 TiB, the fraction
  /// in [0, 1], the threshold in [0, 1), divisions 0 or a power of two, register threads a power of
  /// two up to 128. Throws config_error naming the key (position: npos); thread-safe.
  void validate() const;

  /// One line for each set key that gpumem accepts but does not honour, saying why; empty when
  /// everything set takes effect. Thread-safe; may throw std::bad_alloc.
  std::vector<std::string> notes() const;

  /// The policy the allocator runs: an explicit policy wins; automatic becomes expandable when
  /// expandable_segments is True, else stitch. Without VMM support every policy falls back to
  /// classic, as PyTorch falls back from expandable_segments:True. Thread-safe; never throws.
  allocator_policy effective_policy(bool device_supports_vmm) const noexcept;

  friend bool operator==(const allocator_config& a, const allocator_config& b) noexcept {
    return a.max_split_size == b.max_split_size &&
           a.max_non_split_rounding == b.max_non_split_rounding &&
           a.large_segment_size == b.large_segment_size &&
           a.roundup_power2_divisions == b.roundup_power2_divisions &&
           a.garbage_collection_threshold == b.garbage_collection_threshold &&
           a.per_process_memory_fraction == b.per_process_memory_fraction &&
           a.expandable_segments == b.expandable_segments &&
           a.release_lock_on_cudamalloc == b.release_lock_on_cudamalloc &&
           a.graph_capture_record_stream_reuse == b.graph_capture_record_stream_reuse &&
           a.pinned_use_cuda_host_register == b.pinned_use_cuda_host_register &&
           a.pinned_num_register_threads == b.pinned_num_register_threads &&
           a.pinned_use_background_threads == b.pinned_use_background_threads &&
           a.pinned_reserve_segment_size == b.pinned_reserve_segment_size &&
           a.backend == b.backend && a.policy == b.policy &&
           a.stitch_headroom == b.stitch_headroom &&
           a.stitch_settle_limit == b.stitch_settle_limit &&
           a.stitch_recurring_limit == b.stitch_recurring_limit &&
           a.stitch_recurring_misses == b.stitch_recurring_misses &&
           a.stitch_settled_allocations == b.stitch_settled_allocations;
  }
  friend bool operator!=(const allocator_config& a, const allocator_config& b) noexcept {
    return !(a == b);
  }
};

namespace detail {

// PyTorch 2.11's keys (AcceleratorAllocatorConfig's and CUDAAllocatorConfig's), then gpumem's.
inline constexpr std::array<std::string_view, 16> pytorch_config_keys{
    "backend",
    "large_segment_size_mb",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "per_process_memory_fraction",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "graph_capture_record_stream_reuse",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb"};
inline constexpr std::array<std::string_view, 6> gpumem_config_keys{"policy",
                                                                    "stitch_headroom",
                                                                    "stitch_settle_limit",
                                                                    "stitch_recurring_limit",
                                                                    "stitch_recurring_misses",
                                                                    "stitch_settled_allocations"};

inline bool is_pytorch_config_key(std::string_view key) noexcept {
  return std::find(pytorch_config_keys.begin(), pytorch_config_keys.end(), key) !=
         pytorch_config_keys.end();
}
inline bool is_gpumem_config_key(std::string_view key) noexcept {
  return std::find(gpumem_config_keys.begin(), gpumem_config_keys.end(), key) !=
         gpumem_config_keys.end();
}

inline std::string known_config_keys() {
  std::string all;
  for (auto key : pytorch_config_keys) all += (all.empty() ? "" : ", ") + std::string(key);
  for (auto key : gpumem_config_keys) all += ", " + std::string(key);
  return all;
}

inline constexpr std::size_t max_whole_mib = std::numeric_limits<std::size_t>::max() / config_mib;

// The largest segment a size setting may ask for (large_segment_size_mb,
// pinned_reserve_segment_size_mb): 1 TiB, several times the memory of any GPU or pinned pool, and
// small enough that the allocator's page arithmetic (rounding a segment up to pages, 9/8 of the
// device for an expandable range) cannot overflow.
inline constexpr std::uint64_t max_segment_mib = std::uint64_t{1} << 20;

// PyTorch caps a MiB count at SIZE_MAX / 1 MiB before converting, so huge values mean "no limit"
// rather than an overflow.
inline std::size_t clamped_mib_to_bytes(std::uint64_t in_mib) noexcept {
  return static_cast<std::size_t>(std::min<std::uint64_t>(in_mib, max_whole_mib)) * config_mib;
}

inline const config_token& single_value(const config_entry& entry, config_source source) {
  if (entry.is_list) {
    throw_invalid_value(source, entry.key.text, entry.value_text, entry.value.position,
                        "expected a single value, not a '[...]' list");
  }
  return entry.value;
}

inline void apply_roundup_power2_divisions(allocator_config& config, const config_entry& entry,
                                           config_source source) {
  const std::string& key = entry.key.text;
  auto& table = config.roundup_power2_divisions;
  table.fill(0);  // the key describes the whole table, as in PyTorch (which resets it per parse)
  if (!entry.is_list) {
    const std::uint64_t n = read_config_uint(entry.value, key, source);
    if (!is_power_of_two(n)) {
      throw_invalid_value(source, key, entry.value.text, entry.value.position,
                          "must be a power of two (divisions per power-of-two interval)");
    }
    table.fill(static_cast<std::size_t>(n));
    return;
  }
  // PyTorch 2.11's list semantics, reproduced exactly (checked against libc10.so 2.11.0):
  //  - an interval key k (MiB, a power of two) sets index log2(k), clamped to [0, 15];
  //  - the first listed interval also fills every index below it;
  //  - indices between listed intervals keep 0;
  //  - '>' fills from the index after the last listed interval to the end, so it never
  //    overwrites a listed interval (older releases started at the last listed index itself).
  bool first_interval = true;
  std::size_t last_index = 0;
  for (const config_item& item : entry.items) {
    const std::uint64_t value = read_config_uint(item.value, key, source);
    if (value != 0 && !is_power_of_two(value)) {
      throw_invalid_value(source, key, item.value.text, item.value.position,
                          "divisions must be 0 (off) or a power of two");
    }
    const auto divisions = static_cast<std::size_t>(value);
    if (item.key.text == ">") {
      std::fill(table.begin() + static_cast<std::ptrdiff_t>(std::min(last_index + 1, table.size())),
                table.end(), divisions);
      continue;
    }
    if (item.key.text.empty() ||
        item.key.text.find_first_not_of("0123456789") != std::string::npos) {
      throw_invalid_value(source, key, item.key.text, item.key.position,
                          "expected an interval start in MiB (a power of two) or '>'");
    }
    const std::uint64_t boundary = read_config_uint(item.key, key, source);
    if (!is_power_of_two(boundary)) {
      throw_invalid_value(source, key, item.key.text, item.key.position,
                          "interval start (MiB) must be a power of two");
    }
    const std::size_t index = std::min(floor_log2(boundary), table.size() - 1);
    if (first_interval) {
      std::fill(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(index), divisions);
      first_interval = false;
    }
    table[index] = divisions;
    last_index = index;
  }
}

// Applies one parsed entry to `config`. large_segment_size_mb was already applied by the caller.
inline void apply_config_entry(allocator_config& config, const config_entry& entry,
                               config_source source) {
  const std::string& key = entry.key.text;
  auto bool_value = [&] { return read_config_bool(single_value(entry, source), key, source); };
  auto uint_value = [&] { return read_config_uint(single_value(entry, source), key, source); };
  auto double_value = [&] { return read_config_double(single_value(entry, source), key, source); };
  auto fail = [&](std::string_view reason) {
    throw_invalid_value(source, key, entry.value_text, entry.value.position, reason);
  };

  if (key == "large_segment_size_mb") {
    return;
  } else if (key == "max_split_size_mb" || key == "max_non_split_rounding_mb") {
    const std::uint64_t in_mib = uint_value();
    // PyTorch 2.11: both must be >= large_segment_size_mb (20 by default), so 20 is accepted.
    const std::size_t min_mib = config.large_segment_size / config_mib;
    if (in_mib < min_mib) {
      fail("must be at least " + std::to_string(min_mib) +
           " (MiB, the large segment size), as PyTorch 2.11 requires");
    }
    (key == "max_split_size_mb" ? config.max_split_size : config.max_non_split_rounding) =
        clamped_mib_to_bytes(in_mib);
  } else if (key == "roundup_power2_divisions") {
    apply_roundup_power2_divisions(config, entry, source);
  } else if (key == "garbage_collection_threshold") {
    const double threshold = double_value();
    if (!(threshold > 0.0 && threshold < 1.0)) fail("must be in (0, 1), both ends excluded");
    config.garbage_collection_threshold = threshold;
  } else if (key == "per_process_memory_fraction") {
    const double fraction = double_value();
    if (!(fraction >= 0.0 && fraction <= 1.0)) fail("must be in [0, 1]");
    config.per_process_memory_fraction = fraction;
  } else if (key == "expandable_segments") {
    config.expandable_segments = bool_value();
  } else if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_hipmalloc") {
    config.release_lock_on_cudamalloc = bool_value();
  } else if (key == "graph_capture_record_stream_reuse") {
    config.graph_capture_record_stream_reuse = bool_value();
  } else if (key == "pinned_use_cuda_host_register" || key == "pinned_use_hip_host_register") {
    config.pinned_use_cuda_host_register = bool_value();
  } else if (key == "pinned_num_register_threads") {
    const std::uint64_t threads = uint_value();
    if (!is_power_of_two(threads) || threads > 128) {
      fail("must be a power of two no greater than 128");
    }
    config.pinned_num_register_threads = static_cast<std::size_t>(threads);
  } else if (key == "pinned_use_background_threads") {
    config.pinned_use_background_threads = bool_value();
  } else if (key == "pinned_reserve_segment_size_mb") {
    const std::uint64_t in_mib = uint_value();
    if (in_mib == 0) fail("must be greater than 0");
    if (in_mib > max_segment_mib) {
      fail("must be at most " + std::to_string(max_segment_mib) +
           " (MiB, 1 TiB: the largest segment gpumem asks the device for)");
    }
    config.pinned_reserve_segment_size = static_cast<std::size_t>(in_mib) * config_mib;
  } else if (key == "backend") {
    const std::string& name = single_value(entry, source).text;
    if (name != "native" && name != "cudaMallocAsync") fail("expected native or cudaMallocAsync");
    config.backend = name;
  } else if (key == "stitch_headroom" || key == "stitch_settle_limit" ||
             key == "stitch_recurring_limit") {
    const double fraction = double_value();
    if (!(fraction >= 0.0 && fraction < 1.0)) fail("must be in [0, 1): a fraction of memory");
    (key == "stitch_headroom"       ? config.stitch_headroom
     : key == "stitch_settle_limit" ? config.stitch_settle_limit
                                    : config.stitch_recurring_limit) = fraction;
  } else if (key == "stitch_recurring_misses") {
    const std::uint64_t misses = uint_value();
    if (misses == 0 || misses > 1000000) fail("must be from 1 to 1000000");
    config.stitch_recurring_misses = static_cast<std::uint32_t>(misses);
  } else if (key == "stitch_settled_allocations") {
    const std::uint64_t allocations = uint_value();
    if (allocations == 0) fail("must be at least 1");
    config.stitch_settled_allocations = allocations;
  } else if (key == "policy") {
    const std::string& name = single_value(entry, source).text;
    if (name == "auto") {
      config.policy = allocator_policy::automatic;
    } else if (name == "classic") {
      config.policy = allocator_policy::classic;
    } else if (name == "expandable") {
      config.policy = allocator_policy::expandable;
    } else if (name == "stitch") {
      config.policy = allocator_policy::stitch;
    } else {
      fail("expected auto, classic, expandable or stitch");
    }
  }
}

inline allocator_config parse_config(std::string_view text, allocator_config config,
                                     config_source source, bool pytorch_keys_only) {
  const std::vector<config_entry> entries = read_config_entries(text, source);
  for (const config_entry& entry : entries) {
    const std::string& key = entry.key.text;
    if (is_pytorch_config_key(key)) continue;
    if (is_gpumem_config_key(key)) {
      if (!pytorch_keys_only) continue;
      throw config_error("gpumem config: key '" + printable_excerpt(key) + "' (value '" +
                             printable_excerpt(entry.value_text) + "') " +
                             config_location(entry.key.position, source) +
                             " is gpumem's own: PyTorch rejects it at startup, so set it in "
                             "GPUMEM_ALLOC_CONF instead",
                         key, entry.value_text, entry.key.position);
    }
    throw config_error("gpumem config: unknown key '" + printable_excerpt(key) + "' (value '" +
                           printable_excerpt(entry.value_text) + "') " +
                           config_location(entry.key.position, source) + ": known keys are " +
                           known_config_keys(),
                       key, entry.value_text, entry.key.position);
  }

  // Like PyTorch, large_segment_size_mb is read first wherever it appears: it is the minimum the
  // other two sizes are checked against, and max_non_split_rounding follows it unless set.
  const config_entry* segment_entry = nullptr;
  for (const config_entry& entry : entries) {
    if (entry.key.text != "large_segment_size_mb") continue;
    const std::uint64_t in_mib =
        read_config_uint(single_value(entry, source), entry.key.text, source);
    if (in_mib <= 10) {
      throw_invalid_value(source, entry.key.text, entry.value_text, entry.value.position,
                          "must be greater than 10 (MiB, the large-allocation threshold)");
    }
    if (in_mib > max_segment_mib) {
      throw_invalid_value(source, entry.key.text, entry.value_text, entry.value.position,
                          "must be at most " + std::to_string(max_segment_mib) +
                              " (MiB, 1 TiB: the largest segment gpumem asks the device for)");
    }
    segment_entry = &entry;
  }
  bool split_set = false;
  bool rounding_set = false;
  for (const config_entry& entry : entries) {
    split_set = split_set || entry.key.text == "max_split_size_mb";
    rounding_set = rounding_set || entry.key.text == "max_non_split_rounding_mb";
  }
  if (segment_entry != nullptr) {
    const std::size_t segment = static_cast<std::size_t>(
        read_config_uint(segment_entry->value, segment_entry->key.text, source) * config_mib);
    // The rounding tolerance tracks the segment size unless something set it apart.
    if (config.max_non_split_rounding == config.large_segment_size) {
      config.max_non_split_rounding = segment;
    }
    config.large_segment_size = segment;
  }

  for (const config_entry& entry : entries) apply_config_entry(config, entry, source);

  // Values kept from `base` must still satisfy PyTorch's checks against a new segment size.
  if (segment_entry != nullptr) {
    auto check_kept = [&](bool set_here, std::size_t kept, std::string_view kept_key) {
      if (set_here || kept >= config.large_segment_size ||
          kept == std::numeric_limits<std::size_t>::max()) {
        return;
      }
      throw_invalid_value(source, segment_entry->key.text, segment_entry->value_text,
                          segment_entry->value.position,
                          "must not exceed " + std::string(kept_key) + " (" +
                              std::to_string(kept / config_mib) + " MiB, set before)");
    };
    check_kept(split_set, config.max_split_size, "max_split_size_mb");
    check_kept(rounding_set, config.max_non_split_rounding, "max_non_split_rounding_mb");
  }
  return config;
}

// Shortest text that reads back as the same double.
inline std::string config_double_text(double value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

// A list that parse() turns back into exactly `table`, given PyTorch's fill rules: the first item
// fills the leading run, '>' fills the trailing run, zeros in between need no item.
inline std::string roundup_power2_divisions_text(const std::array<std::size_t, 16>& table) {
  const std::size_t n = table.size();
  std::size_t lead_end = 0;  // last index of the leading run
  while (lead_end + 1 < n && table[lead_end + 1] == table[0]) ++lead_end;
  if (lead_end == n - 1) return std::to_string(table[0]);
  std::size_t tail_start = n - 1;  // first index of the trailing run
  while (tail_start > lead_end + 1 && table[tail_start - 1] == table[n - 1]) --tail_start;
  const bool use_tail = table[n - 1] != 0;

  std::string text = "[";
  auto item = [&](std::size_t index) {
    if (text.size() > 1) text += ',';
    text += std::to_string(std::size_t{1} << index) + ':' + std::to_string(table[index]);
  };
  item(lead_end);
  const std::size_t middle_end = use_tail ? tail_start : n;
  for (std::size_t i = lead_end + 1; i < middle_end; ++i) {
    // '>' starts right after the last listed index, so that index is listed even when it is 0.
    if (table[i] != 0 || (use_tail && i + 1 == tail_start)) item(i);
  }
  if (use_tail) text += ",>:" + std::to_string(table[n - 1]);
  return text + "]";
}

}  // namespace detail

inline std::size_t allocator_config::divisions_for(std::size_t size) const noexcept {
  const std::size_t log_size = size == 0 ? 0 : detail::floor_log2(size);
  const std::size_t index = log_size > 20 ? log_size - 20 : 0;  // intervals start at 1 MiB
  return roundup_power2_divisions[std::min(index, roundup_power2_divisions.size() - 1)];
}

inline bool allocator_config::has_memory_cap() const noexcept {
  return per_process_memory_fraction.has_value() && *per_process_memory_fraction < 1.0;
}

inline void allocator_config::validate() const {
  auto fail = [](const char* key, const std::string& value, const std::string& reason) {
    throw config_error("gpumem config: " + std::string(key) + " = " + value + " " + reason, key,
                       value, std::string::npos);
  };
  const std::size_t max_segment = static_cast<std::size_t>(detail::max_segment_mib) << 20;
  if (large_segment_size <= (std::size_t{10} << 20) || large_segment_size > max_segment) {
    fail("large_segment_size_mb", std::to_string(large_segment_size) + " B",
         "is outside (10 MiB, 1 TiB]");
  }
  if (max_split_size < large_segment_size) {
    fail("max_split_size_mb", std::to_string(max_split_size) + " B",
         "is below large_segment_size (" + std::to_string(large_segment_size) + " B)");
  }
  if (max_non_split_rounding < large_segment_size) {
    fail("max_non_split_rounding_mb", std::to_string(max_non_split_rounding) + " B",
         "is below large_segment_size (" + std::to_string(large_segment_size) + " B)");
  }
  if (pinned_reserve_segment_size > max_segment) {
    fail("pinned_reserve_segment_size_mb", std::to_string(pinned_reserve_segment_size) + " B",
         "is above 1 TiB");
  }
  if (per_process_memory_fraction &&
      !(*per_process_memory_fraction >= 0.0 && *per_process_memory_fraction <= 1.0)) {
    fail("per_process_memory_fraction", detail::config_double_text(*per_process_memory_fraction),
         "is outside [0, 1]");
  }
  if (!(garbage_collection_threshold >= 0.0 && garbage_collection_threshold < 1.0)) {
    fail("garbage_collection_threshold", detail::config_double_text(garbage_collection_threshold),
         "is outside [0, 1)");
  }
  for (std::size_t d : roundup_power2_divisions) {
    if (d != 0 && !detail::is_power_of_two(d)) {
      fail("roundup_power2_divisions", std::to_string(d), "is neither 0 nor a power of two");
    }
  }
  for (auto [key, fraction] : {std::pair<const char*, double>{"stitch_headroom", stitch_headroom},
                               {"stitch_settle_limit", stitch_settle_limit},
                               {"stitch_recurring_limit", stitch_recurring_limit}}) {
    if (!(fraction >= 0.0 && fraction < 1.0)) {
      fail(key, detail::config_double_text(fraction), "is outside [0, 1)");
    }
  }
  if (stitch_recurring_misses == 0) fail("stitch_recurring_misses", "0", "must be at least 1");
  if (stitch_settled_allocations == 0) {
    fail("stitch_settled_allocations", "0", "must be at least 1");
  }
  if (!detail::is_power_of_two(pinned_num_register_threads) || pinned_num_register_threads > 128) {
    fail("pinned_num_register_threads", std::to_string(pinned_num_register_threads),
         "is not a power of two up to 128");
  }
}

inline allocator_config allocator_config::parse(std::string_view text, allocator_config base) {
  return detail::parse_config(text, std::move(base), detail::config_source{}, false);
}

inline allocator_config allocator_config::parse(std::string_view text) {
  return parse(text, allocator_config{});
}

inline allocator_config allocator_config::from_environment() {
  allocator_config config;
  // PyTorch 2.11.0 reads PYTORCH_CUDA_ALLOC_CONF first (CUDAAllocatorConfig::instance and
  // AcceleratorAllocatorConfig::instance agree on that for CUDA builds); a set-but-empty variable
  // counts as set. PYTORCH_HIP_ALLOC_CONF, which 2.11 also reads for part of the keys, is a ROCm
  // spelling that gpumem, a CUDA library, does not read.
  for (const char* name : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    if (const char* value = std::getenv(name)) {
      config = detail::parse_config(value, std::move(config), detail::config_source{name}, true);
      break;
    }
  }
  if (const char* value = std::getenv("GPUMEM_ALLOC_CONF")) {
    config = detail::parse_config(value, std::move(config),
                                  detail::config_source{"GPUMEM_ALLOC_CONF"}, false);
  }
  return config;
}

inline allocator_config allocator_config::resolve(std::string_view code_settings) {
  return parse(code_settings, from_environment());
}

inline std::string allocator_config::to_string() const {
  const allocator_config defaults;
  std::string text;
  auto add = [&](std::string_view key, const std::string& value) {
    if (!text.empty()) text += ',';
    text.append(key.data(), key.size());
    text += ':';
    text += value;
  };
  auto mib = [](std::size_t bytes) { return std::to_string(bytes / detail::config_mib); };
  auto flag = [](bool value) { return std::string(value ? "True" : "False"); };

  if (backend != defaults.backend) add("backend", backend);
  if (large_segment_size != defaults.large_segment_size) {
    add("large_segment_size_mb", mib(large_segment_size));
  }
  if (max_split_size != defaults.max_split_size) add("max_split_size_mb", mib(max_split_size));
  // parse() makes the rounding follow the segment size, so only a different value needs writing.
  if (max_non_split_rounding != large_segment_size) {
    add("max_non_split_rounding_mb", mib(max_non_split_rounding));
  }
  if (roundup_power2_divisions != defaults.roundup_power2_divisions) {
    add("roundup_power2_divisions",
        detail::roundup_power2_divisions_text(roundup_power2_divisions));
  }
  if (garbage_collection_threshold != defaults.garbage_collection_threshold) {
    add("garbage_collection_threshold", detail::config_double_text(garbage_collection_threshold));
  }
  if (per_process_memory_fraction) {
    add("per_process_memory_fraction", detail::config_double_text(*per_process_memory_fraction));
  }
  if (expandable_segments) add("expandable_segments", flag(true));
  if (release_lock_on_cudamalloc) add("release_lock_on_cudamalloc", flag(true));
  if (graph_capture_record_stream_reuse) add("graph_capture_record_stream_reuse", flag(true));
  if (pinned_use_cuda_host_register) add("pinned_use_cuda_host_register", flag(true));
  if (pinned_num_register_threads != defaults.pinned_num_register_threads) {
    add("pinned_num_register_threads", std::to_string(pinned_num_register_threads));
  }
  if (pinned_use_background_threads) add("pinned_use_background_threads", flag(true));
  if (pinned_reserve_segment_size != defaults.pinned_reserve_segment_size) {
    add("pinned_reserve_segment_size_mb", mib(pinned_reserve_segment_size));
  }
  if (policy != defaults.policy) add("policy", std::string(gpumem::to_string(policy)));
  if (stitch_headroom != defaults.stitch_headroom) {
    add("stitch_headroom", detail::config_double_text(stitch_headroom));
  }
  if (stitch_settle_limit != defaults.stitch_settle_limit) {
    add("stitch_settle_limit", detail::config_double_text(stitch_settle_limit));
  }
  if (stitch_recurring_limit != defaults.stitch_recurring_limit) {
    add("stitch_recurring_limit", detail::config_double_text(stitch_recurring_limit));
  }
  if (stitch_recurring_misses != defaults.stitch_recurring_misses) {
    add("stitch_recurring_misses", std::to_string(stitch_recurring_misses));
  }
  if (stitch_settled_allocations != defaults.stitch_settled_allocations) {
    add("stitch_settled_allocations", std::to_string(stitch_settled_allocations));
  }
  return text;
}

inline std::vector<std::string> allocator_config::notes() const {
  std::vector<std::string> lines;
  if (backend == "cudaMallocAsync") {
    lines.emplace_back(
        "backend:cudaMallocAsync is not honoured: gpumem is itself the device allocator, so "
        "requests are served by its own caching policy, not by cudaMallocAsync");
  }
  if (release_lock_on_cudamalloc) {
    lines.emplace_back(
        "release_lock_on_cudamalloc:True is not honoured: gpumem keeps its allocator lock while "
        "it calls the device (cudaMalloc, cuMemCreate/cuMemMap)");
  }
  if (graph_capture_record_stream_reuse) {
    lines.emplace_back(
        "graph_capture_record_stream_reuse:True is not honoured: gpumem has no CUDA-graph capture "
        "pools, so there is no capture-time reuse to enable");
  }
  if (garbage_collection_threshold > 0.0 && !has_memory_cap()) {
    lines.emplace_back(
        "garbage_collection_threshold:" + detail::config_double_text(garbage_collection_threshold) +
        " has no effect: as in PyTorch, garbage collection only runs under a "
        "memory cap (per_process_memory_fraction below 1)");
  }
  if (expandable_segments &&
      (policy == allocator_policy::classic || policy == allocator_policy::stitch)) {
    lines.emplace_back("expandable_segments:True has no effect: policy:" +
                       std::string(gpumem::to_string(policy)) + " was chosen explicitly");
  }
  const allocator_config defaults;
  const bool stitch_set = stitch_headroom != defaults.stitch_headroom ||
                          stitch_settle_limit != defaults.stitch_settle_limit ||
                          stitch_recurring_limit != defaults.stitch_recurring_limit ||
                          stitch_recurring_misses != defaults.stitch_recurring_misses ||
                          stitch_settled_allocations != defaults.stitch_settled_allocations;
  if (stitch_set && effective_policy(true) != allocator_policy::stitch) {
    lines.emplace_back("the stitch_* keys have no effect: the policy is " +
                       std::string(gpumem::to_string(effective_policy(true))));
  }
  // The pinned host pool (host/pinned_pool.hpp) honours pinned_use_cuda_host_register and
  // pinned_num_register_threads; these two have no counterpart there.
  const char* const pinned_reason =
      " has no effect: gpumem's pinned host pool does not implement it";
  if (pinned_use_background_threads) {
    lines.push_back(std::string("pinned_use_background_threads:True") + pinned_reason);
  }
  if (pinned_reserve_segment_size != 0) {
    lines.push_back("pinned_reserve_segment_size_mb:" +
                    std::to_string(pinned_reserve_segment_size / detail::config_mib) +
                    pinned_reason);
  }
  return lines;
}

inline allocator_policy allocator_config::effective_policy(
    bool device_supports_vmm) const noexcept {
  if (!device_supports_vmm) return allocator_policy::classic;
  if (policy != allocator_policy::automatic) return policy;
  return expandable_segments ? allocator_policy::expandable : allocator_policy::stitch;
}

}  // namespace gpumem
