// gpumem — the free-block index of one pool: exact best fit in O(1) class lookups.
//
// Free blocks are grouped in size classes (two-level segregated fit): below 1 MiB one class per
// 512 B granule, above it 64 classes per power of two. Two levels of bitmaps find the first
// non-empty class at or above a size with two bit scans. Within a class, blocks sit in a treap
// ordered by (size, address), so the index returns exactly what PyTorch's ordered set returns:
// the smallest block that fits, the lowest address among equals. Classes hold blocks of nearly
// the same size, so the treaps are tiny and the lookups are effectively constant time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpumem/core/detail/block.hpp"
#include "gpumem/detail/bits.hpp"

namespace gpumem::detail {

template <class Stream>
class free_block_index {
 public:
  using block_type = block<Stream>;

  static constexpr std::size_t k_exact_classes = 2048;  // 512 B granules below 1 MiB
  static constexpr unsigned k_sub_bits = 6;             // 64 classes per power of two above
  static constexpr std::size_t k_num_classes = k_exact_classes + (64 - 20) * (1u << k_sub_bits);
  static constexpr std::size_t k_num_words = (k_num_classes + 63) / 64;

  static std::size_t class_of(std::size_t size) noexcept {
    if (size < (std::size_t{1} << 20)) return size >> 9;
    const unsigned level = 63u - static_cast<unsigned>(__builtin_clzll(size));
    const std::size_t sub = (size >> (level - k_sub_bits)) & ((1u << k_sub_bits) - 1);
    return k_exact_classes + (level - 20) * (std::size_t{1} << k_sub_bits) + sub;
  }

  // Counts are derived by walking the index (O(blocks)): they are read on cold paths only (the
  // OOM report, summaries, invariant checks), so the hot path does not maintain them.
  bool empty() const noexcept { return next_class(0) == k_num_classes; }
  std::size_t size() const noexcept {
    std::size_t n = 0;
    for_each([&](const block_type*) { ++n; });
    return n;
  }
  std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for_each([&](const block_type* b) { n += b->size; });
    return n;
  }

  GPUMEM_ALWAYS_INLINE void insert(block_type* b) noexcept {
    const std::size_t c = class_of(b->size);
    b->size_class = static_cast<std::uint32_t>(c);
    b->left = b->right = nullptr;
    b->priority = priority_of(b->ptr);
    roots_[c] = treap_insert(roots_[c], b);
    set_bit(c);
    b->indexed = true;
  }

  GPUMEM_ALWAYS_INLINE void erase(block_type* b) noexcept {
    const std::size_t c = b->size_class;
    roots_[c] = treap_erase(roots_[c], b);
    if (roots_[c] == nullptr) clear_bit(c);
    b->indexed = false;
    b->left = b->right = nullptr;
  }

  /// The smallest block with size >= `size` (lowest address among equals), or nullptr.
  GPUMEM_ALWAYS_INLINE block_type* lower_bound(std::size_t size) const noexcept {
    std::size_t c = class_of(size);
    if (block_type* b = treap_lower_bound(roots_[c], size)) return b;
    c = next_class(c + 1);
    return c < k_num_classes ? treap_min(roots_[c]) : nullptr;
  }

  /// The indexed block of exactly `size` bytes at `address`, or nullptr.
  block_type* find(std::size_t size, std::uintptr_t address) const noexcept {
    if (size == 0) return nullptr;
    for (block_type* t = roots_[class_of(size)]; t != nullptr;) {
      if (t->size == size && t->ptr == address) return t;
      const bool go_left = size != t->size ? size < t->size : address < t->ptr;
      t = go_left ? t->left : t->right;
    }
    return nullptr;
  }

  /// The block after indexed block `b` in (size, address) order, or nullptr.
  block_type* next(const block_type* b) const noexcept {
    block_type* after = nullptr;
    for (block_type* t = roots_[b->size_class]; t != nullptr;) {
      if (less(b, t)) {
        after = t;
        t = t->left;
      } else {
        t = t->right;
      }
    }
    if (after != nullptr) return after;
    const std::size_t c = next_class(std::size_t{b->size_class} + 1);
    return c < k_num_classes ? treap_min(roots_[c]) : nullptr;
  }

  /// The largest free block (highest address among equals), or nullptr.
  block_type* largest() const noexcept {
    for (std::size_t w = k_num_words; w-- > 0;) {
      if (words_[w] != 0) {
        const std::size_t c = w * 64 + (63u - static_cast<unsigned>(__builtin_clzll(words_[w])));
        return treap_max(roots_[c]);
      }
    }
    return nullptr;
  }

