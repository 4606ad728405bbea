// gpumem-replay-peer: PyTorch's CUDA caching allocator (c10::cuda::CUDACachingAllocator, from
// libc10_cuda.so), driven the way ATen drives it.
//
// Every allocation goes through CUDAAllocator::allocate with the trace's stream made the current
// c10 stream, and is kept as its c10::DataPtr: freeing a slot destroys the DataPtr, and
// record_stream is CUDACachingAllocator::recordStream on it — one path for all of them.
// The configuration string is PyTorch's own (PYTORCH_CUDA_ALLOC_CONF syntax), applied exactly as
// given with c10::CachingAllocator::setAllocatorSettings before the allocator starts; the
// environment variables PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF are removed first.
// Build with PYTORCH_C10_DRIVER_API_SUPPORTED defined, as libc10_cuda itself is: the header-side
// CUDAAllocatorConfig::expandable_segments() otherwise reports expandable segments as unsupported.
#pragma once

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "peer_common.hpp"

// Exported by libc10_cuda.so, declared in no installed header. ATen (libtorch_cuda) installs this
// hook; without it, freeing a block that has recorded streams fails in c10::cuda::MaybeSetDevice.
namespace c10::cuda::_internal {
C10_CUDA_API void setHasPrimaryContext(bool (*func)(DeviceIndex));
}

#ifndef GPUMEM_TORCH_VERSION
#define GPUMEM_TORCH_VERSION "unknown"
#endif

namespace gpumem::peers {

// DeviceStats::num_oom_rejections exists from torch 2.12 (throw_on_cudamalloc_oom).
template <class Stats>
auto append_oom_rejections(json& list, const Stats& s, int)
    -> decltype(s.num_oom_rejections, void()) {
  list["pytorch_num_oom_rejections"] = s.num_oom_rejections;
}
template <class Stats>
void append_oom_rejections(json&, const Stats&, long) {}

class pytorch_peer {
 public:
  explicit pytorch_peer(const std::string& config) {
    ::unsetenv("PYTORCH_ALLOC_CONF");
    ::unsetenv("PYTORCH_CUDA_ALLOC_CONF");
    c10::cuda::_internal::setHasPrimaryContext(&has_primary_context);
    try {
      c10::CachingAllocator::setAllocatorSettings(config);
    } catch (const c10::Error& e) {
      throw config_error(e.what_without_backtrace());
    }
    policy_ = c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments()
                  ? "expandable_segments"
                  : "native";
  }

  const char* name() const { return "pytorch"; }
  const std::string& policy() const { return policy_; }

  void start(std::size_t streams) {
    int devices = 0;
    check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    c10::cuda::CUDACachingAllocator::init(devices);
    for (cudaStream_t s : create_streams(streams)) {
      streams_.push_back(c10::cuda::getStreamFromExternal(s, device_));
    }
  }

  alloc_outcome allocate(std::uint32_t slot, std::size_t size, std::uint32_t stream) {
    if (slots_.size() <= slot) slots_.resize(std::max<std::size_t>(slot + 1, slots_.size() * 2));
    if (stream != current_) {
      c10::cuda::setCurrentCUDAStream(streams_[stream]);
      current_ = stream;
    }
    try {
      slots_[slot] = c10::cuda::CUDACachingAllocator::get()->allocate(size);
    } catch (const c10::OutOfMemoryError& e) {
      return {false, e.what_without_backtrace()};
    }
    return {};
  }

  void deallocate(std::uint32_t slot) { slots_[slot].clear(); }

  void record_stream(std::uint32_t slot, std::uint32_t stream) {
    c10::cuda::CUDACachingAllocator::recordStream(slots_[slot], streams_[stream]);
  }

  void empty_cache() { c10::cuda::CUDACachingAllocator::emptyCache(); }

  std::size_t peak_allocated() const {
    return static_cast<std::size_t>(stats().allocated_bytes[aggregate].peak);
  }

  /// Its own statistics (PyTorch's DeviceStats): fields added to the peer's record.
  json own_stats() const {
    const c10::CachingDeviceAllocator::DeviceStats s = stats();
    json list;
    list["torch_version"] = GPUMEM_TORCH_VERSION;
    list["pytorch_reserved_peak_bytes"] = s.reserved_bytes[aggregate].peak;
    list["pytorch_reserved_bytes"] = s.reserved_bytes[aggregate].current;
    list["pytorch_allocated_peak_bytes"] = s.allocated_bytes[aggregate].peak;
    list["pytorch_segments_peak"] = s.segment[aggregate].peak;
    list["pytorch_num_device_alloc"] = s.num_device_alloc;
    list["pytorch_num_device_free"] = s.num_device_free;
    list["pytorch_num_alloc_retries"] = s.num_alloc_retries;
    list["pytorch_num_ooms"] = s.num_ooms;
    list["pytorch_num_sync_all_streams"] = s.num_sync_all_streams;
    append_oom_rejections(list, s, 0);
    return list;
  }

 private:
  static constexpr auto aggregate =
      static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  static bool has_primary_context(c10::DeviceIndex) { return true; }  // one device, initialised

  c10::CachingDeviceAllocator::DeviceStats stats() const {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_);
  }

  std::string policy_;
  c10::DeviceIndex device_ = 0;
  std::vector<c10::cuda::CUDAStream> streams_;
  std::uint32_t current_ = static_cast<std::uint32_t>(-1);
  std::vector<c10::DataPtr> slots_;
};

}  // namespace gpumem::peers
