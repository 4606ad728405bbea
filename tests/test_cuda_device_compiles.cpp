// cuda_device: compiled and linked everywhere (CI has no GPU); the tests that need a GPU skip with
// a message when cudaGetDeviceCount fails or reports 0. The generic concept exercise below is also
// run on the simulated device, so the code path it takes is checked on every machine.
#include "gpumem/device/cuda_device.hpp"

#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/simulated_device.hpp"

// The allocator's public interface compiles over the CUDA runtime device (a device without VMM:
// the VMM code paths must not be instantiated for it). Compiled, not run.
[[maybe_unused]] void allocator_over_cuda_device_compiles(gpumem::cuda_device& device) {
  gpumem::caching_allocator<gpumem::cuda_device> a(device, gpumem::allocator_config{});
  void* p = a.allocate(1, device.default_stream());
  a.record_stream(p, device.default_stream());
  a.deallocate(p);
  a.empty_cache();
  a.set_memory_fraction(0.5);
  a.reset_peak_stats();
  a.reset_accumulated_stats();
  (void)a.stats();
  (void)a.usage();
  (void)a.snapshot();
  (void)a.memory_summary();
  a.check_invariants();
}

namespace {

using gpumem::cuda_device;
using gpumem::cuda_error;

static_assert(gpumem::is_device_v<cuda_device>);
static_assert(!gpumem::is_vmm_device_v<cuda_device>);
static_assert(std::is_same_v<cuda_device::stream_type, cudaStream_t>);
static_assert(std::is_same_v<cuda_device::event_type, cudaEvent_t>);
static_assert(std::is_trivially_copyable_v<cuda_device>);

constexpr std::size_t MiB = std::size_t{1} << 20;

bool have_gpu() {
  return cuda_device::device_count() > 0;
}

#define GPUMEM_REQUIRE_GPU()                                                       \
  do {                                                                             \
    if (!have_gpu()) {                                                             \
      GTEST_SKIP() << "needs a CUDA GPU: cudaGetDeviceCount failed or reported 0"; \
    }                                                                              \
  } while (false)

// Every member of the device concept, in the order an allocator uses them. Instantiating it for
// cuda_device makes every CUDA call compile and link.
template <class Device>
void exercise_device(Device& d) {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  d.memory_info(free_bytes, total_bytes);
  EXPECT_EQ(total_bytes, d.total_memory());
  EXPECT_LE(free_bytes, total_bytes);

  void* p = d.allocate(2 * MiB);
  ASSERT_NE(p, nullptr);
  const auto stream = d.default_stream();
  auto event = d.create_event();
  EXPECT_TRUE(d.query_event(event));  // never recorded: complete
  d.record_event(event, stream);
  d.synchronize_event(event);
  EXPECT_TRUE(d.query_event(event));
  d.synchronize();
  d.destroy_event(event);
  d.deallocate(p, 2 * MiB);

  // Far more than any device holds: out of memory is nullptr, not an exception, and the next
  // allocation works.
  EXPECT_EQ(d.allocate(total_bytes * 4 + 2 * MiB), nullptr);
  void* q = d.allocate(MiB);
  EXPECT_NE(q, nullptr);
  d.deallocate(q, MiB);
  EXPECT_EQ(d.allocate(0), nullptr);
  d.deallocate(nullptr, 0);
}

TEST(CudaDevice, ConstructionMakesNoCudaCall) {
  const cuda_device d(3);
  EXPECT_EQ(d.index(), 3);
  EXPECT_EQ(d.default_stream(), nullptr);
}

TEST(CudaDevice, ConceptExerciseRunsOnTheSimulatedDevice) {
  gpumem::simulated_device d(gpumem::parse_size("80GiB"));
  exercise_device(d);
  EXPECT_EQ(d.bytes_in_use(), 0u);
  EXPECT_EQ(d.live_events(), 0u);
}

TEST(CudaDevice, WithoutAGpuCallsThrowCudaErrorNamingTheCall) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present; this test covers the no-GPU error path";
  cuda_device d(0);
  try {
    (void)d.allocate(MiB);
    FAIL() << "allocate succeeded without a GPU";
  } catch (const cuda_error& e) {
    const std::string what = e.what();
    EXPECT_NE(e.code(), 0);
    EXPECT_NE(what.find("on CUDA device 0 failed: cuda"), std::string::npos) << what;
  }
  EXPECT_THROW((void)d.create_event(), cuda_error);
  EXPECT_THROW(d.synchronize(), cuda_error);
  std::size_t f = 0;
  std::size_t t = 0;
  EXPECT_THROW(d.memory_info(f, t), cuda_error);
  EXPECT_THROW((void)d.total_memory(), cuda_error);
}

TEST(CudaDevice, ConceptExerciseOnTheGpu) {
  GPUMEM_REQUIRE_GPU();
  cuda_device d(0);
  exercise_device(d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the out-of-memory error was cleared
}

TEST(CudaDevice, StreamsAndEventsOnTheGpu) {
  GPUMEM_REQUIRE_GPU();
  cuda_device d(0);
  const cudaStream_t s = d.create_stream();
  EXPECT_NE(s, d.default_stream());
  const cudaEvent_t e = d.create_event();
  d.record_event(e, s);
  d.synchronize_event(e);
  EXPECT_TRUE(d.query_event(e));
  d.destroy_event(e);
  d.destroy_stream(s);
}

TEST(CudaDevice, BadDeviceIndexThrowsAndKeepsTheCurrentDevice) {
  GPUMEM_REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cuda_device bad(cuda_device::device_count() + 7);
  try {
    (void)bad.allocate(MiB);
    FAIL() << "allocate on a missing device succeeded";
  } catch (const cuda_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaSetDevice"), std::string::npos) << what;
  }
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
}

}  // namespace
