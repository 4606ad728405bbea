// gpumem — device_stats under PyTorch's names: the flat key list of torch.cuda.memory_stats(), a
// lookup by key, and JSON (flat, and nested like torch.cuda.memory_stats_as_nested_dict()).
//
// Keys and order follow PyTorch exactly, so scripts written against torch.cuda.memory_stats() read
// gpumem's output unchanged:
//  * the nested form has PyTorch's C++ insertion order (torch/csrc/cuda/Module.cpp, memoryStats):
//    num_alloc_retries, num_ooms, max_split_size, num_sync_all_streams, num_device_alloc,
//    num_device_free, num_oom_rejections (PyTorch 2.12), then the per-pool arrays allocation,
//    segment, active, inactive_split, allocated_bytes, reserved_bytes, active_bytes,
//    inactive_split_bytes, requested_bytes (each with pools all, small_pool, large_pool and fields
//    current, peak, allocated, freed), then oversize_allocations and oversize_segments;
//  * the flat form joins the nested names with '.' and sorts them as byte strings, which is what
//    memory_stats() does in Python (result.sort()): 123 keys, from "active.all.allocated" to
//    "segment.small_pool.peak".
// max_split_size is reported as stored: PyTorch stores static_cast<int64_t>(SIZE_MAX), i.e. -1,
// when no max_split_size_mb is configured, and so should the allocator that fills device_stats.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/stats.hpp"

namespace gpumem {

/// A flattened statistics list: (key, value) in torch.cuda.memory_stats() order.
using flat_stats = std::vector<std::pair<std::string, std::int64_t>>;

namespace detail {

struct named_counter {
  const char* name;
  std::int64_t device_stats::*member;
};
struct named_stat_array {
  const char* name;
  stat_array device_stats::*member;
};
struct named_stat {
  const char* name;
  stat device_stats::*member;
};
struct named_field {
  const char* name;
  std::int64_t stat::*member;
};

// Tables in PyTorch's nested-dict insertion order; the flat order is derived by sorting.
inline constexpr named_counter counter_names[] = {
    {"num_alloc_retries", &device_stats::num_alloc_retries},
    {"num_ooms", &device_stats::num_ooms},
    {"max_split_size", &device_stats::max_split_size},
    {"num_sync_all_streams", &device_stats::num_sync_all_streams},
    {"num_device_alloc", &device_stats::num_device_alloc},
    {"num_device_free", &device_stats::num_device_free},
    {"num_oom_rejections", &device_stats::num_oom_rejections},
};
inline constexpr named_stat_array stat_array_names[] = {
    {"allocation", &device_stats::allocation},
    {"segment", &device_stats::segment},
    {"active", &device_stats::active},
    {"inactive_split", &device_stats::inactive_split},
    {"allocated_bytes", &device_stats::allocated_bytes},
    {"reserved_bytes", &device_stats::reserved_bytes},
    {"active_bytes", &device_stats::active_bytes},
    {"inactive_split_bytes", &device_stats::inactive_split_bytes},
    {"requested_bytes", &device_stats::requested_bytes},
};
inline constexpr named_stat stat_names[] = {
    {"oversize_allocations", &device_stats::oversize_allocations},
    {"oversize_segments", &device_stats::oversize_segments},
};
// Indexed by stat_type.
inline constexpr const char* pool_names[num_stat_types] = {"all", "small_pool", "large_pool"};
inline constexpr named_field field_names[] = {
    {"current", &stat::current},
    {"peak", &stat::peak},
    {"allocated", &stat::allocated},
    {"freed", &stat::freed},
};

/// One flat key and where its value lives in device_stats.
struct stat_key_entry {
  std::string key;
  std::int64_t device_stats::*counter = nullptr;  // a plain counter, or
  stat_array device_stats::*array = nullptr;      // a per-pool stat (with pool), or
  stat device_stats::*single = nullptr;           // a single stat
  std::size_t pool = 0;
  std::int64_t stat::*field = nullptr;

  std::int64_t read(const device_stats& s) const noexcept {
    if (counter != nullptr) return s.*counter;
    const stat& st = array != nullptr ? (s.*array)[pool] : s.*single;
    return st.*field;
  }
};

/// Every flat key, sorted as memory_stats() sorts them. Built once (thread-safe static init).
inline const std::vector<stat_key_entry>& stat_key_table() {
  static const std::vector<stat_key_entry> table = [] {
    std::vector<stat_key_entry> t;
    for (const auto& c : counter_names) {
      stat_key_entry e;
      e.key = c.name;
      e.counter = c.member;
      t.push_back(std::move(e));
    }
    for (const auto& a : stat_array_names) {
      for (std::size_t p = 0; p < num_stat_types; ++p) {
        for (const auto& f : field_names) {
          stat_key_entry e;
          e.key = fmt::format("{}.{}.{}", a.name, pool_names[p], f.name);
          e.array = a.member;
          e.pool = p;
          e.field = f.member;
          t.push_back(std::move(e));
        }
      }
    }
    for (const auto& s : stat_names) {
      for (const auto& f : field_names) {
        stat_key_entry e;
        e.key = fmt::format("{}.{}", s.name, f.name);
        e.single = s.member;
        e.field = f.member;
        t.push_back(std::move(e));
      }
    }
    // std::string compares bytes, as Python compares these ASCII strings.
    std::sort(t.begin(), t.end(),
              [](const stat_key_entry& a, const stat_key_entry& b) { return a.key < b.key; });
    return t;
  }();
  return table;
}

// Emits JSON the way Python's json.dumps does: separators ", " and ": " without indent; with
// indent >= 0, one member per line indented by `indent` spaces per level and "," at line ends.
class json_writer {
 public:
  explicit json_writer(int indent) : indent_(indent) {}

