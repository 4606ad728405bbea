// gpumem — pointer -> block map for allocated blocks: open addressing, linear probing,
// backward-shift deletion. Lookups and updates touch one or two cache lines and never allocate;
// the table only grows (doubling) when it passes half full, which happens while the live set
// grows, not in steady state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpumem::detail {

template <class Value>
class pointer_map {
 public:
  explicit pointer_map(std::size_t initial_capacity = 1024) { rehash(initial_capacity); }

  std::size_t size() const noexcept { return size_; }

  /// Inserts key -> value; the key must not be present.
  void insert(std::uintptr_t key, Value* value) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    place(key, value);
    ++size_;
  }

  Value* find(std::uintptr_t key) const noexcept {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const slot& s = slots_[i];
      if (s.value == nullptr) return nullptr;
      if (s.key == key) return s.value;
    }
  }

  /// Removes key; returns its value, or nullptr when absent.
  Value* erase(std::uintptr_t key) noexcept {
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].value == nullptr) return nullptr;
      if (slots_[i].key == key) break;
    }
    Value* found = slots_[i].value;
    // Backward-shift: pull later entries of the probe run into the hole so lookups stay correct.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; slots_[j].value != nullptr; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].key);
      const bool movable = (hole <= j) ? (h <= hole || h > j) : (h <= hole && h > j);
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = slot{};
    --size_;
    return found;
  }

  template <class F>
  void for_each(F&& f) const {
    for (const slot& s : slots_) {
      if (s.value != nullptr) f(s.key, s.value);
    }
  }

  void clear() noexcept {
    for (slot& s : slots_) s = slot{};
    size_ = 0;
  }

 private:
  struct slot {
    std::uintptr_t key = 0;
    Value* value = nullptr;
  };

  std::size_t home(std::uintptr_t key) const noexcept {
    // Block addresses are multiples of 512: drop those bits, then multiplicative hashing.
    return static_cast<std::size_t>(
        ((static_cast<std::uint64_t>(key) >> 9) * 0x9e3779b97f4a7c15ull) >> shift_);
  }

  void place(std::uintptr_t key, Value* value) noexcept {
    std::size_t i = home(key);
    while (slots_[i].value != nullptr) i = (i + 1) & mask_;
    slots_[i] = slot{key, value};
  }

  void rehash(std::size_t capacity) {
    std::size_t cap = 16;
    while (cap < capacity) cap *= 2;
    std::vector<slot> old = std::move(slots_);
    slots_.assign(cap, slot{});
    mask_ = cap - 1;
    shift_ = 64u - static_cast<unsigned>(__builtin_ctzll(cap));
    for (const slot& s : old) {
      if (s.value != nullptr) place(s.key, s.value);
    }
  }

  std::vector<slot> slots_;
  std::size_t size_ = 0;
  std::size_t mask_ = 0;
  unsigned shift_ = 0;
};

}  // namespace gpumem::detail
