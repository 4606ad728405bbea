// gpumem — blocks and segments of the caching allocator, and the slab they live in.
//
// Segment, block and their states (allocated, pending, free; mapped, shadowed) are defined in
// docs/architecture.md, "Vocabulary".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace gpumem::detail {

template <class Stream>
struct pool;

template <class Stream>
struct segment;

template <class Stream>
struct block {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;  // the caller's size before rounding; a free block keeps it
  block* prev = nullptr;           // address-order neighbours within the segment
  block* next = nullptr;
  block* left = nullptr;  // free-index treap links (only while indexed)
  block* right = nullptr;
  std::uint64_t priority = 0;       // treap priority, fixed while indexed
  std::uint64_t gc_count_base = 0;  // pool's free-block-lookup counter when the block became free
  std::uint64_t freed_at = 0;       // stitch: allocations made when it last became free (LRU)
  pool<Stream>* owner = nullptr;    // its pool: a stream's small, large or stitch class pool
  segment<Stream>* seg = nullptr;
  std::vector<Stream> stream_uses;  // streams recorded with record_stream (rarely non-empty)
  std::uint32_t event_count = 0;    // outstanding events before the block may be reused
  std::uint32_t size_class = 0;     // free-index class, set while indexed
  bool allocated = false;
  bool indexed = false;  // in its pool's free index
  bool mapped = true;    // false: a page-aligned range of a VMM segment with no physical memory
  // Stitch: a page-aligned free range of mapped pages that another range holds (vmm_pages.hpp):
  // not indexed, unusable until they are free again.
  bool shadowed = false;

  block() = default;
  block(std::uintptr_t p, std::size_t s, pool<Stream>* o, segment<Stream>* sg) noexcept
      : ptr(p), size(s), owner(o), seg(sg) {}

  bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
};

template <class Stream>
struct segment {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  block<Stream>* head = nullptr;  // lowest-address block
  pool<Stream>* owner = nullptr;
  Stream stream{};  // the stream of the pool it belongs to
  // VMM segments (expandable and stitch policies): a reserved address range whose positions of
  // page_size bytes are each mapped to one physical page; pages[i] is the page (vmm_pages.hpp's
  // id) at ptr + i * page_size, 0 = none.
  std::size_t page_size = 0;  // 0: a classic segment (one cudaMalloc)
  std::vector<std::uint32_t> pages;
  std::size_t mapped_pages = 0;
  std::size_t shared_pages = 0;  // positions whose page is mapped in other ranges too (stitch)
  segment* prev = nullptr;       // all segments of the allocator, in creation order
  segment* next = nullptr;
};

/// Fixed-size object storage that recycles freed objects: after warm-up, create() and destroy()
/// make no heap allocation (the hot path splits and merges blocks without calling malloc).
template <class T>
class object_pool {
 public:
  object_pool() = default;
  object_pool(const object_pool&) = delete;
  object_pool& operator=(const object_pool&) = delete;
  ~object_pool() {
    for (void* memory : chunks_) ::operator delete (memory, std::align_val_t{alignof(T)});
  }

  template <class... Args>
  T* create(Args&&... args) {
    if (free_ == nullptr) grow();
    slot* s = free_;
    free_ = s->next;
    return new (static_cast<void*>(s)) T(std::forward<Args>(args)...);
  }

  void destroy(T* t) noexcept {
    t->~T();
    slot* s = reinterpret_cast<slot*>(t);
    s->next = free_;
    free_ = s;
  }

 private:
  union slot {
    slot* next;
    alignas(T) unsigned char storage[sizeof(T)];
  };
  void grow() {
    const std::size_t count = chunks_.empty() ? 64 : 256;
    void* memory = ::operator new (count * sizeof(slot), std::align_val_t{alignof(T)});
    chunks_.push_back(memory);
    slot* slots = static_cast<slot*>(memory);
    for (std::size_t i = count; i-- > 0;) {
      slots[i].next = free_;
      free_ = &slots[i];
    }
  }

  std::vector<void*> chunks_;  // slabs of `slot`s, released at destruction
  slot* free_ = nullptr;
};

}  // namespace gpumem::detail
