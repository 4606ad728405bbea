// gpumem — helpers for page-granular host memory, used by the pinned pool's cudaHostRegister path
// and by the simulated host device. Nothing here is public API.
//
//  * host_page_size(): the OS page size (sysconf), 4096 if it cannot be read;
//  * page_aligned_alloc / page_aligned_free: whole pages of ordinary memory (std::aligned_alloc),
//    so that two registered ranges never share a page (cudaHostRegister pins whole pages and
//    refuses a range that overlaps one already registered);
//  * prefault_pages: touches the first byte of every page, split into `threads` contiguous chunks
//    touched in parallel — what PyTorch does with pinned_num_register_threads before its single
//    cudaHostRegister call, so that the driver (which holds a global lock while it registers)
//    finds the pages already mapped.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gpumem/detail/bits.hpp"

namespace gpumem::detail {

/// The OS page size in bytes (a power of two), or 4096 when sysconf cannot tell. Thread-safe;
/// never throws.
inline std::size_t host_page_size() noexcept {
  const long page = ::sysconf(_SC_PAGESIZE);
  if (page <= 0 || (page & (page - 1)) != 0) return 4096;
  return static_cast<std::size_t>(page);
}

/// `bytes` (> 0, a multiple of `page`, a power of two) of ordinary memory aligned to `page`;
/// nullptr when the system has no memory for it. Thread-safe; never throws.
inline void* page_aligned_alloc(std::size_t bytes, std::size_t page) noexcept {
  return std::aligned_alloc(page, bytes);
}

/// Frees memory from page_aligned_alloc. Never throws.
inline void page_aligned_free(void* ptr) noexcept {
  std::free(ptr);
}

/// Writes 0 to the first byte of every page of [begin, begin + bytes) that starts in the range.
inline void touch_pages(unsigned char* begin, std::size_t bytes, std::size_t page) noexcept {
  const auto start = reinterpret_cast<std::uintptr_t>(begin);
  const std::uintptr_t first = (start + page - 1) & ~(static_cast<std::uintptr_t>(page) - 1);
  for (std::uintptr_t p = first; p < start + bytes; p += page) {
    *reinterpret_cast<volatile unsigned char*>(p) = 0;
  }
}

/// Touches every page of [ptr, ptr + bytes) (see touch_pages), split into `threads` contiguous
/// chunks of whole pages run in parallel: the calling thread does the first, one std::thread each
/// the others. Runs on the calling thread alone when threads <= 1 or the range has fewer than
/// `threads` pages (PyTorch's rule). A thread that cannot be started has its chunk done inline.
/// Returns the number of threads that touched pages (1 = the caller alone). Thread-safe for
/// disjoint ranges; never throws.
inline std::size_t prefault_pages(void* ptr, std::size_t bytes, std::size_t threads,
                                  std::size_t page) noexcept {
  auto* base = static_cast<unsigned char*>(ptr);
  if (threads <= 1 || bytes / page < threads) {
    touch_pages(base, bytes, page);
    return 1;
  }
  const std::size_t pages_per_chunk = bytes / page / threads;
  const auto chunk = [&](std::size_t i, unsigned char*& begin, std::size_t& length) {
    begin = base + i * pages_per_chunk * page;
    const std::size_t end = i + 1 == threads ? bytes : (i + 1) * pages_per_chunk * page;
    length = end - i * pages_per_chunk * page;
  };
  std::vector<std::thread> workers;
  try {
    workers.reserve(threads - 1);
  } catch (...) {
    touch_pages(base, bytes, page);
    return 1;
  }
  std::size_t used = 1;
  for (std::size_t i = 1; i < threads; ++i) {
    unsigned char* begin = nullptr;
    std::size_t length = 0;
    chunk(i, begin, length);
    try {
      workers.emplace_back(touch_pages, begin, length, page);
      ++used;
    } catch (...) {
      touch_pages(begin, length, page);  // no thread available: do it here
    }
  }
  unsigned char* begin = nullptr;
  std::size_t length = 0;
  chunk(0, begin, length);
  touch_pages(begin, length, page);
  for (std::thread& t : workers) t.join();
  return used;
}

}  // namespace gpumem::detail
