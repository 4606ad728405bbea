// gpumem — the page mechanics of the VMM policies (expandable and stitch): address ranges, the
// physical pages mapped into them, map / set-access / unmap, and the order that the streams using
// a page must keep. caching_allocator decides what to map where (docs/architecture.md); this
// component does it, counts what it holds and checks its own invariants.
//
// A *physical page* is one cuMemCreate'd allocation (the granularity, or the page size of an
// expandable pool). cuMemMap maps a handle from offset 0 only, so a page that may be mapped on its
// own is its own allocation.
//
// Stitch maps a free page at a second address rather than unmapping it and moving it: the page is
// then *shared* (mapped in several ranges) and at most one range may use it at a time — the
// *holder*, the range with allocated or pending blocks on it. The page is *held elsewhere* for the
// other ranges, whose blocks there must stay unused. A page is mapped at most once per range. Only
// shared pages keep a holder: a page mapped once is used by its range alone.
//
// Streams: a range belongs to one stream's pool, so a page mapped once is only ever used on that
// stream, in order. A shared page may be used through ranges of different streams: when a range on
// stream S takes a shared page last used on stream T, S waits on the GPU for T's work so far
// (cudaStreamWaitEvent), never the host. Unmapping is different: cuMemUnmap does not wait for the
// work that still uses the range, so before unmapping the host waits for the range's stream
// (order_before_unmap) — only empty_cache and the out-of-memory retry unmap.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/core/detail/block.hpp"
#include "gpumem/device/device.hpp"
#include "gpumem/error.hpp"

namespace gpumem::detail {

/// Names a physical page; 0 is none.
using page_id = std::uint32_t;
inline constexpr page_id no_page = 0;

/// Where a physical page is mapped: position `index` of range `seg`.
template <class Stream>
struct page_mapping {
  segment<Stream>* seg = nullptr;
  std::uint32_t index = 0;
};

template <class Stream>
struct physical_page {
  std::uint64_t handle = 0;  // 0: the id is free
  std::size_t bytes = 0;
  bool small = false;  // its reserved bytes count in the small pool's statistics (creator's pool)
  std::vector<page_mapping<Stream>> mappings;
  // Shared pages only (mappings.size() >= 2):
  segment<Stream>* holder = nullptr;  // the range whose blocks use it, none when holds == 0
  std::uint32_t holds = 0;            // allocated or pending blocks of `holder` touching it
  Stream last_stream{};               // the stream that used it last
};

/// The positions of VMM segment b->seg that block b touches: [first, last).
template <class Stream>
std::pair<std::size_t, std::size_t> page_span(const block<Stream>* b) noexcept {
  const segment<Stream>* s = b->seg;
  const std::size_t page = s->page_size;
  return {(b->ptr - s->ptr) / page, (b->ptr + b->size - s->ptr + page - 1) / page};
}

template <class Device>
class vmm_pages {
 public:
  using stream_type = typename Device::stream_type;
  using event_type = typename Device::event_type;
  using segment_type = segment<stream_type>;
  using handle_type = typename Device::physical_handle;

  explicit vmm_pages(Device& device) : device_(device), pages_(1) {}
  vmm_pages(const vmm_pages&) = delete;
  vmm_pages& operator=(const vmm_pages&) = delete;
  ~vmm_pages() {
    for (event_type e : events_) {
      try {
        device_.destroy_event(e);
      } catch (...) {  // a destructor must not throw; the device reports what it could not free
      }
    }
  }

  // --- address ranges ---------------------------------------------------------------------------

  /// Reserves `size` bytes of addresses for `s` (positions of `page` bytes, none mapped); false
  /// when the device has no address space left. Throws cuda_error on other failures.
  bool reserve(segment_type& s, std::size_t size, std::size_t page, std::size_t alignment) {
    std::uintptr_t va = 0;
    try {
      va = device_.reserve_address(size, alignment);
    } catch (const cuda_error& e) {
      if (e.code() != 2) throw;  // cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY
      return false;
    }
    s.ptr = va;
    s.size = size;
    s.page_size = page;
    s.pages.assign(size / page, no_page);
    s.mapped_pages = 0;
    s.shared_pages = 0;
    return true;
  }

  /// Gives back the addresses of `s`, which has nothing mapped.
  void free_range(segment_type& s) { device_.free_address(s.ptr, s.size); }

  // --- physical pages ---------------------------------------------------------------------------

