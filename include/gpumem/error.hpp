// gpumem — the typed errors every gpumem component throws.
//
// Contract: every error derives from std::exception (out_of_memory from std::bad_alloc, so code
// that already catches allocation failures keeps working); nothing crosses an extern "C" boundary
// as an exception.
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace gpumem {

/// An allocation could not be satisfied even after freeing cached memory. what() holds the full
/// diagnosis (PyTorch's sentence first, then gpumem's analysis); the fields hold the numbers.
class out_of_memory : public std::bad_alloc {
 public:
  struct details {
    std::size_t requested_bytes = 0;       ///< what the caller asked for
    std::size_t rounded_bytes = 0;         ///< after the allocator's rounding
    std::size_t device_request_bytes = 0;  ///< the segment the allocator tried to obtain
    std::size_t device_total_bytes = 0;
    std::size_t device_free_bytes = 0;
    std::size_t allocated_bytes = 0;
    std::size_t reserved_bytes = 0;
    std::size_t largest_free_block_bytes = 0;
    std::size_t free_cached_bytes = 0;
    int device = 0;
    /// throw_on_cudamalloc_oom refused the miss before any device call or cache release; then
    /// limit_bytes is the limit it would have passed and counted_reserved_bytes the reserved
    /// bytes counted against it (PyTorch's total_allocated_memory).
    bool preemptive_rejection = false;
    std::size_t limit_bytes = 0;
    std::size_t counted_reserved_bytes = 0;
  };

  out_of_memory(std::string message, details d) : message_(std::move(message)), details_(d) {}
  const char* what() const noexcept override { return message_.c_str(); }
  const details& info() const noexcept { return details_; }

 private:
  std::string message_;
  details details_;
};

/// A CUDA runtime or driver call failed with something other than an out-of-memory condition.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  /// The cudaError_t / CUresult value (0 when the failure was not a CUDA status).
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// A configuration string or value was malformed. what() names the key, the value and the
/// position (0-based character offset into the string that was parsed).
class config_error : public std::invalid_argument {
 public:
  config_error(const std::string& message, std::string key, std::string value, std::size_t position)
      : std::invalid_argument(message),
        key_(std::move(key)),
        value_(std::move(value)),
        position_(position) {}
  const std::string& key() const noexcept { return key_; }
  const std::string& value() const noexcept { return value_; }
  std::size_t position() const noexcept { return position_; }

 private:
  std::string key_;
  std::string value_;
  std::size_t position_;
};

/// A trace could not be read or replayed; offset is a byte offset or an event index (see what()).
class trace_error : public std::runtime_error {
 public:
  trace_error(const std::string& message, std::size_t offset)
      : std::runtime_error(message), offset_(offset) {}
  std::size_t offset() const noexcept { return offset_; }

 private:
  std::size_t offset_;
};

/// The caller broke an API contract (freed a pointer the allocator does not own, freed twice, ...).
/// The allocator's state is unchanged when this is thrown.
class usage_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace gpumem
