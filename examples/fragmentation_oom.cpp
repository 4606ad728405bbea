// A training loop whose memory fragments until it runs out, on a simulated 8 GiB GPU.
//
// Each step allocates activations sized by that step's sequence length and frees them at the
// end, but keeps a small per-step tensor alive (a logged loss that still holds device memory).
// Those survivors land between activations and pin the segments they sit in: reserved memory
// grows although the live set stays small, until a request no cached block can serve.
#include <cstdio>
#include <random>
#include <vector>

#include "gpumem/gpumem.hpp"

int main() {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  gpumem::simulated_device::options options;
  options.capacity = std::size_t{8} << 30;
  gpumem::simulated_device gpu(options);
  gpumem::caching_allocator<gpumem::simulated_device> allocator(
      gpu, gpumem::allocator_config::parse("policy:classic"));

  std::mt19937 rng(2024);
  std::vector<void*> weights;
  for (int i = 0; i < 48; ++i) weights.push_back(allocator.allocate(40 * MiB));  // 1.9 GiB model

  std::vector<void*> survivors;
  for (int step = 1;; ++step) {
    const std::size_t seq = 256 + 64 * (rng() % 64);  // 256 .. 4288 tokens
    std::vector<void*> activations;
    try {
      for (int layer = 0; layer < 24; ++layer) {
        activations.push_back(allocator.allocate(seq * 8 * 1024));   // hidden states
        activations.push_back(allocator.allocate(seq * 24 * 1024));  // attention / MLP
        if (layer % 8 == 3) survivors.push_back(allocator.allocate(1536 * 1024));  // kept
      }
    } catch (const gpumem::out_of_memory& oom) {
      const auto stats = allocator.stats();
      std::printf("step %d: out of memory with %zu MiB live of %zu MiB reserved\n\n", step,
                  static_cast<std::size_t>(stats.allocated_bytes[0].current) / MiB,
                  static_cast<std::size_t>(stats.reserved_bytes[0].current) / MiB);
      std::printf("%s\n\n%s", oom.what(), allocator.memory_summary().c_str());
      for (void* p : activations) allocator.deallocate(p);
      return 0;
    }
    for (void* p : activations) allocator.deallocate(p);
  }
}
