// Test helper: cached memory that is free but split, the pattern stitch shares instead of
// creating pages for.
#pragma once

#include <vector>

#include "sim.hpp"

namespace gpumem_test {

// Ten 20 MiB segments, each pinned by one 1.5 MiB block: 185 MiB cached but split. Returns the
// pinning blocks.
inline std::vector<void*> pin_segments(allocator& a) {
  std::vector<void*> keep;
  std::vector<void*> release;
  for (int i = 0; i < 10; ++i) {
    release.push_back(a.allocate(9 * MiB + 512 * KiB));
    release.push_back(a.allocate(9 * MiB));
    keep.push_back(a.allocate(1536 * KiB));
  }
  for (void* p : release) a.deallocate(p);
  return keep;
}

}  // namespace gpumem_test
