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

#include "gpumem/core/detail/block.hpp"

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

  bool empty() const noexcept { return count_ == 0; }
  std::size_t size() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }

  void insert(block_type* b) noexcept {
    const std::size_t c = class_of(b->size);
    b->left = b->right = nullptr;
    b->priority = mix(b->ptr);
    roots_[c] = treap_insert(roots_[c], b);
    set_bit(c);
    b->indexed = true;
    ++count_;
    bytes_ += b->size;
  }

  void erase(block_type* b) noexcept {
    const std::size_t c = class_of(b->size);
    roots_[c] = treap_erase(roots_[c], b);
    if (roots_[c] == nullptr) clear_bit(c);
    b->indexed = false;
    b->left = b->right = nullptr;
    --count_;
    bytes_ -= b->size;
  }

  /// The smallest block with size >= `size` (lowest address among equals), or nullptr.
  block_type* lower_bound(std::size_t size) const noexcept {
    std::size_t c = class_of(size);
    if (block_type* b = treap_lower_bound(roots_[c], size)) return b;
    c = next_class(c + 1);
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

 private:
  static std::uint64_t mix(std::uintptr_t p) noexcept {
    std::uint64_t x = static_cast<std::uint64_t>(p) + 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  static bool less(const block_type* a, const block_type* b) noexcept {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
  }

  static block_type* treap_merge(block_type* a, block_type* b) noexcept {
    if (a == nullptr) return b;
    if (b == nullptr) return a;
    if (a->priority > b->priority) {
      a->right = treap_merge(a->right, b);
      return a;
    }
    b->left = treap_merge(a, b->left);
    return b;
  }
  // Splits t into keys < k and keys >= k.
  static void treap_split(block_type* t, const block_type* k, block_type*& lo,
                          block_type*& hi) noexcept {
    if (t == nullptr) {
      lo = hi = nullptr;
    } else if (less(t, k)) {
      treap_split(t->right, k, t->right, hi);
      lo = t;
    } else {
      treap_split(t->left, k, lo, t->left);
      hi = t;
    }
  }
  static block_type* treap_insert(block_type* t, block_type* n) noexcept {
    if (t == nullptr) return n;
    if (n->priority > t->priority) {
      treap_split(t, n, n->left, n->right);
      return n;
    }
    if (less(n, t)) {
      t->left = treap_insert(t->left, n);
    } else {
      t->right = treap_insert(t->right, n);
    }
    return t;
  }
  static block_type* treap_erase(block_type* t, block_type* n) noexcept {
    if (t == n) return treap_merge(t->left, t->right);
    if (less(n, t)) {
      t->left = treap_erase(t->left, n);
    } else {
      t->right = treap_erase(t->right, n);
    }
    return t;
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
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace gpumem::detail
