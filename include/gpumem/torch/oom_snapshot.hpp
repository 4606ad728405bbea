// gpumem — the snapshot the LibTorch adapter writes before it raises an out-of-memory error, when
// the `oom_snapshot:DIR` key is set (README.md, "Snapshot on out-of-memory").
//
// One PyTorch memory snapshot pickle per failure, named after the process that failed, so that the
// ranks of a job can write into one shared directory:
//
//   DIR/rank<RANK>-<host>-pid<pid>-oom<N>.pickle      RANK from RANK, else LOCAL_RANK, else 0
//
// It holds the failing GPU's segments and its newest allocator events (oom_event_ring, bounded by
// oom_snapshot_max_entries; no stack frames, no time stamps), the last of them the `oom` event with
// the size that failed, so that gpumem-replay replays the program up to that request and tries it.
// Nothing here needs c10: cuda_allocator.hpp feeds the ring and calls write_oom_snapshot; the
// Python package (gpumem.snapshot_on_oom) names its files the same way.
//
// Thread safety: the free functions share nothing; one oom_event_ring is guarded by its owner.
// Errors: write_oom_snapshot throws (std::system_error, std::invalid_argument); the adapter turns
// that into one line on stderr, never into an error of its own.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/trace/pytorch_snapshot.hpp"

namespace gpumem::torch {

/// A process writes at most this many snapshots: a program that catches its out-of-memory errors
/// and goes on (a smaller batch, a retry loop) must not fill the disk.
inline constexpr std::size_t oom_snapshot_max_files = 3;

/// The newest `capacity` events of one GPU, oldest first when read: the history an out-of-memory
/// snapshot holds. Memory: 40 bytes an event, allocated at the first push.
class oom_event_ring {
 public:
  explicit oom_event_ring(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  void push(const snapshot_trace_entry& e) {
    if (events_.size() < capacity_) {
      events_.push_back(e);
      return;
    }
    events_[next_] = e;
    next_ = next_ + 1 == capacity_ ? 0 : next_ + 1;
  }

  /// The events kept, oldest first.
  std::vector<snapshot_trace_entry> events() const {
    std::vector<snapshot_trace_entry> out;
    out.reserve(events_.size());
    out.insert(out.end(), events_.begin() + static_cast<std::ptrdiff_t>(next_), events_.end());
    out.insert(out.end(), events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(next_));
    return out;
  }

  std::size_t size() const noexcept { return events_.size(); }
  std::size_t capacity() const noexcept { return capacity_; }

 private:
  std::size_t capacity_;
  std::vector<snapshot_trace_entry> events_;
  std::size_t next_ = 0;  // the oldest event once the ring is full
};

namespace detail {

// Letters, digits, '.', '_' and '-' stay; anything else becomes '_' (a file name, and a path the
// stderr line can give to a shell unquoted).
inline std::string file_name_safe(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
    out += keep ? c : '_';
  }
  return out.empty() ? "_" : out;
}

}  // namespace detail

/// The process's rank in its job, as launchers set it (torchrun, SLURM wrappers): RANK, else
/// LOCAL_RANK, else "0"; made safe for a file name. Not safe against a concurrent setenv.
inline std::string oom_snapshot_rank() {
  for (const char* name : {"RANK", "LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return detail::file_name_safe(v);
  }
  return "0";
}

/// This machine's host name, made safe for a file name ("unknown-host" when it has none).
inline std::string oom_snapshot_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "unknown-host";
  return detail::file_name_safe(name);
}

/// "rank<rank>-<host>-pid<pid>-oom<n>.pickle".
inline std::string oom_snapshot_file_name(std::string_view rank, std::string_view host, long pid,
                                          std::size_t n) {
  return fmt::format("rank{}-{}-pid{}-oom{}.pickle", rank, host, pid, n);
}

/// The line on stderr after a snapshot was written to `path`: where, and the command that replays
/// it.
inline std::string oom_snapshot_message(int device, const std::string& path) {
  return fmt::format(
      "gpumem: out of memory on cuda:{}: snapshot written to {}; replay it with: gpumem-replay {}",
      device, path, path);
}

/// Writes the snapshot of `device` (`segments`: every allocator's segments on it; `events`: its
/// ring, oldest first; `settings`: the configuration it ran, for gpumem-replay's --config recorded)
/// as DIR/`file_name`, making DIR if missing. The file appears whole or not at all (written beside
/// it, then renamed). Returns its absolute path. Throws std::system_error when DIR cannot be made
/// or the file written, std::invalid_argument as write_pytorch_snapshot.
template <class Stream>
std::string write_oom_snapshot(const std::string& dir, const std::string& file_name,
                               const std::vector<segment_snapshot<Stream>>& segments,
                               const std::vector<snapshot_trace_entry>& events,
                               const std::string& settings, int device) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::system_error(ec, "cannot make the directory " + dir);
  const fs::path path = fs::absolute(fs::path(dir) / file_name);
  const fs::path partial = path.string() + ".partial";
  try {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw std::system_error(errno != 0 ? errno : EIO, std::generic_category(),
                              "cannot write " + partial.string());
    }
    write_pytorch_snapshot(out, segments, events, settings, device);
    out.close();
    if (!out) {
      throw std::system_error(errno != 0 ? errno : EIO, std::generic_category(),
                              "cannot write " + partial.string());
    }
  } catch (...) {
    std::error_code ignored;
    fs::remove(partial, ignored);
    throw;
  }
  fs::rename(partial, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(partial, ignored);
    throw std::system_error(ec, "cannot rename " + partial.string());
  }
  return path.lexically_normal().string();
}

}  // namespace gpumem::torch