  void open() {
    out_ += '{';
    ++depth_;
    first_ = true;
  }
  void close() {
    --depth_;
    if (indent_ >= 0) newline();
    out_ += '}';
    first_ = false;
  }
  // Keys are gpumem's own ASCII identifiers: nothing to escape.
  void key(std::string_view k) {
    if (!first_) out_ += indent_ >= 0 ? "," : ", ";
    if (indent_ >= 0) newline();
    first_ = false;
    out_ += '"';
    out_ += k;
    out_ += "\": ";
  }
  void value(std::int64_t v) { fmt::format_to(std::back_inserter(out_), "{}", v); }
  std::string take() { return std::move(out_); }

 private:
  void newline() {
    out_ += '\n';
    out_.append(static_cast<std::size_t>(indent_) * static_cast<std::size_t>(depth_), ' ');
  }

  std::string out_;
  int indent_;
  int depth_ = 0;
  bool first_ = true;
};

}  // namespace detail

/// The flat keys of torch.cuda.memory_stats(), in its order (123 keys).
/// Thread-safe; throws std::bad_alloc only (on first use, when the table is built).
inline std::vector<std::string> stat_keys() {
  std::vector<std::string> keys;
  keys.reserve(detail::stat_key_table().size());
  for (const auto& e : detail::stat_key_table()) keys.push_back(e.key);
  return keys;
}

/// Every statistic as (key, value), with exactly the keys and the order of
/// torch.cuda.memory_stats() for PyTorch's native caching allocator.
/// Thread-safe as long as nobody writes `stats` meanwhile (pass a copy taken under the
/// allocator's lock); throws std::bad_alloc only.
inline flat_stats flatten(const device_stats& stats) {
  const auto& table = detail::stat_key_table();
  flat_stats out;
  out.reserve(table.size());
  for (const auto& e : table) out.emplace_back(e.key, e.read(stats));
  return out;
}

/// The value of one flattened key, e.g. stat_value(s, "reserved_bytes.all.peak").
/// Thread-safe as long as nobody writes `stats` meanwhile. Throws std::out_of_range naming the
/// key when it is not one of flatten()'s keys (std::bad_alloc on first use, or while building the
/// message).
inline std::int64_t stat_value(const device_stats& stats, std::string_view key) {
  const auto& table = detail::stat_key_table();
  const auto it = std::lower_bound(
      table.begin(), table.end(), key,
      [](const detail::stat_key_entry& e, std::string_view k) { return e.key < k; });
  if (it == table.end() || it->key != key) {
    throw std::out_of_range(fmt::format(
        "gpumem::stat_value: unknown statistics key '{}' (expected a torch.cuda.memory_stats() "
        "key such as 'allocated_bytes.all.current')",
        key));
  }
  return it->read(stats);
}

/// The flat statistics as one JSON object, byte for byte what Python's
/// json.dumps(torch.cuda.memory_stats(), indent=...) prints for the same numbers: indent < 0 is
/// json.dumps' default single line, indent >= 0 puts one key per line.
/// Thread-safe as long as nobody writes `stats` meanwhile; throws std::bad_alloc only.
inline std::string to_json(const device_stats& stats, int indent = -1) {
  detail::json_writer w(indent);
  w.open();
  for (const auto& e : detail::stat_key_table()) {
    w.key(e.key);
    w.value(e.read(stats));
  }
  w.close();
  return w.take();
}

/// The statistics as nested JSON objects, in the shape and order of
/// torch.cuda.memory_stats_as_nested_dict() (see the top of this file); `indent` as for to_json.
/// Thread-safe as long as nobody writes `stats` meanwhile; throws std::bad_alloc only.
inline std::string to_json_nested(const device_stats& stats, int indent = -1) {
  detail::json_writer w(indent);
  const auto write_stat = [&w](const stat& s) {
    w.open();
    for (const auto& f : detail::field_names) {
      w.key(f.name);
      w.value(s.*f.member);
    }
    w.close();
  };
  w.open();
  for (const auto& c : detail::counter_names) {
    w.key(c.name);
    w.value(stats.*c.member);
  }
  for (const auto& a : detail::stat_array_names) {
    w.key(a.name);
    w.open();
    for (std::size_t p = 0; p < num_stat_types; ++p) {
      w.key(detail::pool_names[p]);
      write_stat((stats.*a.member)[p]);
    }
    w.close();
  }
  for (const auto& s : detail::stat_names) {
    w.key(s.name);
    write_stat(stats.*s.member);
  }
  w.close();
  return w.take();
}

}  // namespace gpumem
