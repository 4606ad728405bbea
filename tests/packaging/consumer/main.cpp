// gpumem packaging test: a downstream program. Exits 0 only when the allocator's statistics are
// exactly what the classic policy (PyTorch's caching allocator rules) gives for this sequence.
#include <gpumem/gpumem.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

int failures = 0;

void expect(std::int64_t got, std::int64_t want, const char* what) {
  if (got != want) {
    std::fprintf(stderr, "FAIL: %s is %lld, expected %lld\n", what, static_cast<long long>(got),
                 static_cast<long long>(want));
    ++failures;
  }
}

std::int64_t i64(std::size_t v) {
  return static_cast<std::int64_t>(v);
}

}  // namespace

int main() try {
  gpumem::simulated_device device(GiB);
  gpumem::caching_allocator<gpumem::simulated_device> allocator(
      device, gpumem::allocator_config::parse("policy:classic"));

  // 1000 B -> a 512-byte-rounded 1024 B block in a fresh 2 MiB small-pool segment;
  // 5 MiB -> a block in a fresh 20 MiB large-pool segment.
  void* small = allocator.allocate(1000);
  void* large = allocator.allocate(5 * MiB);
  if (small == nullptr || large == nullptr) {
    std::fprintf(stderr, "FAIL: allocate returned nullptr\n");
    return 1;
  }
  gpumem::device_stats s = allocator.stats();
  expect(s.allocated_bytes[0].current, i64(1024 + 5 * MiB), "allocated bytes");
  expect(s.requested_bytes[0].current, i64(1000 + 5 * MiB), "requested bytes");
  expect(s.reserved_bytes[0].current, i64(22 * MiB), "reserved bytes");
  expect(s.segment[0].current, 2, "segments");
  expect(s.allocation[0].current, 2, "allocations");
  expect(i64(device.bytes_in_use()), i64(22 * MiB), "device bytes in use");

  allocator.deallocate(small);
  allocator.deallocate(large);
  // Freed memory stays cached; the same request is served again without a device call.
  void* again = allocator.allocate(1000);
  allocator.deallocate(again);

  const std::string summary = allocator.memory_summary();
  std::fputs(summary.c_str(), stdout);
  std::fflush(stdout);  // keep the summary ahead of any FAIL line in a combined log
  if (summary.find("gpumem CUDA memory summary") == std::string::npos) {
    std::fprintf(stderr, "FAIL: memory_summary() has no gpumem title\n");
    ++failures;
  }

  s = allocator.stats();
  expect(s.allocated_bytes[0].current, 0, "allocated bytes after free");
  expect(s.allocated_bytes[0].peak, i64(1024 + 5 * MiB), "peak allocated bytes");
  expect(s.reserved_bytes[0].current, i64(22 * MiB), "cached reserved bytes");
  expect(s.allocation[0].allocated, 3, "allocations made");
  expect(s.allocation[0].freed, 3, "allocations freed");
  expect(s.num_device_alloc, 2, "device allocations");
  expect(s.num_device_free, 0, "device frees before empty_cache");

  allocator.empty_cache();
  s = allocator.stats();
  expect(s.reserved_bytes[0].current, 0, "reserved bytes after empty_cache");
  expect(s.num_device_free, 2, "device frees after empty_cache");
  expect(i64(device.bytes_in_use()), 0, "device bytes in use after empty_cache");
  allocator.check_invariants();

  if (failures != 0) {
    std::fprintf(stderr, "gpumem consumer: %d check(s) failed\n", failures);
    return 1;
  }
  std::puts("gpumem consumer: OK");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
  return 1;
}
