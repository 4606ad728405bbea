// gpumem — one allocation's physical memory, passed to another process (or library) and opened
// there: the VMM counterpart of cudaIpcGetMemHandle / cudaIpcOpenMemHandle, which work only on
// cudaMalloc memory.
//
// The producer asks its allocator for the pages under a live block (expandable or stitch policy
// on cuda_vmm_device, whose memory is created with POSIX file descriptors as shareable handles,
// or with fabric handles: cuda_vmm_device::shareable_handle):
//
//   gpumem::shared_block shared = allocator.share_block(ptr);   // one fd per page, owned here
//   // send shared.fds over a Unix socket (SCM_RIGHTS), or let the consumer take them with
//   // pidfd_getfd, with offset, size and page_size; then close them here
//
// Memory with fabric handles comes as shared.fabric instead: 64 opaque bytes a page, which the
// consumer imports as they are (any process of the node, or of the NVLink domain with IMEX, that
// receives the bytes; no descriptor passing, nothing to close).
//
// and the consumer maps them at an address of its own:
//
//   gpumem::opened_block<gpumem::cuda_vmm_device> view(device, received);
//   kernel<<<...>>>(view.data(), received.size);
//
// What both sides must know (as with CUDA IPC): the consumer sees the memory the producer's block
// uses *now*; the producer must keep the block allocated (not freed, not reused) until the
// consumer is done, which the two programs agree on (PyTorch's torch.multiprocessing keeps a
// reference count in shared memory for this). The physical memory stays allocated while either
// side maps it: an empty_cache in the producer returns its share, not the consumer's mapping. The
// consumer needs access to the producer's file descriptors: a Unix socket works everywhere;
// pidfd_getfd needs ptrace permission over the producer, which many containers deny.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

namespace gpumem {

/// A fabric handle (CUmemFabricHandle): 64 opaque bytes that name physical memory to every
/// process allowed to import it.
using fabric_handle = std::array<unsigned char, 64>;

/// The pages under one allocation, exported: `fds[i]` (POSIX file descriptors) or `fabric[i]`
/// (fabric handles; then `fds` is empty) names the physical page mapped at
/// [i * page_size, (i + 1) * page_size) of the run that holds it; the allocation starts `offset`
/// bytes into the first page and is `size` bytes long.
struct shared_block {
  std::size_t offset = 0;
  std::size_t size = 0;
  std::size_t page_size = 0;
  std::vector<int> fds;
  std::vector<fabric_handle> fabric;

  /// The number of pages, whichever kind of handle names them.
  std::size_t pages() const noexcept { return fds.empty() ? fabric.size() : fds.size(); }
};

/// Closes the descriptors of `shared` (the producer, once they are sent; the consumer, once
/// opened) and forgets them. Never throws.
inline void close_descriptors(shared_block& shared) noexcept {
  for (int fd : shared.fds) {
    if (fd >= 0) ::close(fd);
  }
  shared.fds.clear();
}

/// A shared_block mapped in this process: an address range of its own, each page imported and
/// mapped in order, readable and writable from the device. Unmapped and released on destruction.
/// `Device` is a VMM device that imports handles (cuda_vmm_device: import_handle for file
/// descriptors, import_fabric_handle for fabric handles). Not copyable; movable.
template <class Device>
class opened_block {
 public:
  /// Maps `shared` on `device`. The descriptors stay the caller's (close them afterwards). Throws
  /// std::invalid_argument for an inconsistent description (no page, a page size that is not a
  /// multiple of the granularity, offset + size beyond the pages); cuda_error from the device
  /// (a descriptor that names no exported memory), with nothing left mapped or imported.
  opened_block(Device& device, const shared_block& shared) : device_(&device) {
    const std::size_t g = device.granularity();
    const std::size_t n = shared.pages();
    if (n == 0 || shared.page_size == 0 || shared.page_size % g != 0 ||
        shared.offset > n * shared.page_size ||
        shared.size > n * shared.page_size - shared.offset) {
      throw std::invalid_argument(
          fmt::format("gpumem: shared block of {} pages of {} bytes cannot hold {} bytes at "
                      "offset {} (granularity {})",
                      n, shared.page_size, shared.size, shared.offset, g));
    }
    bytes_ = n * shared.page_size;
    va_ = device.reserve_address(bytes_);
    std::size_t mapped = 0;
    try {
      handles_.reserve(n);
      for (int fd : shared.fds) handles_.push_back(device.import_handle(fd));
      if (shared.fds.empty()) {
        for (const fabric_handle& f : shared.fabric) {
          handles_.push_back(device.import_fabric_handle(f));
        }
      }
      for (; mapped < n; ++mapped) {
        device.map(va_ + mapped * shared.page_size, shared.page_size, 0, handles_[mapped]);
      }
      device.set_access(va_, bytes_);
    } catch (...) {
      if (mapped > 0) device.unmap(va_, mapped * shared.page_size);
      for (auto h : handles_) device.release_physical(h);
      device.free_address(va_, bytes_);
      throw;
    }
    data_ = va_ + shared.offset;
    size_ = shared.size;
  }

  opened_block(const opened_block&) = delete;
  opened_block& operator=(const opened_block&) = delete;
  opened_block(opened_block&& other) noexcept
      : device_(other.device_),
        va_(std::exchange(other.va_, 0)),
        bytes_(other.bytes_),
        data_(other.data_),
        size_(other.size_),
        handles_(std::move(other.handles_)) {}
  opened_block& operator=(opened_block&&) = delete;

  /// Unmaps and releases (device errors ignored: a destructor cannot report them).
  ~opened_block() {
    if (va_ == 0) return;
    try {
      device_->unmap(va_, bytes_);
      for (auto h : handles_) device_->release_physical(h);
      device_->free_address(va_, bytes_);
    } catch (...) {
    }
  }

  /// The allocation's first byte in this process.
  void* data() const noexcept { return reinterpret_cast<void*>(data_); }
  std::size_t size() const noexcept { return size_; }

 private:
  Device* device_;
  std::uintptr_t va_ = 0;
  std::size_t bytes_ = 0;
  std::uintptr_t data_ = 0;
  std::size_t size_ = 0;
  std::vector<typename Device::physical_handle> handles_;
};

}  // namespace gpumem