  /// Visits every block in (size, address) order. The visitor must not modify the index.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t c = next_class(0); c < k_num_classes; c = next_class(c + 1)) {
      in_order(roots_[c], f);
    }
  }

  /// Checks the index's own structure: the summary bitmap agrees with the class bitmap, each
  /// marked class holds blocks, each block is marked indexed in the class its size gives, in
  /// (size, address) order within its treap and below its parent's priority. O(blocks + words);
  /// throws std::logic_error. (A treap whose bit is clear is unreachable: its blocks are marked
  /// indexed but missing from size(), which the allocator's checker compares with its blocks.)
  void check() const {
    auto fail = [](const std::string& what) {
      throw std::logic_error("gpumem invariant violated: free index: " + what);
    };
    for (std::size_t w = 0; w < k_num_words; ++w) {
      if ((words_[w] != 0) != ((summary_[w / 64] >> (w % 64) & 1u) != 0)) {
        fail("the summary bitmap disagrees with a word");
      }
    }
    for (std::size_t c = next_class(0); c < k_num_classes; c = next_class(c + 1)) {
      if (roots_[c] == nullptr) fail("a marked class holds no block");
      const block_type* previous = nullptr;
      auto visit = [&](const block_type* b) {
        if (!b->indexed || b->size_class != c || class_of(b->size) != c) {
          fail("a block is not marked indexed in the class of its size");
        }
        if (previous != nullptr && !less(previous, b)) {
          fail("a treap is out of (size, address) order");
        }
        for (const block_type* child : {b->left, b->right}) {
          if (child != nullptr && child->priority > b->priority) {
            fail("a treap's heap order is broken");
          }
        }
        previous = b;
      };
      in_order(roots_[c], visit);
    }
  }

 private:
  // Treap priorities only need to look random with respect to key order: one multiplication of
  // the address (Fibonacci hashing) does, and keeps results deterministic.
  static std::uint64_t priority_of(std::uintptr_t p) noexcept {
    return (static_cast<std::uint64_t>(p) >> 9) * 0x9e3779b97f4a7c15ull;
  }
  static bool less(const block_type* a, const block_type* b) noexcept {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
  }

  // The treap operations are iterative (links to the child pointers being rewritten): the treaps
  // are tiny, so call overhead would dominate a recursive version.
  static block_type* treap_insert(block_type* root, block_type* n) noexcept {
    block_type** link = &root;
    while (*link != nullptr && (*link)->priority >= n->priority) {
      link = less(n, *link) ? &(*link)->left : &(*link)->right;
    }
    // Split the subtree at *link around n: smaller keys go left of n, larger right.
    block_type** lo = &n->left;
    block_type** hi = &n->right;
    for (block_type* t = *link; t != nullptr;) {
      if (less(t, n)) {
        *lo = t;
        lo = &t->right;
        t = t->right;
      } else {
        *hi = t;
        hi = &t->left;
        t = t->left;
      }
    }
    *lo = *hi = nullptr;
    *link = n;
    return root;
  }
  static block_type* treap_erase(block_type* root, block_type* n) noexcept {
    block_type** link = &root;
    while (*link != n) link = less(n, *link) ? &(*link)->left : &(*link)->right;
    // Merge n's subtrees into its place, higher priority on top.
    block_type* a = n->left;
    block_type* b = n->right;
    while (a != nullptr && b != nullptr) {
      if (a->priority > b->priority) {
        *link = a;
        link = &a->right;
        a = a->right;
      } else {
        *link = b;
        link = &b->left;
        b = b->left;
      }
    }
    *link = a != nullptr ? a : b;
    return root;
  }
  static block_type* treap_lower_bound(block_type* t, std::size_t size) noexcept {
    block_type* best = nullptr;
    while (t != nullptr) {
      if (t->size >= size) {
        best = t;
        t = t->left;
      } else {
        t = t->right;
      }
    }
    return best;
  }
  static block_type* treap_min(block_type* t) noexcept {
    while (t != nullptr && t->left != nullptr) t = t->left;
    return t;
  }
  static block_type* treap_max(block_type* t) noexcept {
    while (t != nullptr && t->right != nullptr) t = t->right;
    return t;
  }
  template <class F>
  static void in_order(block_type* t, F& f) {
    if (t == nullptr) return;
    in_order(t->left, f);
    f(t);
    in_order(t->right, f);
  }

  void set_bit(std::size_t c) noexcept {
    words_[c / 64] |= std::uint64_t{1} << (c % 64);
    summary_[c / 4096] |= std::uint64_t{1} << ((c / 64) % 64);
  }
  void clear_bit(std::size_t c) noexcept {
    std::uint64_t& w = words_[c / 64];
    w &= ~(std::uint64_t{1} << (c % 64));
    if (w == 0) summary_[c / 4096] &= ~(std::uint64_t{1} << ((c / 64) % 64));
  }
  // First non-empty class >= c, or k_num_classes.
  std::size_t next_class(std::size_t c) const noexcept {
    if (c >= k_num_classes) return k_num_classes;
    std::size_t w = c / 64;
    const std::uint64_t in_word = words_[w] & (~std::uint64_t{0} << (c % 64));
    if (in_word != 0) return w * 64 + static_cast<std::size_t>(__builtin_ctzll(in_word));
    if (++w >= k_num_words) return k_num_classes;
    std::size_t s = w / 64;
    std::uint64_t bits = summary_[s] & (~std::uint64_t{0} << (w % 64));
    while (bits == 0) {
      if (++s >= summary_.size()) return k_num_classes;
      bits = summary_[s];
    }
    const std::size_t word = s * 64 + static_cast<std::size_t>(__builtin_ctzll(bits));
    return word * 64 + static_cast<std::size_t>(__builtin_ctzll(words_[word]));
  }

  std::array<block_type*, k_num_classes> roots_{};
  std::array<std::uint64_t, k_num_words> words_{};
  std::array<std::uint64_t, (k_num_words + 63) / 64> summary_{};
};

}  // namespace gpumem::detail
