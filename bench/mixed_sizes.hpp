// The size distribution of the hot-path benchmarks' `mixed` case, shared by gpumem_bench_hot_path
// and gpumem_bench_compare so that both race on the same stream of requests.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

namespace gpumem_bench {

/// Number of sizes in mixed_sizes() (a power of two: callers index with `i & (count - 1)`).
inline constexpr std::size_t mixed_count = 4096;

/// A mixed stream: mostly small and medium tensors, some large, as in a training step. 3/8 up to
/// 4 KiB, 2/8 up to 1 MiB, 2/8 up to 17 MiB, 1/8 up to 272 MiB; the same 4,096 sizes every run.
inline const std::vector<std::size_t>& mixed_sizes() {
  static const std::vector<std::size_t> sizes = [] {
    std::mt19937_64 rng(1);
    std::vector<std::size_t> s(mixed_count);
    for (auto& v : s) {
      switch (rng() % 8) {
        case 0:
        case 1:
        case 2:
          v = 1 + rng() % 4096;
          break;
        case 3:
        case 4:
          v = 4096 + rng() % (1u << 20);
          break;
        case 5:
        case 6:
          v = (1u << 20) + rng() % (16u << 20);
          break;
        default:
          v = (16u << 20) + rng() % (256u << 20);
          break;
      }
    }
    return s;
  }();
  return sizes;
}

}  // namespace gpumem_bench
