// gpumem — the free address ranges of the simulated device's fake address space.
//
// A set of disjoint free ranges [start, start + len) with lowest-address first-fit allocation and
// coalescing on release. Stored as a treap keyed by start address and augmented with the largest
// length in each subtree, so "the lowest range of at least n bytes" is one O(log n) descent; this
// keeps millions of allocate/free pairs fast however fragmented the space becomes. Priorities come
// from a fixed hash sequence, so the structure (and every address handed out) is deterministic.
// Nodes live in one vector and are recycled through a free list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace gpumem::detail {

/// Thread safety: none (the simulated device serialises access). Never dereferences addresses.
class free_ranges {
 public:
  free_ranges() { nodes_.emplace_back(); }  // index 0 is the null sentinel (max_len 0)

  /// Forgets everything and makes [base, base + size) one free range. Throws std::bad_alloc.
  void reset(std::uintptr_t base, std::size_t size) {
    nodes_.clear();
    nodes_.emplace_back();
    free_nodes_.clear();
    root_ = 0;
    free_bytes_ = 0;
    ranges_ = 0;
    if (size != 0) insert(base, size);
    free_bytes_ = size;
  }

  /// Takes `size` bytes (> 0) at the lowest address that is a multiple of `alignment` (a power of
  /// two) inside a free range. Returns 0 when no free range can hold them. Throws std::bad_alloc.
  std::uintptr_t take(std::size_t size, std::size_t alignment) {
    std::uintptr_t from = 0;
    for (;;) {
      const std::uint32_t c = find_first(root_, size, from);
      if (c == 0) return 0;
      const std::uintptr_t start = nodes_[c].start;
      const std::size_t len = nodes_[c].len;
      const std::uintptr_t aligned = (start + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
      if (aligned >= start && aligned - start <= len - size) {
        make_room();
        erase(start);
        if (aligned > start) insert(start, aligned - start);
        const std::uintptr_t end = aligned + size;
        if (end < start + len) insert(end, start + len - end);
        free_bytes_ -= size;
        return aligned;
      }
      // Long enough but not once aligned (rare): look further right.
      from = start + 1;
    }
  }

  /// Returns [start, start + size) (which must be in use) and merges it with free neighbours.
  /// Throws std::logic_error if the range overlaps a free one (a bug in the caller's bookkeeping),
  /// std::bad_alloc.
  void give_back(std::uintptr_t start, std::size_t size) {
    if (size == 0) return;
    make_room();
    std::uintptr_t new_start = start;
    std::size_t new_len = size;
    const std::uint32_t p = last_below(start);
    const std::uint32_t q = first_at_or_above(start);
    if ((p != 0 && nodes_[p].start + nodes_[p].len > start) ||
        (q != 0 && start + size > nodes_[q].start)) {
      throw std::logic_error("gpumem::detail::free_ranges: returned range overlaps a free range");
    }
    if (q != 0 && start + size == nodes_[q].start) {
      new_len += nodes_[q].len;
      erase(nodes_[q].start);
    }
    if (p != 0 && nodes_[p].start + nodes_[p].len == start) {
      new_start = nodes_[p].start;
      new_len += nodes_[p].len;
      erase(nodes_[p].start);
    }
    insert(new_start, new_len);
    free_bytes_ += size;
  }

  /// Total free bytes. Never throws.
  std::size_t free_bytes() const noexcept { return free_bytes_; }
  /// Number of disjoint free ranges. Never throws.
  std::size_t range_count() const noexcept { return ranges_; }
  /// Length of the largest free range. Never throws.
  std::size_t largest() const noexcept { return nodes_[root_].max_len; }

  /// Calls f(start, len) for every free range in address order (tests, diagnostics).
  template <class F>
  void for_each(F&& f) const {
    visit(root_, f);
  }

 private:
  struct node {
    std::uintptr_t start = 0;
    std::size_t len = 0;
    std::size_t max_len = 0;  // largest len in this subtree
    std::uint32_t priority = 0;
    std::uint32_t left = 0;
    std::uint32_t right = 0;
  };

  template <class F>
  void visit(std::uint32_t t, F& f) const {
    if (t == 0) return;
    visit(nodes_[t].left, f);
    f(nodes_[t].start, nodes_[t].len);
    visit(nodes_[t].right, f);
  }

  void update(std::uint32_t t) noexcept {
    node& n = nodes_[t];
    std::size_t m = n.len;
    if (nodes_[n.left].max_len > m) m = nodes_[n.left].max_len;
    if (nodes_[n.right].max_len > m) m = nodes_[n.right].max_len;
    n.max_len = m;
  }

  // Splits t into keys < key (l) and keys >= key (r).
  void split(std::uint32_t t, std::uintptr_t key, std::uint32_t& l, std::uint32_t& r) noexcept {
    if (t == 0) {
      l = r = 0;
      return;
    }
    if (nodes_[t].start < key) {
      split(nodes_[t].right, key, nodes_[t].right, r);
      l = t;
    } else {
      split(nodes_[t].left, key, l, nodes_[t].left);
      r = t;
    }
    update(t);
  }

  std::uint32_t merge(std::uint32_t l, std::uint32_t r) noexcept {
    if (l == 0) return r;
    if (r == 0) return l;
    if (nodes_[l].priority > nodes_[r].priority) {
      const std::uint32_t m = merge(nodes_[l].right, r);
      nodes_[l].right = m;
      update(l);
      return l;
    }
    const std::uint32_t m = merge(l, nodes_[r].left);
    nodes_[r].left = m;
    update(r);
    return r;
  }

  void insert(std::uintptr_t start, std::size_t len) {
    std::uint32_t idx = 0;
    if (!free_nodes_.empty()) {
      idx = free_nodes_.back();
      free_nodes_.pop_back();
    } else {
      idx = static_cast<std::uint32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    node& n = nodes_[idx];
    n.start = start;
    n.len = len;
    n.max_len = len;
    n.priority = next_priority();
    n.left = n.right = 0;
    std::uint32_t l = 0;
    std::uint32_t r = 0;
    split(root_, start, l, r);
    root_ = merge(merge(l, idx), r);
    ++ranges_;
  }

  void erase(std::uintptr_t start) {
    std::uint32_t l = 0;
    std::uint32_t rest = 0;
    std::uint32_t m = 0;
    std::uint32_t r = 0;
    split(root_, start, l, rest);
    split(rest, start + 1, m, r);
    root_ = merge(l, r);
    if (m != 0) {
      free_nodes_.push_back(m);  // never reallocates: make_room() ran first
      --ranges_;
    }
  }

  // Grows the node storage before a change, so that the erase/insert sequence of one change can
  // never fail half-way with std::bad_alloc (which would lose a range).
  void make_room() {
    if (nodes_.capacity() < nodes_.size() + 2) nodes_.reserve(2 * nodes_.capacity() + 2);
    if (free_nodes_.capacity() < free_nodes_.size() + 2) {
      free_nodes_.reserve(2 * free_nodes_.capacity() + 2);
    }
  }

  // Lowest-start node with len >= need and start >= from.
  std::uint32_t find_first(std::uint32_t t, std::size_t need, std::uintptr_t from) const noexcept {
    if (t == 0 || nodes_[t].max_len < need) return 0;
    const node& n = nodes_[t];
    if (n.start < from) return find_first(n.right, need, from);
    if (const std::uint32_t l = find_first(n.left, need, from)) return l;
    if (n.len >= need) return t;
    return find_first(n.right, need, from);
  }

  std::uint32_t last_below(std::uintptr_t key) const noexcept {
    std::uint32_t t = root_;
    std::uint32_t best = 0;
    while (t != 0) {
      if (nodes_[t].start < key) {
        best = t;
        t = nodes_[t].right;
      } else {
        t = nodes_[t].left;
      }
    }
    return best;
  }

  std::uint32_t first_at_or_above(std::uintptr_t key) const noexcept {
    std::uint32_t t = root_;
    std::uint32_t best = 0;
    while (t != 0) {
      if (nodes_[t].start >= key) {
        best = t;
        t = nodes_[t].left;
      } else {
        t = nodes_[t].right;
      }
    }
    return best;
  }

  // splitmix64 of a counter: deterministic, well-mixed priorities.
  std::uint32_t next_priority() noexcept {
    std::uint64_t z = (priority_state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return static_cast<std::uint32_t>((z ^ (z >> 31)) >> 32);
  }

  std::vector<node> nodes_;
  std::vector<std::uint32_t> free_nodes_;
  std::uint32_t root_ = 0;
  std::size_t free_bytes_ = 0;
  std::size_t ranges_ = 0;
  std::uint64_t priority_state_ = 0;
};

}  // namespace gpumem::detail