  /// A new physical page of `bytes`, its reserved bytes counted for the small pool or the large
  /// ones; no_page when the device is out of memory. Throws cuda_error on other failures.
  page_id create(std::size_t bytes, bool small) {
    const handle_type h = device_.create_physical(bytes);
    if (h == handle_type{}) return no_page;
    page_id id = no_page;
    if (!free_ids_.empty()) {
      id = free_ids_.back();
      free_ids_.pop_back();
    } else {
      id = static_cast<page_id>(pages_.size());
      pages_.emplace_back();
    }
    physical_page<stream_type>& p = pages_[id];
    p.handle = static_cast<std::uint64_t>(h);
    p.bytes = bytes;
    p.small = small;
    (small ? live_small_bytes_ : live_large_bytes_) += bytes;
    ++live_pages_;
    return id;
  }

  /// Releases a page that is mapped nowhere (cuMemRelease).
  void release(page_id id) {
    physical_page<stream_type>& p = pages_[id];
    device_.release_physical(static_cast<handle_type>(p.handle));
    (p.small ? live_small_bytes_ : live_large_bytes_) -= p.bytes;
    --live_pages_;
    p = physical_page<stream_type>{};
    free_ids_.push_back(id);
  }

  const physical_page<stream_type>& page(page_id id) const noexcept { return pages_[id]; }

  /// Bytes of live physical pages counted for the small pool, and for the large ones.
  std::size_t small_bytes() const noexcept { return live_small_bytes_; }
  std::size_t large_bytes() const noexcept { return live_large_bytes_; }
  std::size_t live_pages() const noexcept { return live_pages_; }

  // --- mapping
  // ------------------------------------------------------------------------------------

  /// Maps pages `ids[0..n)` at positions [first, first + n) of `s` (unmapped), then sets their
  /// access in one call. A page mapped elsewhere becomes shared; it must be free there, and must
  /// not be mapped in `s` already. On a device failure nothing stays mapped and cuda_error is
  /// thrown (the pages are not released: the caller decides).
  void map(segment_type& s, std::size_t first, const page_id* ids, std::size_t n) {
    const std::size_t page = s.page_size;
    std::size_t mapped = 0;
    try {
      for (; mapped < n; ++mapped) {
        device_.map(s.ptr + (first + mapped) * page, page, 0,
                    static_cast<handle_type>(pages_[ids[mapped]].handle));
      }
      device_.set_access(s.ptr + first * page, n * page);
      if constexpr (has_grant_access_v<Device>) {
        for (int peer : peers_) device_.grant_access(s.ptr + first * page, n * page, peer);
      }
    } catch (...) {
      if (mapped > 0) device_.unmap(s.ptr + first * page, mapped * page);
      throw;
    }
    for (std::size_t i = 0; i < n; ++i) {
      physical_page<stream_type>& p = pages_[ids[i]];
      s.pages[first + i] = ids[i];
      p.mappings.push_back({&s, static_cast<std::uint32_t>(first + i)});
      if (p.mappings.size() == 2) {  // becomes shared: free (it was free where it was mapped)
        p.mappings.front().seg->shared_pages += 1;
        p.holder = nullptr;
        p.holds = 0;
        p.last_stream = p.mappings.front().seg->stream;
      }
      if (p.mappings.size() >= 2) s.shared_pages += 1;
    }
    s.mapped_pages += n;
  }

  /// Unmaps positions [first, first + n) of `s` in one call; their blocks are free, and the host
  /// waited for the work that used them (order_before_unmap). A page mapped nowhere any more is
  /// released; `released(page)` is called before, with the page's description.
  template <class OnRelease>
  void unmap(segment_type& s, std::size_t first, std::size_t n, OnRelease&& released) {
    const std::size_t page = s.page_size;
    device_.unmap(s.ptr + first * page, n * page);
    for (std::size_t i = first; i < first + n; ++i) {
      const page_id id = s.pages[i];
      physical_page<stream_type>& p = pages_[id];
      const std::size_t before = p.mappings.size();
      p.mappings.erase(std::find_if(p.mappings.begin(), p.mappings.end(),
                                    [&](const auto& m) { return m.seg == &s && m.index == i; }));
      if (before >= 2) s.shared_pages -= 1;
      if (before == 2) p.mappings.front().seg->shared_pages -= 1;  // no longer shared
      s.pages[i] = no_page;
      if (p.mappings.empty()) {
        released(static_cast<const physical_page<stream_type>&>(p));
        release(id);
      }
    }
    s.mapped_pages -= n;
  }

