// gpumem — allocator_config: every setting a user can give the allocator.
//
// The string syntax and every key are PyTorch 2.11's (PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF,
// c10/core/AllocatorConfig.cpp and c10/cuda/CUDAAllocatorConfig.cpp), so settings carry over
// unchanged: `key:value,key2:[a:b,c:d]`, booleans exactly `True`/`False`, sizes in MiB. gpumem adds
// its own keys (`policy:...`). Where PyTorch 2.11 silently accepts a malformed string (it does not
// check separators, wraps "-1", reads "100abc" as 100, ignores a final stray "]"), gpumem throws a
// config_error naming the key, the value and the position instead.
//
// detail::config_keys below is the table of keys (spellings, limits, defaults' documentation);
// docs/configuration.md shows it, with what each policy honours.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpumem/detail/config_parser.hpp"
#include "gpumem/error.hpp"

namespace gpumem {

/// How the caching allocator obtains and reuses device memory (docs/architecture.md, "Where each
/// policy lives"). `automatic` is resolved by allocator_config::effective_policy.
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

/// How the VMM policies' memory is shared with other processes (expandable_segments_handle_type):
/// `auto` fabric handles where the GPU and system pass the fabric check, else POSIX file
/// descriptors (PyTorch's UNSPECIFIED); `posix_fd`; `fabric`, refused where the GPU lacks fabric
/// access (as PyTorch 2.13 and newer refuse FABRIC_HANDLE there).
enum class vmm_handle_type { automatic, posix_fd, fabric };

/// The spelling in configuration strings: "auto", "posix_fd", "fabric". Thread-safe; never throws.
inline std::string_view to_string(vmm_handle_type type) noexcept {
  switch (type) {
    case vmm_handle_type::automatic:
      return "auto";
    case vmm_handle_type::posix_fd:
      return "posix_fd";
    case vmm_handle_type::fabric:
      return "fabric";
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
  // One field per key. detail::config_keys (below) is the table of keys: each key's spellings,
  // limits, how it is read, written, compared and checked, and its row of docs/configuration.md
  // (default, accepted values, meaning). The comments here only say how a field stores its key.

  // ---- PyTorch 2.11's keys ---------------------------------------------------------------
  /// max_split_size_mb, in bytes. SIZE_MAX = unset (no block is too large to split).
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  /// max_non_split_rounding_mb, in bytes. parse() makes it follow large_segment_size unless set.
  std::size_t max_non_split_rounding = std::size_t{20} << 20;
  /// large_segment_size_mb, in bytes.
  std::size_t large_segment_size = std::size_t{20} << 20;
  /// roundup_power2_divisions: entry i covers request sizes [2^i MiB, 2^(i+1) MiB) (entry 0 also
  /// everything smaller, entry 15 everything larger). 0 or 1 = round to 512 bytes only.
  std::array<std::size_t, 16> roundup_power2_divisions{};
  /// garbage_collection_threshold. 0 = off. Only acts with a memory cap (has_memory_cap).
  double garbage_collection_threshold = 0.0;
  /// per_process_memory_fraction. Unset = no cap; like PyTorch, 1.0 also means no cap.
  std::optional<double> per_process_memory_fraction;
  /// expandable_segments.
  bool expandable_segments = false;
  /// release_lock_on_cudamalloc (alias release_lock_on_hipmalloc). Accepted, not honoured.
  bool release_lock_on_cudamalloc = false;
  /// graph_capture_record_stream_reuse (caching_allocator::set_capture_record_stream_reuse).
  bool graph_capture_record_stream_reuse = false;
  /// pinned_use_cuda_host_register (alias pinned_use_hip_host_register).
  bool pinned_use_cuda_host_register = false;
  /// pinned_num_register_threads.
  std::size_t pinned_num_register_threads = 1;
  /// pinned_use_background_threads. Accepted, not honoured.
  bool pinned_use_background_threads = false;
  /// pinned_reserve_segment_size_mb, in bytes. 0 = unset (a string must give more than 0).
  std::size_t pinned_reserve_segment_size = 0;
  /// backend: "native" or "cudaMallocAsync".
  std::string backend = "native";
  /// throw_on_cudamalloc_oom (PyTorch 2.12): a miss whose segment would take reserved memory past
  /// per_process_memory_fraction x device memory (the whole device when unset) fails at once.
  bool throw_on_cudamalloc_oom = false;

  // ---- gpumem's own keys -----------------------------------------------------------------
  /// policy.
  allocator_policy policy = allocator_policy::automatic;
  /// stitch_headroom (docs/configuration.md, "Stitch's thresholds").
  double stitch_headroom = 0.0;
  /// stitch_settle_limit.
  double stitch_settle_limit = 0.005;
  /// stitch_recurring_limit.
  double stitch_recurring_limit = 0.0;
  /// stitch_recurring_misses.
  std::uint32_t stitch_recurring_misses = 3;
  /// stitch_settled_allocations.
  std::uint64_t stitch_settled_allocations = 1024;
  /// stitch_step_match.
  std::uint64_t stitch_step_match = 64;
  /// oom_snapshot: the directory the LibTorch adapter writes a snapshot into before it raises an
  /// out-of-memory error (gpumem/torch/oom_snapshot.hpp). "" = off.
  std::string oom_snapshot;
  /// oom_snapshot_max_entries: the events kept for that snapshot (a ring: the newest).
  std::size_t oom_snapshot_max_entries = 100000;
  /// expandable_segments_handle_type (PyTorch's name for the setting, which PyTorch sets only from
  /// C++): the handle type the LibTorch adapter creates VMM memory with.
  vmm_handle_type expandable_segments_handle_type = vmm_handle_type::automatic;

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
  /// max_split_size_mb, roundup_power2_divisions and garbage_collection_threshold to their
  /// defaults whenever they are absent, this layers: that is what makes "code wins over the
  /// environment" keep the environment's other settings.
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

  /// Checks every setting against its key's limits in detail::config_keys, for settings made in
  /// code (parse() only produces valid configs): the limits parse() applies to strings, where 0
  /// is also accepted where it means unset or off (garbage_collection_threshold,
  /// pinned_reserve_segment_size, an entry of roundup_power2_divisions), and max_split_size and
  /// max_non_split_rounding not below large_segment_size. Throws config_error naming the key
  /// (position: npos); thread-safe.
  void validate() const;

  /// Copies from `from` the keys PyTorch lets a program change while it runs, as the allocator
  /// and the LibTorch adapter apply them: max_split_size, max_non_split_rounding,
  /// large_segment_size, roundup_power2_divisions, garbage_collection_threshold. Every other key
  /// keeps its value; nothing is validated. Never throws.
  void take_run_time_settings(const allocator_config& from) noexcept;

  /// One line for each set key that gpumem accepts but does not honour, saying why; empty when
  /// everything set takes effect. Thread-safe; may throw std::bad_alloc.
  std::vector<std::string> notes() const;

  /// The policy the allocator runs: an explicit policy wins; automatic becomes expandable when
  /// expandable_segments is True, else stitch. Without VMM support every policy falls back to
  /// classic, as PyTorch falls back from expandable_segments:True. Thread-safe; never throws.
  allocator_policy effective_policy(bool device_supports_vmm) const noexcept;

  /// Every key's field is equal (detail::config_keys). Thread-safe; never throws.
  friend bool operator==(const allocator_config& a, const allocator_config& b) noexcept;
  friend bool operator!=(const allocator_config& a, const allocator_config& b) noexcept {
    return !(a == b);
  }
};

namespace detail {

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

// Shortest text that reads back as the same double.
inline std::string config_double_text(double value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

// ---- The table of keys --------------------------------------------------------------------------
//
// config_keys has one row per setting: its spellings, which variables may hold it, the numbers it
// accepts, how it is read from a string (apply), written back (text), compared (same) and checked
// when set in code (check), and its row of docs/configuration.md. parse(), to_string(),
// operator==, validate() and the list of known keys in error messages are loops over the table;
// tests/test_config_doc.cpp fails when docs/configuration.md's "Keys" table says otherwise.
// Adding a key: a field in allocator_config and a row here (the helpers below cover flags,
// fractions, counts and MiB sizes), then the row in the docs.

// Who defined a key. PyTorch's keys are read from every variable; gpumem's own only from
// GPUMEM_ALLOC_CONF and code, because PyTorch refuses to start on a key it does not know.
enum class config_key_origin { pytorch, gpumem };

// The numbers a key accepts, in the string's unit (MiB for sizes); an open end is excluded. Every
// limit is an integer below 2^53 or a simple fraction, so a double holds it exactly.
struct config_range {
  double lo = 0.0;
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  constexpr bool below(double v) const noexcept { return lo_open ? !(v > lo) : !(v >= lo); }
  constexpr bool above(double v) const noexcept { return hi_open ? !(v < hi) : !(v <= hi); }
  // NaN is in no range (and below every one).
  constexpr bool contains(double v) const noexcept {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};

// The ranges in interval notation: closed [lo, hi], open (lo, hi), left_open (lo, hi],
// right_open [lo, hi), at_least [lo, inf).
constexpr config_range any_number() noexcept {
  return {};
}
constexpr config_range closed(double lo, double hi) noexcept {
  return {lo, hi, false, false};
}
constexpr config_range open(double lo, double hi) noexcept {
  return {lo, hi, true, true};
}
constexpr config_range left_open(double lo, double hi) noexcept {
  return {lo, hi, true, false};
}
constexpr config_range right_open(double lo, double hi) noexcept {
  return {lo, hi, false, true};
}
constexpr config_range at_least(double lo) noexcept {
  return {lo, std::numeric_limits<double>::infinity(), false, false};
}

// What a key accepts. A string's value outside `range` is refused with `too_low` or `too_high`
// (`too_low` when empty), where "{}" stands for the limit crossed. validate() refuses a value set
// in code outside the range with `check_reason`, except 0 where `zero_is_unset`.
struct config_limits {
  config_range range;
  bool power_of_two = false;  // a count must also be a power of two
  bool zero_is_unset = false;
  std::string_view too_low;
  std::string_view too_high;
  std::string_view check_reason;
};

// Flags and the keys whose values are names.
inline constexpr config_limits no_limits{};

// The key's row of docs/configuration.md's "Keys" table, after the key itself.
struct config_key_doc {
  std::string_view default_value;
  std::string_view accepted_values;
  std::string_view meaning;
  std::string_view honoured;
};

struct config_key;

struct config_key_handlers {
  // Reads one `key:value` entry into the config; throws config_error.
  void (*apply)(const config_key& self, allocator_config& config, const config_entry& entry,
                config_source source);
  // The value to_string() writes, nothing when the key is left out (at its default).
  std::optional<std::string> (*text)(const config_key& self, const allocator_config& config);
  // Whether the setting is the same in both.
  bool (*same)(const allocator_config& a, const allocator_config& b) noexcept;
  // validate(): throws config_error when a value set in code is outside the limits.
  void (*check)(const config_key& self, const allocator_config& config);
};

struct config_key {
  std::string_view name;   // the spelling in strings (PyTorch's, for PyTorch's keys)
  std::string_view alias;  // a second spelling of the same setting (PyTorch's ROCm name), or ""
  config_key_origin origin;
  // Read before every other key of the string, wherever it appears (large_segment_size_mb: the
  // other sizes are checked against it).
  bool applied_first;
  config_limits limits;
  config_key_doc doc;
  config_key_handlers handlers;
};

// The type of allocator_config's member F.
template <auto F>
using config_field_t =
    std::remove_cv_t<std::remove_reference_t<decltype(std::declval<allocator_config&>().*F)>>;

inline std::string with_limit(std::string_view reason, std::uint64_t limit) {
  std::string text(reason);
  const std::size_t at = text.find("{}");
  if (at != std::string::npos) text.replace(at, 2, std::to_string(limit));
  return text;
}

[[noreturn]] inline void refuse_value(const config_entry& entry, config_source source,
                                      std::string_view reason) {
  throw_invalid_value(source, entry.key.text, entry.value_text, entry.value.position, reason);
}

// validate()'s error: "gpumem config: <key> = <value> <reason>", position npos.
[[noreturn]] inline void refuse_setting(std::string_view key, const std::string& value,
                                        std::string_view reason) {
  throw config_error(
      "gpumem config: " + std::string(key) + " = " + value + " " + std::string(reason),
      std::string(key), value, std::string::npos);
}

// A non-negative integer within the row's limits.
inline std::uint64_t read_limited_uint(const config_key& self, const config_entry& entry,
                                       config_source source) {
  const std::uint64_t n = read_config_uint(single_value(entry, source), entry.key.text, source);
  const auto v = static_cast<double>(n);
  const std::string_view too_high =
      self.limits.too_high.empty() ? self.limits.too_low : self.limits.too_high;
  if (self.limits.range.below(v)) {
    refuse_value(entry, source,
                 with_limit(self.limits.too_low, static_cast<std::uint64_t>(self.limits.range.lo)));
  }
  if (self.limits.range.above(v)) {
    refuse_value(entry, source,
                 with_limit(too_high, static_cast<std::uint64_t>(self.limits.range.hi)));
  }
  if (self.limits.power_of_two && !is_power_of_two(n)) {
    refuse_value(entry, source, self.limits.too_low);
  }
  return n;
}

inline double read_limited_double(const config_key& self, const config_entry& entry,
                                  config_source source) {
  const double v = read_config_double(single_value(entry, source), entry.key.text, source);
  if (!self.limits.range.contains(v)) refuse_value(entry, source, self.limits.too_low);
  return v;
}

template <auto F>
bool same_field(const allocator_config& a, const allocator_config& b) noexcept {
  return a.*F == b.*F;
}

// ---- True/False flags
template <auto F>
void apply_flag(const config_key&, allocator_config& config, const config_entry& entry,
                config_source source) {
  config.*F = read_config_bool(single_value(entry, source), entry.key.text, source);
}
template <auto F>
std::optional<std::string> flag_text(const config_key&, const allocator_config& config) {
  if (config.*F == allocator_config{}.*F) return std::nullopt;
  return config.*F ? "True" : "False";
}

// ---- Fractions (double)
template <auto F>
void apply_fraction(const config_key& self, allocator_config& config, const config_entry& entry,
                    config_source source) {
  config.*F = read_limited_double(self, entry, source);
}
template <auto F>
std::optional<std::string> fraction_text(const config_key&, const allocator_config& config) {
  if (config.*F == allocator_config{}.*F) return std::nullopt;
  return config_double_text(config.*F);
}
template <auto F>
void check_fraction(const config_key& self, const allocator_config& config) {
  const double v = config.*F;
  if (self.limits.zero_is_unset && v == 0.0) return;
  if (!self.limits.range.contains(v)) {
    refuse_setting(self.name, config_double_text(v), self.limits.check_reason);
  }
}

// ---- Counts (integers)
template <auto F>
void apply_count(const config_key& self, allocator_config& config, const config_entry& entry,
                 config_source source) {
  config.*F = static_cast<config_field_t<F>>(read_limited_uint(self, entry, source));
}
template <auto F>
std::optional<std::string> count_text(const config_key&, const allocator_config& config) {
  if (config.*F == allocator_config{}.*F) return std::nullopt;
  return std::to_string(config.*F);
}
template <auto F>
void check_count(const config_key& self, const allocator_config& config) {
  const auto n = config.*F;
  if (self.limits.zero_is_unset && n == 0) return;
  if (!self.limits.range.contains(static_cast<double>(n)) ||
      (self.limits.power_of_two && !is_power_of_two(static_cast<std::uint64_t>(n)))) {
    refuse_setting(self.name, std::to_string(n), self.limits.check_reason);
  }
}

// ---- Sizes: whole MiB in strings, bytes in the config
template <auto F>
void apply_mib(const config_key& self, allocator_config& config, const config_entry& entry,
               config_source source) {
  config.*F = clamped_mib_to_bytes(read_limited_uint(self, entry, source));
}
template <auto F>
std::optional<std::string> mib_text(const config_key&, const allocator_config& config) {
  if (config.*F == allocator_config{}.*F) return std::nullopt;
  return std::to_string(config.*F / config_mib);
}
template <auto F>
void check_mib(const config_key& self, const allocator_config& config) {
  const std::size_t bytes = config.*F;
  if (self.limits.zero_is_unset && bytes == 0) return;
  if (!self.limits.range.contains(static_cast<double>(bytes) / static_cast<double>(config_mib))) {
    refuse_setting(self.name, std::to_string(bytes) + " B", self.limits.check_reason);
  }
}

// large_segment_size_mb (applied first): max_non_split_rounding follows it unless set apart.
inline void apply_large_segment_size(const config_key& self, allocator_config& config,
                                     const config_entry& entry, config_source source) {
  const std::size_t segment = clamped_mib_to_bytes(read_limited_uint(self, entry, source));
  if (config.max_non_split_rounding == config.large_segment_size) {
    config.max_non_split_rounding = segment;
  }
  config.large_segment_size = segment;
}

// max_split_size_mb and max_non_split_rounding_mb: at least large_segment_size_mb (PyTorch 2.11).
template <auto F>
void apply_segment_bound(const config_key& self, allocator_config& config,
                         const config_entry& entry, config_source source) {
  const std::uint64_t in_mib = read_limited_uint(self, entry, source);
  const std::size_t min_mib = config.large_segment_size / config_mib;
  if (in_mib < min_mib) refuse_value(entry, source, with_limit(self.limits.too_low, min_mib));
  config.*F = clamped_mib_to_bytes(in_mib);
}
template <auto F>
void check_segment_bound(const config_key& self, const allocator_config& config) {
  if (config.*F < config.large_segment_size) {
    refuse_setting(self.name, std::to_string(config.*F) + " B",
                   with_limit(self.limits.check_reason, config.large_segment_size));
  }
}
// parse() makes the rounding follow the segment size, so only a different value needs writing.
inline std::optional<std::string> max_non_split_rounding_text(const config_key&,
                                                              const allocator_config& config) {
  if (config.max_non_split_rounding == config.large_segment_size) return std::nullopt;
  return std::to_string(config.max_non_split_rounding / config_mib);
}

// per_process_memory_fraction: unset unless given.
inline void apply_memory_fraction(const config_key& self, allocator_config& config,
                                  const config_entry& entry, config_source source) {
  config.per_process_memory_fraction = read_limited_double(self, entry, source);
}
inline std::optional<std::string> memory_fraction_text(const config_key&,
                                                       const allocator_config& config) {
  if (!config.per_process_memory_fraction) return std::nullopt;
  return config_double_text(*config.per_process_memory_fraction);
}
inline void check_memory_fraction(const config_key& self, const allocator_config& config) {
  const auto& fraction = config.per_process_memory_fraction;
  if (fraction && !self.limits.range.contains(*fraction)) {
    refuse_setting(self.name, config_double_text(*fraction), self.limits.check_reason);
  }
}

// backend
inline void apply_backend(const config_key& self, allocator_config& config,
                          const config_entry& entry, config_source source) {
  const std::string& name = single_value(entry, source).text;
  if (name != "native" && name != "cudaMallocAsync") {
    refuse_value(entry, source, self.limits.too_low);
  }
  config.backend = name;
}
inline std::optional<std::string> backend_text(const config_key&, const allocator_config& config) {
  if (config.backend == allocator_config{}.backend) return std::nullopt;
  return config.backend;
}

// policy
inline void apply_policy(const config_key& self, allocator_config& config,
                         const config_entry& entry, config_source source) {
  const std::string& name = single_value(entry, source).text;
  for (auto policy : {allocator_policy::automatic, allocator_policy::classic,
                      allocator_policy::expandable, allocator_policy::stitch}) {
    if (name == gpumem::to_string(policy)) {
      config.policy = policy;
      return;
    }
  }
  refuse_value(entry, source, self.limits.too_low);
}
inline std::optional<std::string> policy_text(const config_key&, const allocator_config& config) {
  if (config.policy == allocator_config{}.policy) return std::nullopt;
  return std::string(gpumem::to_string(config.policy));
}

// expandable_segments_handle_type
inline void apply_handle_type(const config_key& self, allocator_config& config,
                              const config_entry& entry, config_source source) {
  const std::string& name = single_value(entry, source).text;
  // PyTorch's enumerator names are accepted too (Expandable_Segments_Handle_Type).
  if (name == "auto" || name == "unspecified") {
    config.expandable_segments_handle_type = vmm_handle_type::automatic;
  } else if (name == "posix_fd") {
    config.expandable_segments_handle_type = vmm_handle_type::posix_fd;
  } else if (name == "fabric" || name == "fabric_handle") {
    config.expandable_segments_handle_type = vmm_handle_type::fabric;
  } else {
    refuse_value(entry, source, self.limits.too_low);
  }
}
inline std::optional<std::string> handle_type_text(const config_key&,
                                                   const allocator_config& config) {
  if (config.expandable_segments_handle_type == allocator_config{}.expandable_segments_handle_type)
    return std::nullopt;
  return std::string(gpumem::to_string(config.expandable_segments_handle_type));
}

inline void no_check(const config_key&, const allocator_config&) {}

// oom_snapshot: a directory. The tokenizer drops whitespace and splits at ':' ',' '[' ']', so a
// path with one of those cannot be written in a string; set in code, it is refused too, so that
// to_string() reads back.
inline constexpr std::string_view config_path_forbidden = " \t\n\v\f\r:,[]";
inline void apply_oom_snapshot(const config_key& self, allocator_config& config,
                               const config_entry& entry, config_source source) {
  const std::string& dir = single_value(entry, source).text;
  if (dir.empty()) refuse_value(entry, source, self.limits.too_low);
  config.oom_snapshot = dir;
}
inline std::optional<std::string> oom_snapshot_text(const config_key&,
                                                    const allocator_config& config) {
  if (config.oom_snapshot.empty()) return std::nullopt;
  return config.oom_snapshot;
}
inline void check_oom_snapshot(const config_key& self, const allocator_config& config) {
  if (config.oom_snapshot.find_first_of(config_path_forbidden) != std::string::npos) {
    refuse_setting(self.name, config.oom_snapshot, self.limits.check_reason);
  }
}

// roundup_power2_divisions: a single count, or PyTorch's list of intervals.
inline void apply_roundup_power2_divisions(const config_key&, allocator_config& config,
                                           const config_entry& entry, config_source source) {
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

inline std::optional<std::string> roundup_power2_divisions_text(const config_key&,
                                                                const allocator_config& config) {
  if (config.roundup_power2_divisions == allocator_config{}.roundup_power2_divisions) {
    return std::nullopt;
  }
  return roundup_power2_divisions_text(config.roundup_power2_divisions);
}

inline void check_roundup_power2_divisions(const config_key& self, const allocator_config& config) {
  for (std::size_t d : config.roundup_power2_divisions) {
    if (self.limits.zero_is_unset && d == 0) continue;
    if (!is_power_of_two(d)) refuse_setting(self.name, std::to_string(d), self.limits.check_reason);
  }
}

template <auto F>
constexpr config_key_handlers flag_handlers() {
  return {apply_flag<F>, flag_text<F>, same_field<F>, no_check};
}
template <auto F>
constexpr config_key_handlers fraction_handlers() {
  return {apply_fraction<F>, fraction_text<F>, same_field<F>, check_fraction<F>};
}
template <auto F>
constexpr config_key_handlers count_handlers() {
  return {apply_count<F>, count_text<F>, same_field<F>, check_count<F>};
}
template <auto F>
constexpr config_key_handlers mib_handlers() {
  return {apply_mib<F>, mib_text<F>, same_field<F>, check_mib<F>};
}
template <auto F>
constexpr config_key_handlers segment_bound_handlers(
    std::optional<std::string> (*text)(const config_key&, const allocator_config&)) {
  return {apply_segment_bound<F>, text, same_field<F>, check_segment_bound<F>};
}

// Every key: PyTorch 2.11's (AcceleratorAllocatorConfig's and CUDAAllocatorConfig's), then
// gpumem's. The order is to_string()'s and that of the known keys in error messages.
inline constexpr std::array<config_key, 25> config_keys{{
    {"backend",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     {any_number(), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "expected native or cudaMallocAsync", "", ""},
     {"`native`", "`native`, `cudaMallocAsync`", "Which allocator PyTorch uses",
      "`native`: yes. `cudaMallocAsync`: accepted but not honoured, because gpumem is itself the "
      "allocator (note)."},
     {apply_backend, backend_text, same_field<&allocator_config::backend>, no_check}},
    {"large_segment_size_mb",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/true,
     {left_open(10.0, static_cast<double>(max_segment_mib)), /*power_of_two=*/false,
      /*zero_is_unset=*/false, "must be greater than {} (MiB, the large-allocation threshold)",
      "must be at most {} (MiB, 1 TiB: the largest segment gpumem asks the device for)",
      "is outside (10 MiB, 1 TiB]"},
     {"`20`", "integer > 10, at most 1048576 (1 TiB)",
      "Segment size obtained for requests larger than 1 MiB and smaller than 10 MiB, and the "
      "growth step of expandable segments. It is also the minimum for the next two keys and the "
      "default of `max_non_split_rounding_mb`. New in PyTorch 2.11.",
      "all policies. At run time (torch 2.11+): the size of new `cudaMalloc` segments; a VMM "
      "policy keeps the page size it started with (README.md, \"Allocator settings at run "
      "time\")."},
     {apply_large_segment_size, mib_text<&allocator_config::large_segment_size>,
      same_field<&allocator_config::large_segment_size>,
      check_mib<&allocator_config::large_segment_size>}},
    {"max_split_size_mb",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     {any_number(), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "must be at least {} (MiB, the large segment size), as PyTorch 2.11 requires", "",
      "is below large_segment_size ({} B)"},
     {"unlimited", "integer ≥ `large_segment_size_mb` (20 by default, so 20 is valid)",
      "Blocks of at least this size are never split (\"oversize\")",
      "all policies. Also at run time (README.md, \"Allocator settings at run time\")."},
     segment_bound_handlers<&allocator_config::max_split_size>(
         mib_text<&allocator_config::max_split_size>)},
    {"max_non_split_rounding_mb",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     {any_number(), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "must be at least {} (MiB, the large segment size), as PyTorch 2.11 requires", "",
      "is below large_segment_size ({} B)"},
     {"= `large_segment_size_mb` (20)", "integer ≥ `large_segment_size_mb`",
      "An oversize request may take a cached oversize block at most this much larger than itself",
      "all policies. Also at run time (README.md, \"Allocator settings at run time\")."},
     segment_bound_handlers<&allocator_config::max_non_split_rounding>(
         max_non_split_rounding_text)},
    {"roundup_power2_divisions",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     {any_number(), /*power_of_two=*/true, /*zero_is_unset=*/true, "", "",
      "is neither 0 nor a power of two"},
     {"0 (off) in every interval",
      "`N`, or `[interval_mb:N,...,>:N]` with each `N` 0 or a power of two (the single form must "
      "be a power of two)",
      "Rounds requests up to one of `N` steps per power-of-two size interval",
      "all policies. Also at run time (README.md, \"Allocator settings at run time\")."},
     {apply_roundup_power2_divisions, roundup_power2_divisions_text,
      same_field<&allocator_config::roundup_power2_divisions>, check_roundup_power2_divisions}},
    {"garbage_collection_threshold",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     {open(0.0, 1.0), /*power_of_two=*/false, /*zero_is_unset=*/true,
      "must be in (0, 1), both ends excluded", "", "is outside [0, 1)"},
     {"0 (off)", "(0, 1), both ends excluded",
      "Under a memory cap, frees old cached blocks when reserved memory exceeds threshold × cap",
      "all policies, but only with `per_process_memory_fraction` below 1, as in PyTorch (note "
      "otherwise). Also at run time (README.md, \"Allocator settings at run time\")."},
     fraction_handlers<&allocator_config::garbage_collection_threshold>()},
    {"per_process_memory_fraction",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     {closed(0.0, 1.0), /*power_of_two=*/false, /*zero_is_unset=*/false, "must be in [0, 1]", "",
      "is outside [0, 1]"},
     {"unset (no cap)", "[0, 1]",
      "Caps reserved memory at fraction × device memory. `1` means no cap, as in PyTorch.",
      "all policies. Set at run time (torch 2.10+), it caps only the GPUs first used "
      "afterwards, as in PyTorch."},
     {apply_memory_fraction, memory_fraction_text,
      same_field<&allocator_config::per_process_memory_fraction>, check_memory_fraction}},
    {"expandable_segments",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     no_limits,
     {"`False`", "`True`, `False`", "One growable virtual range per stream and pool",
      "Selects `policy:expandable` when `policy` is `auto`. No effect when `policy` is `classic` "
      "or `stitch` (note). Set at run time with `torch.cuda.memory._set_allocator_settings` "
      "(LibTorch adapter, torch 2.9 and newer): `False` gives PyTorch's default pool `cudaMalloc` "
      "segments under expandable and stitch, `True` returns to the configured policy (README.md, "
      "\"cudaMalloc memory at run time\")."},
     flag_handlers<&allocator_config::expandable_segments>()},
    {"release_lock_on_cudamalloc",
     "release_lock_on_hipmalloc",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     no_limits,
     {"`False`", "`True`, `False`", "Release the allocator lock around `cudaMalloc`",
      "no: gpumem keeps its lock during device calls (note)"},
     flag_handlers<&allocator_config::release_lock_on_cudamalloc>()},
    {"graph_capture_record_stream_reuse",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     no_limits,
     {"`False`", "`True`, `False`",
      "During CUDA graph capture, reuse blocks freed with `record_stream` once graph order makes "
      "it safe",
      "all policies on the CUDA devices; the simulated device, which has no capture graph, keeps "
      "such blocks until the capture ends"},
     flag_handlers<&allocator_config::graph_capture_record_stream_reuse>()},
    {"pinned_use_cuda_host_register",
     "pinned_use_hip_host_register",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     no_limits,
     {"`False`", "`True`, `False`",
      "Pinned host memory from `malloc` + `cudaHostRegister` instead of `cudaHostAlloc`",
      "yes, by `pinned_pool`"},
     flag_handlers<&allocator_config::pinned_use_cuda_host_register>()},
    {"pinned_num_register_threads",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     {closed(1.0, 128.0), /*power_of_two=*/true, /*zero_is_unset=*/false,
      "must be a power of two no greater than 128", "", "is not a power of two up to 128"},
     {"`1`", "power of two ≤ 128",
      "Threads that page in and register pinned memory under the key above",
      "yes, by `pinned_pool` (pages pre-faulted in parallel, then one `cudaHostRegister`)"},
     count_handlers<&allocator_config::pinned_num_register_threads>()},
    {"pinned_use_background_threads",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     no_limits,
     {"`False`", "`True`, `False`", "Process pinned-memory events on a background thread",
      "no (note)"},
     flag_handlers<&allocator_config::pinned_use_background_threads>()},
    {"pinned_reserve_segment_size_mb",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     {left_open(0.0, static_cast<double>(max_segment_mib)), /*power_of_two=*/false,
      /*zero_is_unset=*/true, "must be greater than {}",
      "must be at most {} (MiB, 1 TiB: the largest segment gpumem asks the device for)",
      "is above 1 TiB"},
     {"unset", "integer > 0, at most 1048576 (1 TiB)",
      "Reserve one pinned host segment of this size up front and serve small pinned requests from "
      "it",
      "no (note)"},
     mib_handlers<&allocator_config::pinned_reserve_segment_size>()},
    {"throw_on_cudamalloc_oom",
     "",
     config_key_origin::pytorch,
     /*applied_first=*/false,
     no_limits,
     {"`False`", "`True`, `False`",
      "A miss whose new segment would take reserved memory past `per_process_memory_fraction` × "
      "device memory (the whole device when unset) fails at once: no device call, no cache "
      "release, `num_oom_rejections` counted. As in PyTorch, a cap in force is checked first. New "
      "in PyTorch 2.12.",
      "all policies"},
     flag_handlers<&allocator_config::throw_on_cudamalloc_oom>()},
    {"policy",
     "",
     config_key_origin::gpumem,
     /*applied_first=*/false,
     {any_number(), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "expected auto, classic, expandable or stitch", "", ""},
     {"`auto`", "`auto`, `classic`, `expandable`, `stitch`",
      "gpumem's allocation policy. `auto` means `stitch` where the device supports VMM (the "
      "simulated device, `cuda_vmm_device`), `expandable` when `expandable_segments:True`, "
      "otherwise `classic`. Without VMM every policy falls back to `classic`, as PyTorch falls "
      "back from `expandable_segments:True`.",
      "yes"},
     {apply_policy, policy_text, same_field<&allocator_config::policy>, no_check}},
    {"stitch_headroom",
     "",
     config_key_origin::gpumem,
     /*applied_first=*/false,
     {right_open(0.0, 1.0), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "must be in [0, 1): a fraction of memory", "", "is outside [0, 1)"},
     {"`0`", "[0, 1)",
      "A stitch miss creates new pages before it shares free ones while reserved memory stays "
      "within this fraction above the high-water mark of requested bytes",
      "`policy:stitch` (note otherwise)"},
     fraction_handlers<&allocator_config::stitch_headroom>()},
    {"stitch_settle_limit",
     "",
     config_key_origin::gpumem,
     /*applied_first=*/false,
     {right_open(0.0, 1.0), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "must be in [0, 1): a fraction of memory", "", "is outside [0, 1)"},
     {"`0.005`", "[0, 1)", "The same bound once the workload has settled", "`policy:stitch`"},
     fraction_handlers<&allocator_config::stitch_settle_limit>()},
    {"stitch_recurring_limit",
     "",
     config_key_origin::gpumem,
     /*applied_first=*/false,
     {right_open(0.0, 1.0), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "must be in [0, 1): a fraction of memory", "", "is outside [0, 1)"},
     {"`0`", "[0, 1)",
      "The bound for a whole request in a pool whose misses recur after the workload settled",
      "`policy:stitch`"},
     fraction_handlers<&allocator_config::stitch_recurring_limit>()},
    {"stitch_recurring_misses",
     "",
     config_key_origin::gpumem,
     /*applied_first=*/false,
     {closed(1.0, 1000000.0), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "must be from 1 to 1000000", "", "must be from 1 to 1000000"},
     {"`3`", "1 to 1000000", "Misses of a pool since the workload settled that make them recurring",
      "`policy:stitch`"},
     count_handlers<&allocator_config::stitch_recurring_misses>()},
    {"stitch_settled_allocations",
     "",
     config_key_origin::gpumem,
     /*applied_first=*/false,
     {at_least(1.0), /*power_of_two=*/false, /*zero_is_unset=*/false, "must be at least 1", "",
      "must be at least 1"},
     {"`1024`", "≥ 1",
      "Allocations without a new high-water mark of requested bytes after which the workload has "
      "settled",
      "`policy:stitch`"},
     count_handlers<&allocator_config::stitch_settled_allocations>()},
    {"stitch_step_match",
     "",
     config_key_origin::gpumem,
     /*applied_first=*/false,
     {closed(0.0, 65536.0), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "must be from 0 to 65536", "", "must be from 0 to 65536"},
     {"`64`", "0 to 65536",
      "Requests in a row equal to those one step earlier after which each is placed where that "
      "one went (0: never)",
      "`policy:stitch`"},
     count_handlers<&allocator_config::stitch_step_match>()},
    {"oom_snapshot",
     "",
     config_key_origin::gpumem,
     /*applied_first=*/false,
     {any_number(), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "expected a directory (a path without spaces, ':', ',', '[' or ']')", "",
      "contains a space, ':', ',', '[' or ']', which a configuration string cannot hold"},
     {"unset (off)", "a directory path without spaces, `:`, `,`, `[` or `]`",
      "Before the LibTorch adapter raises an out-of-memory error, write a PyTorch memory snapshot "
      "of the failing GPU into this directory (made if missing; rank, host and pid in the file "
      "name; at most 3 files per process) and say on stderr how to replay it "
      "(README.md, \"Snapshot on out-of-memory\")",
      "the LibTorch adapter and `libgpumem_torch.so` (ignored by `caching_allocator` itself)"},
     {apply_oom_snapshot, oom_snapshot_text, same_field<&allocator_config::oom_snapshot>,
      check_oom_snapshot}},
    {"oom_snapshot_max_entries",
     "",
     config_key_origin::gpumem,
     /*applied_first=*/false,
     {closed(1.0, 10000000.0), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "must be from 1 to 10000000", "", "must be from 1 to 10000000"},
     {"`100000`", "1 to 10000000",
      "The newest allocator events `oom_snapshot` keeps per GPU for its snapshot (its replayable "
      "history), as `max_entries` of `torch.cuda.memory._record_memory_history`",
      "with `oom_snapshot`"},
     count_handlers<&allocator_config::oom_snapshot_max_entries>()},
    {"expandable_segments_handle_type",
     "",
     config_key_origin::gpumem,
     /*applied_first=*/false,
     {any_number(), /*power_of_two=*/false, /*zero_is_unset=*/false,
      "expected auto, posix_fd or fabric", "", ""},
     {"`auto`", "`auto`, `posix_fd`, `fabric` (also PyTorch's `unspecified`, `fabric_handle`)",
      "The handle type the VMM policies' memory is created with, so that other processes can open "
      "it (PyTorch's setting of that name, which PyTorch takes only from C++). `auto`: fabric "
      "handles where the GPU reports them and a page created with them exports and imports again "
      "(an IMEX channel is needed), else POSIX file descriptors, as PyTorch 2.13 and newer decide. "
      "`fabric` where the GPU lacks fabric access is an error at the GPU's first allocation, as in "
      "PyTorch",
      "the LibTorch adapter and `libgpumem_torch.so` under expandable and stitch (README.md, "
      "\"Limits of the VMM policies\"); `cuda_vmm_device::shareable_handle` in C++"},
     {apply_handle_type, handle_type_text,
      same_field<&allocator_config::expandable_segments_handle_type>, no_check}},
}};

// The row of `key`, under its name or its alias; nullptr for an unknown key.
inline const config_key* find_config_key(std::string_view key) noexcept {
  for (const config_key& row : config_keys) {
    if (row.name == key || (!row.alias.empty() && row.alias == key)) return &row;
  }
  return nullptr;
}

inline std::string known_config_keys() {
  std::string all;
  for (const config_key& row : config_keys) {
    for (std::string_view name : {row.name, row.alias}) {
      if (name.empty()) continue;
      if (!all.empty()) all += ", ";
      all.append(name.data(), name.size());
    }
  }
  return all;
}

inline allocator_config parse_config(std::string_view text, allocator_config config,
                                     config_source source, bool pytorch_keys_only) {
  const std::vector<config_entry> entries = read_config_entries(text, source);
  std::vector<const config_key*> rows;
  rows.reserve(entries.size());
  for (const config_entry& entry : entries) {
    const std::string& key = entry.key.text;
    const config_key* row = find_config_key(key);
    if (row == nullptr) {
      throw config_error("gpumem config: unknown key '" + printable_excerpt(key) + "' (value '" +
                             printable_excerpt(entry.value_text) + "') " +
                             config_location(entry.key.position, source) + ": known keys are " +
                             known_config_keys(),
                         key, entry.value_text, entry.key.position);
    }
    if (pytorch_keys_only && row->origin == config_key_origin::gpumem) {
      throw config_error("gpumem config: key '" + printable_excerpt(key) + "' (value '" +
                             printable_excerpt(entry.value_text) + "') " +
                             config_location(entry.key.position, source) +
                             " is gpumem's own: PyTorch rejects it at startup, so set it in "
                             "GPUMEM_ALLOC_CONF instead",
                         key, entry.value_text, entry.key.position);
    }
    rows.push_back(row);
  }

  // Like PyTorch, large_segment_size_mb is read first wherever it appears: it is the minimum the
  // other two sizes are checked against, and max_non_split_rounding follows it unless set.
  const config_entry* segment_entry = nullptr;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (!rows[i]->applied_first) continue;
    rows[i]->handlers.apply(*rows[i], config, entries[i], source);
    segment_entry = &entries[i];
  }
  bool split_set = false;
  bool rounding_set = false;
  for (const config_entry& entry : entries) {
    split_set = split_set || entry.key.text == "max_split_size_mb";
    rounding_set = rounding_set || entry.key.text == "max_non_split_rounding_mb";
  }

  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (!rows[i]->applied_first) rows[i]->handlers.apply(*rows[i], config, entries[i], source);
  }

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

}  // namespace detail

inline bool operator==(const allocator_config& a, const allocator_config& b) noexcept {
  for (const detail::config_key& row : detail::config_keys) {
    if (!row.handlers.same(a, b)) return false;
  }
  return true;
}

inline std::size_t allocator_config::divisions_for(std::size_t size) const noexcept {
  const std::size_t log_size = size == 0 ? 0 : detail::floor_log2(size);
  const std::size_t index = log_size > 20 ? log_size - 20 : 0;  // intervals start at 1 MiB
  return roundup_power2_divisions[std::min(index, roundup_power2_divisions.size() - 1)];
}

inline bool allocator_config::has_memory_cap() const noexcept {
  return per_process_memory_fraction.has_value() && *per_process_memory_fraction < 1.0;
}

inline void allocator_config::take_run_time_settings(const allocator_config& from) noexcept {
  max_split_size = from.max_split_size;
  max_non_split_rounding = from.max_non_split_rounding;
  large_segment_size = from.large_segment_size;
  roundup_power2_divisions = from.roundup_power2_divisions;
  garbage_collection_threshold = from.garbage_collection_threshold;
}

inline void allocator_config::validate() const {
  for (const detail::config_key& row : detail::config_keys) row.handlers.check(row, *this);
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
  std::string text;
  for (const detail::config_key& row : detail::config_keys) {
    const std::optional<std::string> value = row.handlers.text(row, *this);
    if (!value) continue;
    if (!text.empty()) text += ',';
    text.append(row.name.data(), row.name.size());
    text += ':';
    text += *value;
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
                          stitch_settled_allocations != defaults.stitch_settled_allocations ||
                          stitch_step_match != defaults.stitch_step_match;
  if (stitch_set && effective_policy(true) != allocator_policy::stitch) {
    lines.emplace_back("the stitch_* keys have no effect: the policy is " +
                       std::string(gpumem::to_string(effective_policy(true))));
  }
  if (oom_snapshot.empty() && oom_snapshot_max_entries != defaults.oom_snapshot_max_entries) {
    lines.emplace_back("oom_snapshot_max_entries:" + std::to_string(oom_snapshot_max_entries) +
                       " has no effect without oom_snapshot");
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
