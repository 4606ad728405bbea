// gpumem — SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the TCP rendezvous's handshake:
// each side proves it knows the job's token without sending it. Small and dependency-free on
// purpose (no OpenSSL in a header-only library); speed is irrelevant for a few hundred bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::nccl::detail {

using sha256_digest = std::array<unsigned char, 32>;

/// Incremental SHA-256. Thread safety: one object per thread.
class sha256 {
 public:
  sha256() noexcept = default;

  void update(const void* data, std::size_t size) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    length_ += size;
    while (size > 0) {
      const std::size_t take = size < 64 - used_ ? size : 64 - used_;
      for (std::size_t i = 0; i < take; ++i) block_[used_ + i] = p[i];
      used_ += take;
      p += take;
      size -= take;
      if (used_ == 64) {
        compress();
        used_ = 0;
      }
    }
  }
  void update(const std::string& s) noexcept { update(s.data(), s.size()); }

  /// The digest of everything passed to update; the object must not be used afterwards.
  sha256_digest finish() noexcept {
    const std::uint64_t bits = static_cast<std::uint64_t>(length_) * 8;
    const unsigned char one = 0x80;
    update(&one, 1);
    const unsigned char zero = 0;
    while (used_ != 56) update(&zero, 1);
    unsigned char be[8];
    for (int i = 0; i < 8; ++i) be[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(be, 8);
    sha256_digest out{};
    for (std::size_t i = 0; i < 8; ++i) {
      for (std::size_t j = 0; j < 4; ++j) {
        out[4 * i + j] = static_cast<unsigned char>(state_[i] >> (24 - 8 * j));
      }
    }
    return out;
  }

 private:
  static std::uint32_t rotr(std::uint32_t x, int n) noexcept { return (x >> n) | (x << (32 - n)); }

  void compress() noexcept {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    std::uint32_t w[64];
    for (std::size_t i = 0; i < 16; ++i) {
      w[i] = static_cast<std::uint32_t>(block_[4 * i]) << 24 |
             static_cast<std::uint32_t>(block_[4 * i + 1]) << 16 |
             static_cast<std::uint32_t>(block_[4 * i + 2]) << 8 |
             static_cast<std::uint32_t>(block_[4 * i + 3]);
    }
    for (std::size_t i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    std::uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (std::size_t i = 0; i < 64; ++i) {
      const std::uint32_t t1 =
          h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const std::uint32_t t2 =
          (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state_[0] += a;
    state_[1] += b;
    state_[2] += c;
    state_[3] += d;
    state_[4] += e;
    state_[5] += f;
    state_[6] += g;
    state_[7] += h;
  }

  std::uint32_t state_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                             0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  unsigned char block_[64] = {};
  std::size_t used_ = 0;
  std::size_t length_ = 0;
};

/// HMAC-SHA-256 with `key` (any length, empty allowed). Thread safety: one object per thread.
class hmac_sha256 {
 public:
  explicit hmac_sha256(const std::string& key) noexcept {
    unsigned char k[64] = {};
    if (key.size() > 64) {
      sha256 h;
      h.update(key);
      const sha256_digest d = h.finish();
      for (std::size_t i = 0; i < d.size(); ++i) k[i] = d[i];
    } else {
      for (std::size_t i = 0; i < key.size(); ++i) k[i] = static_cast<unsigned char>(key[i]);
    }
    unsigned char pad[64];
    for (std::size_t i = 0; i < 64; ++i) pad[i] = static_cast<unsigned char>(k[i] ^ 0x36);
    inner_.update(pad, 64);
    for (std::size_t i = 0; i < 64; ++i) pad[i] = static_cast<unsigned char>(k[i] ^ 0x5c);
    outer_.update(pad, 64);
  }
  void update(const void* data, std::size_t size) noexcept { inner_.update(data, size); }
  void update(const std::string& s) noexcept { inner_.update(s); }
  sha256_digest finish() noexcept {
    const sha256_digest inner = inner_.finish();
    outer_.update(inner.data(), inner.size());
    return outer_.finish();
  }

 private:
  sha256 inner_;
  sha256 outer_;
};

/// Compares two digests in time independent of where they differ (no timing hint to a guesser).
inline bool digests_equal(const unsigned char* a, const unsigned char* b) noexcept {
  unsigned char diff = 0;
  for (std::size_t i = 0; i < sizeof(sha256_digest); ++i)
    diff = static_cast<unsigned char>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

}  // namespace gpumem::nccl::detail