  /// Whether page `id` is mapped in range `s`.
  bool mapped_in(page_id id, const segment_type& s) const noexcept {
    for (const auto& m : pages_[id].mappings) {
      if (m.seg == &s) return true;
    }
    return false;
  }

  // --- holds and stream order
  // -----------------------------------------------------------------------

  /// Whether position i of `s` is a shared page that another range uses now.
  bool held_elsewhere(const segment_type& s, std::size_t i) const noexcept {
    const physical_page<stream_type>& p = pages_[s.pages[i]];
    return p.mappings.size() >= 2 && p.holds > 0 && p.holder != &s;
  }

  /// Whether the page at position i of `s` is counted there when every page is counted once: a
  /// page mapped once, where it is mapped; a shared page, where it is used, else where it was
  /// mapped first. False for an unmapped position.
  bool counted_at(const segment_type& s, std::size_t i) const noexcept {
    if (s.pages[i] == no_page) return false;
    const physical_page<stream_type>& p = pages_[s.pages[i]];
    if (p.mappings.size() < 2) return true;
    return p.holds > 0 ? p.holder == &s : p.mappings.front().seg == &s;
  }

  /// Whether page `id` is in use by no range (a page mapped once: its range says; this answers
  /// for shared pages).
  bool shared_and_free(page_id id) const noexcept {
    const physical_page<stream_type>& p = pages_[id];
    return p.mappings.size() >= 2 && p.holds == 0;
  }

  /// A block of `s` on `stream` now uses positions [first, last): the shared pages among them are
  /// held by `s`. `stream` waits on the GPU for the work of the streams that used them last.
  void hold(segment_type& s, std::size_t first, std::size_t last, stream_type stream) {
    waits_.clear();
    for (std::size_t i = first; i < last; ++i) {
      physical_page<stream_type>& p = pages_[s.pages[i]];
      if (p.mappings.size() < 2) continue;
      if (p.holds > 0 && p.holder != &s) {
        throw std::logic_error("gpumem invariant violated: a range uses a page another holds");
      }
      if (p.holds++ == 0) {
        p.holder = &s;
        if (!(p.last_stream == stream) &&
            std::find(waits_.begin(), waits_.end(), p.last_stream) == waits_.end()) {
          waits_.push_back(p.last_stream);
        }
        p.last_stream = stream;
      }
    }
    for (stream_type earlier : waits_) order_after(stream, earlier);
  }

  /// A block of `s` no longer uses positions [first, last). `freed(page)` is called for each
  /// shared page nobody uses any more (its other ranges may use it again).
  template <class OnFree>
  void release_hold(segment_type& s, std::size_t first, std::size_t last, OnFree&& freed) {
    for (std::size_t i = first; i < last; ++i) {
      const page_id id = s.pages[i];
      physical_page<stream_type>& p = pages_[id];
      if (p.mappings.size() < 2) continue;
      if (--p.holds == 0) {
        p.holder = nullptr;
        freed(id);
      }
    }
  }

  /// Whether a block of `s` on `stream` using positions [first, last) would make `stream` wait on
  /// the GPU for another stream (hold): a free shared page last used on another stream.
  bool would_order(const segment_type& s, std::size_t first, std::size_t last,
                   stream_type stream) const noexcept {
    for (std::size_t i = first; i < last; ++i) {
      const physical_page<stream_type>& p = pages_[s.pages[i]];
      if (p.mappings.size() >= 2 && p.holds == 0 && !(p.last_stream == stream)) return true;
    }
    return false;
  }

  /// Whether mapping page `id` (mapped elsewhere, free) in a range of `stream` would make that
  /// stream wait for another one when it uses the page.
  bool would_order(page_id id, stream_type stream) const noexcept {
    const physical_page<stream_type>& p = pages_[id];
    if (p.mappings.size() >= 2) return p.holds == 0 && !(p.last_stream == stream);
    return !(p.mappings.front().seg->stream == stream);
  }

  /// The devices granted access to every page besides the allocator's own (add_peer_access).
  bool has_peer(int device) const noexcept {
    return std::find(peers_.begin(), peers_.end(), device) != peers_.end();
  }
  void add_peer(int device) { peers_.push_back(device); }

