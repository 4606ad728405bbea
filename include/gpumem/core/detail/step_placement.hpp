// gpumem — stitch's placement by the step before: a loop whose steps repeat (a training
// iteration, an inference batch of fixed shapes) makes the same requests in the same order every
// step. Once the allocator has seen the sequence of requests repeat for a whole period, each
// request is offered the address where the request one period earlier went (as STAlloc plans a
// training iteration from the ones before it): that memory is free at the same point of the step,
// on the same pages, so a step that follows the one before makes no device call and reserves
// nothing more, whatever couplings the first steps' page sharing made. The allocator takes the
// offer only where the block is free and usable; anything else is placed as usual.
//
// How the period is found, without any help from the program: each request is a key (its size and
// its pool, which is its stream and size class). At content-defined anchors (a hash of the last
// k_anchor_span keys with its low bits zero, so the same points of every step are anchors), the
// distance to the anchor's previous occurrence is a candidate period. A candidate is confirmed
// when the keys have matched the keys one candidate earlier for a whole period. Within a step,
// repeated layers give shorter candidates (the previous layer's); a step's unique parts (its
// start, the loss, the optimizer) give the step's own, and the longer candidate wins. Each request
// costs a hash and two ring writes; anchors, one lookup in a small table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <unordered_map>
#include <vector>

namespace gpumem::detail {

template <class Pool>
class step_placement {
 public:
  /// Where one request was placed: its block's pool, address and rounded size.
  struct placement {
    Pool* pool = nullptr;  // nullptr: not served by this allocator (OOM fallback)
    std::uintptr_t ptr = 0;
    // The free block it was cut from, as it was then: in a step that repeats the one before, the
    // same free block is there again, and the pool's index finds it by size and address.
    std::uintptr_t free_ptr = 0;
    std::size_t free_size = 0;
  };

  /// The longest period recognised, in requests (a step of more allocations is not planned).
  static constexpr std::size_t k_max_period = std::size_t{1} << 16;
  /// Requests whose keys make an anchor's hash.
  static constexpr std::size_t k_anchor_span = 16;

  /// `match`: how many requests in a row must equal the ones a candidate period earlier before
  /// placements are offered (stitch_step_match; 0: never).
  explicit step_placement(std::uint64_t match) noexcept : match_(match) {}

  /// Whether placements may be offered at all (stitch_step_match is not 0).
  bool enabled() const noexcept { return match_ != 0; }

  /// The next request: `size` bytes (rounded) on the stream of serial `stream`. Returns where the
  /// request one period before went when the period is confirmed and that request was the same,
  /// else nullptr. record() must follow, with where this one went.
  const placement* next(std::size_t size, std::size_t stream) {
    const std::uint64_t key =
        mix(static_cast<std::uint64_t>(size) ^ (static_cast<std::uint64_t>(stream) << 48));
    if (keys_.empty()) {  // the rings, on the first request (stitch only)
      keys_.resize(k_max_period);
      placed_.resize(k_max_period);
    }
    const std::uint64_t i = count_;
    keys_[slot(i)] = key;
    placed_[slot(i)] = placement{};
    ++count_;
    // The keys one period back: a whole period of matches confirms it.
    bool same = false;
    if (period_ != 0 && i >= period_) {
      same = keys_[slot(i - period_)] == key;
      run_ = same ? run_ + 1 : 0;
      if (!same && confirmed_ && ++strikes_ > period_ / 8) confirmed_ = false;
      if (run_ >= period_) {
        confirmed_ = true;
        strikes_ = 0;
      }
    }
    anchor(key, i);
    if (!same || (!confirmed_ && run_ < match_)) return nullptr;
    const placement& before = placed_[slot(i - period_)];
    return before.pool != nullptr ? &before : nullptr;
  }

  /// Where the request just offered by next() went.
  void record(const placement& where) noexcept { placed_[slot(count_ - 1)] = where; }

  /// The period found (requests per step; 0: none yet) and whether it is confirmed.
  std::size_t period() const noexcept { return period_; }
  bool confirmed() const noexcept { return confirmed_; }

 private:
  static std::size_t slot(std::uint64_t i) noexcept {
    return static_cast<std::size_t>(i & (k_max_period - 1));
  }

  static std::uint64_t mix(std::uint64_t x) noexcept {  // splitmix64's finaliser
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

  // Request i (its key just stored) may be an anchor: its span's hash, looked up and noted.
  void anchor(std::uint64_t key, std::uint64_t i) {
    span_hash_ = span_hash_ * k_base + key;
    if (i >= k_anchor_span) span_hash_ -= keys_[slot(i - k_anchor_span)] * base_power_;
    if (i + 1 < k_anchor_span || (span_hash_ >> 61) != 0) return;  // one request in eight
    auto [it, fresh] = anchors_.try_emplace(span_hash_, i);
    if (fresh) {
      if (anchors_.size() > k_max_period / 2) forget_old_anchors(i);
      return;
    }
    const std::uint64_t candidate = i - it->second;
    it->second = i;
    if (candidate == period_ || candidate >= k_max_period || candidate < k_anchor_span) return;
    // A longer candidate wins (a step's unique parts against its repeated layers); any candidate
    // replaces an unconfirmed period.
    if (candidate < period_ && (confirmed_ || run_ >= k_anchor_span)) return;
    period_ = static_cast<std::size_t>(candidate);
    confirmed_ = false;
    strikes_ = 0;
    run_ = 0;
    while (run_ < period_ && run_ < i + 1 - period_ &&
           keys_[slot(i - run_)] == keys_[slot(i - run_ - period_)]) {
      ++run_;
    }
    if (run_ >= period_) confirmed_ = true;
  }

  void forget_old_anchors(std::uint64_t i) {
    for (auto it = anchors_.begin(); it != anchors_.end();) {
      it = i - it->second >= k_max_period ? anchors_.erase(it) : std::next(it);
    }
  }

  static constexpr std::uint64_t k_base = 0x100000001b3ULL;
  static constexpr std::uint64_t power(std::uint64_t b, std::size_t n) {
    std::uint64_t r = 1;
    for (std::size_t k = 0; k < n; ++k) r *= b;
    return r;
  }
  static constexpr std::uint64_t base_power_ = power(k_base, k_anchor_span);

  std::vector<std::uint64_t> keys_;                           // ring: request i's key at slot(i)
  std::vector<placement> placed_;                             // ring: where request i went
  std::unordered_map<std::uint64_t, std::uint64_t> anchors_;  // span hash -> last request index
  std::uint64_t count_ = 0;                                   // requests seen
  std::uint64_t span_hash_ = 0;
  std::size_t period_ = 0;
  std::size_t run_ = 0;      // consecutive requests that matched the one a period before
  std::size_t strikes_ = 0;  // mismatches since the period was last confirmed
  std::uint64_t match_;
  bool confirmed_ = false;
};

}  // namespace gpumem::detail
