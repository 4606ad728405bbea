// Test helper: timing two workloads against each other on a loaded machine (the scaling tests of
// the pickle and snapshot readers).
#pragma once

#include <algorithm>
#include <ctime>
#include <utility>

namespace gpumem_test {

// The best processor times of `small` and of `large`, in seconds, over `runs` runs of each taken
// in turn: processor time, and the best, so that other work on a loaded machine adds little; in
// turn, so that both see the same load.
template <class F, class G>
std::pair<double, double> best_seconds(int runs, F&& small, G&& large) {
  const auto seconds = [](auto&& f) {
    const std::clock_t t0 = std::clock();
    f();
    return static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC;
  };
  std::pair<double, double> best{1e30, 1e30};
  for (int i = 0; i < runs; ++i) {
    best.first = std::min(best.first, seconds(small));
    best.second = std::min(best.second, seconds(large));
  }
  return best;
}

}  // namespace gpumem_test