  /// Makes the host wait for the work queued so far on each of `streams` (each at most once), as
  /// cuMemUnmap requires and does not do itself.
  void order_before_unmap(const std::vector<stream_type>& streams) {
    for (stream_type stream : streams) {
      const event_type e = event();
      device_.record_event(e, stream);
      device_.synchronize_event(e);
    }
  }

  // --- invariants
  // ---------------------------------------------------------------------------------------

  /// Checks the pages against the ranges: every mapping points back, shared counts and holders
  /// agree, byte totals add up. `ranges` visits every VMM range; `held(seg, index)` says how many
  /// allocated or pending blocks of `seg` touch that position. Throws std::logic_error.
  template <class ForEachRange, class Held>
  void check(ForEachRange&& ranges, Held&& held) const {
    auto fail = [](const std::string& what) {
      throw std::logic_error("gpumem invariant violated: " + what);
    };
    std::size_t live = 0;
    std::size_t small = 0;
    std::size_t large = 0;
    for (page_id id = 1; id < pages_.size(); ++id) {
      const physical_page<stream_type>& p = pages_[id];
      if (p.handle == 0) continue;
      ++live;
      (p.small ? small : large) += p.bytes;
      if (p.mappings.empty()) fail(fmt::format("page {} is mapped nowhere but not released", id));
      std::uint32_t holds = 0;
      std::size_t holders = 0;
      for (const auto& m : p.mappings) {
        if (m.seg->pages[m.index] != id) fail(fmt::format("page {} is not where it says", id));
        if (m.seg->page_size != p.bytes) fail(fmt::format("page {} has the wrong size", id));
        const std::size_t h = held(*m.seg, m.index);
        holds += static_cast<std::uint32_t>(h);
        if (h > 0) {
          ++holders;
          if (p.mappings.size() >= 2 && m.seg != p.holder) {
            fail(fmt::format("shared page {} is used by a range that does not hold it", id));
          }
        }
        for (const auto& other : p.mappings) {
          if (&other != &m && other.seg == m.seg)
            fail(fmt::format("page {} mapped twice in a range", id));
        }
      }
      if (holders > 1) fail(fmt::format("page {} is used by {} ranges at once", id, holders));
      if (p.mappings.size() >= 2 && (holds != p.holds || (p.holds == 0) != (p.holder == nullptr))) {
        fail(fmt::format("shared page {} counts {} holds, the blocks say {}", id, p.holds, holds));
      }
    }
    if (live != live_pages_ || small != live_small_bytes_ || large != live_large_bytes_) {
      fail("physical page totals disagree with the pages");
    }
    ranges([&](const segment_type& s) {
      std::size_t mapped = 0;
      std::size_t shared = 0;
      for (page_id id : s.pages) {
        if (id == no_page) continue;
        ++mapped;
        if (pages_[id].handle == 0) fail("a range maps a released page");
        if (pages_[id].mappings.size() >= 2) ++shared;
      }
      if (mapped != s.mapped_pages) fail("range's mapped page count is wrong");
      if (shared != s.shared_pages) fail("range's shared page count is wrong");
    });
  }

 private:
  event_type event() {
    if (events_.empty()) events_.push_back(device_.create_event());
    return events_.front();  // recording again is allowed once the previous use was consumed
  }

  // `later` waits on the GPU for the work queued so far on `earlier`.
  void order_after(stream_type later, stream_type earlier) {
    const event_type e = event();
    device_.record_event(e, earlier);
    device_.stream_wait_event(later, e);
  }

  Device& device_;
  std::vector<physical_page<stream_type>> pages_;  // by id; [0] is unused
  std::vector<page_id> free_ids_;
  std::size_t live_pages_ = 0;
  std::size_t live_small_bytes_ = 0;
  std::size_t live_large_bytes_ = 0;
  std::vector<event_type> events_;  // one event, reused: each use is consumed at once
  std::vector<stream_type> waits_;  // hold()'s scratch list
  std::vector<int> peers_;          // devices granted access besides the owner (add_peer)
};

// What a device without virtual memory management has of vmm_pages: nothing.
template <class Device>
struct no_vmm_pages {
  explicit no_vmm_pages(Device&) noexcept {}
};

/// The page mechanics of a caching allocator over `Device`.
template <class Device>
using pages_for =
    std::conditional_t<is_vmm_device_v<Device>, vmm_pages<Device>, no_vmm_pages<Device>>;

}  // namespace gpumem::detail
