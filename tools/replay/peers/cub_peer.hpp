// gpumem-replay-peer: CUB's CachingDeviceAllocator (CCCL, header-only).
//
// Configuration: "" for CUB's defaults (the CachingDeviceAllocator(bool) constructor: bin_growth 8,
// min_bin 3, max_bin 7, i.e. bins of 512 B, 4 KiB, ..., 2 MiB; larger requests are cudaMalloc'ed
// exactly and cudaFree'd on DeviceFree; at most 6291455 bytes kept cached), or comma-separated
// key:value pairs overriding some of them: bin_growth:N, min_bin:N, max_bin:N,
// max_cached_bytes:SIZE (bytes or gpumem size units; "none" for no limit).
//
// Streams: a block is allocated on the trace's stream and cached for reuse on that stream, or on
// any stream once the event CUB records at DeviceFree has completed. record_stream has no CUB
// equivalent: it is counted (record_stream_ignored) and otherwise ignored.
#pragma once

#include <cub/util_allocator.cuh>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpumem/config.hpp"  // before size_units.hpp (-Wshadow)
#include "gpumem/detail/size_units.hpp"
#include "peer_common.hpp"

namespace gpumem::peers {

class cub_peer {
 public:
  explicit cub_peer(const std::string& config) {
    unsigned bin_growth = 8;
    unsigned min_bin = 3;
    unsigned max_bin = 7;
    std::size_t max_cached = 6291455;
    bool custom = false;
    std::size_t pos = 0;
    while (pos < config.size()) {
      std::size_t comma = config.find(',', pos);
      if (comma == std::string::npos) comma = config.size();
      const std::string item = config.substr(pos, comma - pos);
      pos = comma + 1;
      if (item.empty()) continue;
      const std::size_t colon = item.find(':');
      if (colon == std::string::npos) throw config_error("\"" + item + "\" is not key:value");
      const std::string key = item.substr(0, colon);
      const std::string value = item.substr(colon + 1);
      custom = true;
      if (key == "max_cached_bytes") {
        if (value == "none") {
          max_cached = std::numeric_limits<std::size_t>::max();
        } else {
          try {
            max_cached = gpumem::parse_size(value);
          } catch (const std::exception& e) {
            throw config_error("max_cached_bytes: " + std::string(e.what()));
          }
        }
        continue;
      }
      unsigned* target = key == "bin_growth" ? &bin_growth
                         : key == "min_bin"  ? &min_bin
                         : key == "max_bin"  ? &max_bin
                                             : nullptr;
      if (target == nullptr) {
        throw config_error("unknown key \"" + key +
                           "\" (bin_growth, min_bin, max_bin, max_cached_bytes)");
      }
      if (value.empty() || value.size() > 6 ||
          value.find_first_not_of("0123456789") != std::string::npos) {
        throw config_error(key + " needs a number, got \"" + value + "\"");
      }
      *target = static_cast<unsigned>(std::stoul(value));
    }
    if (bin_growth < 2) throw config_error("bin_growth must be at least 2");
    if (min_bin > max_bin) throw config_error("min_bin must not exceed max_bin");
    if (custom) {
      alloc_ =
          std::make_unique<cub::CachingDeviceAllocator>(bin_growth, min_bin, max_bin, max_cached);
    } else {
      alloc_ = std::make_unique<cub::CachingDeviceAllocator>();
    }
    policy_ = fmt::format("bins {}^{}..{}^{}, cache {}", bin_growth, min_bin, bin_growth, max_bin,
                          max_cached == std::numeric_limits<std::size_t>::max()
                              ? std::string("unlimited")
                              : std::to_string(max_cached));
  }

  const char* name() const { return "cub"; }
  const std::string& policy() const { return policy_; }

  void start(std::size_t streams) {
    check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
    streams_ = create_streams(streams);
  }

  alloc_outcome allocate(std::uint32_t slot, std::size_t size, std::uint32_t stream) {
    if (slots_.size() <= slot) slots_.resize(std::max<std::size_t>(slot + 1, slots_.size() * 2));
    void* p = nullptr;
    const cudaError_t e = alloc_->DeviceAllocate(&p, size, streams_[stream]);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return {false, fmt::format("CUB CachingDeviceAllocator::DeviceAllocate({} bytes): {} ({})",
                                 size, cudaGetErrorName(e), cudaGetErrorString(e))};
    }
    check_cuda(e, "CachingDeviceAllocator::DeviceAllocate");
    slots_[slot] = p;
    peak_allocated_ = std::max(peak_allocated_, alloc_->cached_bytes[device_].live);
    return {};
  }

  void deallocate(std::uint32_t slot) {
    check_cuda(alloc_->DeviceFree(slots_[slot]), "CachingDeviceAllocator::DeviceFree");
    slots_[slot] = nullptr;
  }

  void record_stream(std::uint32_t, std::uint32_t) { ++record_stream_ignored_; }

  void empty_cache() {
    check_cuda(alloc_->FreeAllCached(), "CachingDeviceAllocator::FreeAllCached");
  }

  std::size_t peak_allocated() const { return peak_allocated_; }

  /// Its own statistics: fields added to the peer's record.
  json own_stats() const {
    const auto& b = alloc_->cached_bytes[device_];
    json stats;
    stats["cub_live_bytes"] = b.live;
    stats["cub_cached_free_bytes"] = b.free;
    stats["record_stream_ignored"] = record_stream_ignored_;
    return stats;
  }

 private:
  std::unique_ptr<cub::CachingDeviceAllocator> alloc_;
  std::string policy_;
  int device_ = 0;
  std::vector<cudaStream_t> streams_;
  std::vector<void*> slots_;
  std::size_t peak_allocated_ = 0;
  std::size_t record_stream_ignored_ = 0;
};

}  // namespace gpumem::peers
