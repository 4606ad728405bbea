// cuda_vmm_device: compiled and linked everywhere (CI has no GPU); the tests that need a GPU skip
// with a message when cudaGetDeviceCount fails or reports 0, or the GPU lacks VMM support. The
// generic VMM exercise below also runs on the simulated device, so its code path is checked on
// every machine. Only the CUDA runtime (and the driver entry points it hands out) is used, so these
// tests also run against a CUDA simulator loaded in place of libcudart.
#include "gpumem/device/cuda_vmm_device.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudasim_support.hpp"
#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/shared_block.hpp"
#include "gpumem/device/simulated_device.hpp"

namespace {

using gpumem::cuda_error;
using gpumem::cuda_vmm_device;

static_assert(gpumem::is_device_v<cuda_vmm_device>);
static_assert(gpumem::is_vmm_device_v<cuda_vmm_device>);
static_assert(cuda_vmm_device::supports_vmm);
static_assert(std::is_same_v<cuda_vmm_device::physical_handle, CUmemGenericAllocationHandle>);
static_assert(cuda_vmm_device::invalid_physical_handle == cuda_vmm_device::physical_handle{});
static_assert(std::is_same_v<cuda_vmm_device::stream_type, cudaStream_t>);
static_assert(std::is_same_v<cuda_vmm_device::event_type, cudaEvent_t>);
static_assert(std::is_trivially_copyable_v<cuda_vmm_device>);
// The error codes tests compare with are the ones simulated_device uses for the same conditions.
static_assert(CUDA_ERROR_INVALID_VALUE == gpumem::simulated_device::error_invalid_value);
static_assert(CUDA_ERROR_OUT_OF_MEMORY == gpumem::simulated_device::error_out_of_memory);
static_assert(CUDA_ERROR_INVALID_HANDLE == gpumem::simulated_device::error_invalid_handle);

constexpr std::size_t MiB = std::size_t{1} << 20;

bool have_gpu() {
  return cuda_vmm_device::device_count() > 0;
}

#define GPUMEM_REQUIRE_VMM_GPU()                                                        \
  do {                                                                                  \
    if (!have_gpu()) {                                                                  \
      GTEST_SKIP() << "needs a CUDA GPU: cudaGetDeviceCount failed or reported 0";      \
    }                                                                                   \
    if (!cuda_vmm_device::supported(0)) {                                               \
      GTEST_SKIP() << "CUDA device 0 does not support virtual memory management "       \
                      "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)"; \
    }                                                                                   \
  } while (false)

bool is_power_of_two(std::size_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

// Expects `fn` to throw cuda_error with a non-zero code whose message contains `call`.
template <class Fn>
void expect_cuda_error(Fn&& fn, const std::string& call) {
  try {
    fn();
    ADD_FAILURE() << call << " did not throw";
  } catch (const cuda_error& e) {
    const std::string what = e.what();
    EXPECT_NE(e.code(), 0) << what;
    EXPECT_NE(what.find(call), std::string::npos) << what;
    EXPECT_NE(what.find("on CUDA device 0 failed"), std::string::npos) << what;
  }
}

// The VMM round trip an expandable/stitching allocator does, through the concept only: reserve
// a range, back it with pages (one handle per page, and one handle for two pages), make it
// accessible, unmap in one call, release, free the range. Offsets are 0, as CUDA requires.
template <class Device>
void exercise_vmm(Device& d) {
  const std::size_t g = d.granularity();
  ASSERT_TRUE(is_power_of_two(g)) << g;
  const std::size_t size = 4 * g;
  const std::uintptr_t va = d.reserve_address(size);
  ASSERT_NE(va, 0u);
  EXPECT_EQ(va % g, 0u);

  using handle = typename Device::physical_handle;
  const handle p0 = d.create_physical(g);
  const handle p1 = d.create_physical(g);
  const handle p23 = d.create_physical(2 * g);
  ASSERT_NE(p0, handle{});
  ASSERT_NE(p1, handle{});
  ASSERT_NE(p23, handle{});
  d.map(va, g, 0, p0);
  d.map(va + g, g, 0, p1);
  d.map(va + 2 * g, 2 * g, 0, p23);
  d.set_access(va, size);  // one call over several back-to-back mappings
  // Released while mapped: freed when unmapped.
  d.release_physical(p1);
  d.unmap(va, size);  // one call, three mappings
  d.release_physical(p0);
  d.release_physical(p23);

  // The range can be mapped again after unmapping.
  const handle again = d.create_physical(g);
  ASSERT_NE(again, handle{});
  d.map(va + 3 * g, g, 0, again);
  d.set_access(va + 3 * g, g);
  d.unmap(va + 3 * g, g);
  d.release_physical(again);
  d.free_address(va, size);

  // An explicit alignment is honoured.
  const std::uintptr_t aligned = d.reserve_address(g, 8 * g);
  EXPECT_EQ(aligned % (8 * g), 0u);
  d.free_address(aligned, g);
}

TEST(CudaVmmDevice, ConstructionMakesNoCudaCall) {
  const cuda_vmm_device d(3);
  EXPECT_EQ(d.index(), 3);
  EXPECT_EQ(d.default_stream(), nullptr);
  const gpumem::cuda_device& runtime = d;  // segments, events and streams are cuda_device's
  EXPECT_EQ(runtime.index(), 3);
}

TEST(CudaVmmDevice, VmmExerciseRunsOnTheSimulatedDevice) {
  gpumem::simulated_device d(gpumem::parse_size("80GiB"));
  exercise_vmm(d);
  EXPECT_EQ(d.bytes_in_use(), 0u);
}

TEST(CudaVmmDevice, NegativeOrMissingDeviceIsNotSupported) {
  EXPECT_FALSE(cuda_vmm_device::supported(-1));
  EXPECT_FALSE(cuda_vmm_device::supported(cuda_vmm_device::device_count() + 7));
  // supported() leaves no runtime error behind (without a driver the runtime's initialisation
  // error is sticky and cudaGetLastError keeps returning it, so only checked on a GPU).
  if (have_gpu()) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

TEST(CudaVmmDevice, WithoutAGpuVmmCallsThrowCudaErrorNamingTheCall) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present; this test covers the no-GPU error path";
  EXPECT_FALSE(cuda_vmm_device::supported(0));
  cuda_vmm_device d(0);
  try {
    (void)d.granularity();
    FAIL() << "granularity() succeeded without a GPU";
  } catch (const cuda_error& e) {
    const std::string what = e.what();
    EXPECT_NE(e.code(), 0);
    EXPECT_NE(what.find("on CUDA device 0 failed"), std::string::npos) << what;
    EXPECT_NE(what.find("cu"), std::string::npos) << what;
  }
  EXPECT_THROW((void)d.reserve_address(2 * MiB), cuda_error);
  EXPECT_THROW((void)d.create_physical(2 * MiB), cuda_error);
  EXPECT_THROW(d.map(0x200000, 2 * MiB, 0, 1), cuda_error);
  EXPECT_THROW(d.set_access(0x200000, 2 * MiB), cuda_error);
  EXPECT_THROW(d.unmap(0x200000, 2 * MiB), cuda_error);
  EXPECT_THROW(d.free_address(0x200000, 2 * MiB), cuda_error);
  EXPECT_THROW((void)d.allocate(MiB), cuda_error);  // the inherited runtime members too
}

// --- On a GPU -----------------------------------------------------------------------------------

TEST(CudaVmmDevice, SupportedOnTheGpu) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA GPU: cudaGetDeviceCount failed or reported 0";
  // Every GPU of the last years (and every datacenter GPU gpumem targets) supports VMM; a device
  // that does not is reported, not assumed.
  if (!cuda_vmm_device::supported(0)) {
    GTEST_SKIP() << "CUDA device 0 reports no virtual memory management support";
  }
  SUCCEED();
}

TEST(CudaVmmDevice, GranularityIsAPowerOfTwoOnTheGpu) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0);
  const std::size_t g = d.granularity();
  EXPECT_TRUE(is_power_of_two(g)) << g;
  EXPECT_GE(g, 64u * 1024u) << g;  // 2 MiB on current GPUs; never below a large page
  EXPECT_EQ(d.granularity(), g);
}

TEST(CudaVmmDevice, VmmRoundTripOnTheGpu) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0);
  std::size_t free_before = 0;
  std::size_t total = 0;
  d.memory_info(free_before, total);
  exercise_vmm(d);
  std::size_t free_after = 0;
  d.memory_info(free_after, total);
  // Everything created was released: free memory is back (other processes may move it a little).
  EXPECT_GE(free_after + 64 * MiB, free_before);
}

TEST(CudaVmmDevice, MappedMemoryIsUsableOnTheGpu) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0);
  const std::size_t g = d.granularity();
  const std::uintptr_t va = d.reserve_address(2 * g);
  const auto h = d.create_physical(2 * g);
  ASSERT_NE(h, cuda_vmm_device::invalid_physical_handle);
  d.map(va, 2 * g, 0, h);
  d.set_access(va, 2 * g);
  void* ptr = reinterpret_cast<void*>(va);
  ASSERT_EQ(cudaMemset(ptr, 0x5a, 2 * g), cudaSuccess);
  std::vector<unsigned char> host(4096, 0);
  ASSERT_EQ(cudaMemcpy(host.data(), static_cast<unsigned char*>(ptr) + 2 * g - host.size(),
                       host.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  // gpumem's CUDA simulator (tools/cudasim) accepts the copies but stores no device memory.
  cudaDeviceProp props{};
  ASSERT_EQ(cudaGetDeviceProperties(&props, 0), cudaSuccess);
  if (std::string(props.name).rfind("gpumem simulated GPU", 0) != 0) {
    for (unsigned char c : host) ASSERT_EQ(c, 0x5a);
  }
  d.synchronize();
  d.unmap(va, 2 * g);
  d.release_physical(h);
  d.free_address(va, 2 * g);
}

bool on_the_simulator() {
  cudaDeviceProp props{};
  return cudaGetDeviceProperties(&props, 0) == cudaSuccess &&
         std::string(props.name).rfind("gpumem simulated GPU", 0) == 0;
}

std::size_t used_bytes(cuda_vmm_device& d) {
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  d.memory_info(free_bytes, total);
  return total - free_bytes;
}

// --- Sharing VMM memory (export / import, share_block / opened_block) ---------------------------

TEST(CudaVmmDevice, AnExportedPageImportsAsTheSamePhysicalMemory) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0);
  ASSERT_EQ(d.shareable_handle_type(), cuda_vmm_device::shareable_handle::posix_fd);
  const std::size_t g = d.granularity();
  const std::size_t before = used_bytes(d);
  const auto h = d.create_physical(g);
  ASSERT_NE(h, cuda_vmm_device::invalid_physical_handle);
  const int fd = d.export_handle(h);
  ASSERT_GE(fd, 0);
  const auto imported = d.import_handle(fd);
  ::close(fd);
  const std::uintptr_t va = d.reserve_address(g);
  d.map(va, g, 0, imported);
  d.set_access(va, g);
  EXPECT_LE(used_bytes(d), before + g + 64 * MiB);  // one page, not two (others may move a little)
  // The memory lives while a handle or a mapping does: releasing the creator's handle frees
  // nothing, the last release after the unmap frees it.
  d.release_physical(h);
  ASSERT_EQ(cudaMemset(reinterpret_cast<void*>(va), 0x11, g), cudaSuccess);
  d.synchronize();
  d.unmap(va, g);
  d.release_physical(imported);
  d.free_address(va, g);
  EXPECT_LE(used_bytes(d), before + 64 * MiB);
  if (on_the_simulator()) {
    EXPECT_EQ(used_bytes(d), before);
  }
}

TEST(CudaVmmDevice, NewMemoryIsWhatNcclRegistersExportableAndGpuDirectRdmaCapable) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0);
  int rdma = 0;
  // The runtime names no such attribute; the driver's value is the same enumeration.
  const auto attribute =
      static_cast<cudaDeviceAttr>(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
  ASSERT_EQ(cudaDeviceGetAttribute(&rdma, attribute, 0), cudaSuccess);
  if (on_the_simulator()) {
    EXPECT_EQ(rdma, 1);  // the simulated H200 has it
  }
  const auto h = d.create_physical(d.granularity());
  ASSERT_NE(h, cuda_vmm_device::invalid_physical_handle);
  const CUmemAllocationProp prop = d.allocation_properties(h);
  EXPECT_EQ(prop.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  EXPECT_EQ(prop.location.id, 0);
  EXPECT_NE(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  EXPECT_EQ(prop.allocFlags.gpuDirectRDMACapable, rdma != 0 ? 1 : 0);
  d.release_physical(h);
  EXPECT_THROW(d.allocation_properties(h), gpumem::cuda_error);
}

TEST(CudaVmmDevice, MemoryCreatedWithoutAHandleTypeIsNotExported) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0, cuda_vmm_device::shareable_handle::none);
  const auto h = d.create_physical(d.granularity());
  ASSERT_NE(h, cuda_vmm_device::invalid_physical_handle);
  try {
    (void)d.export_handle(h);
    ADD_FAILURE() << "exported memory created without a shareable handle type";
  } catch (const cuda_error& e) {
    EXPECT_NE(std::string(e.what()).find("cuMemExportToShareableHandle"), std::string::npos)
        << e.what();
  }
  d.release_physical(h);
}

// --- Fabric handles. ctest runs this program with GPUMEM_SIM_FABRIC unset (an H100/H200 server
// without an IMEX channel), =imex and =unsupported (a GPU without fabric handles).

std::string sim_fabric() {
  const char* v = std::getenv("GPUMEM_SIM_FABRIC");
  return v == nullptr || *v == '\0' ? "no_imex" : v;
}

// Whether fabric handles work here: on the simulator as GPUMEM_SIM_FABRIC says; on a GPU as the
// device finds (no expectation to check it against).
bool fabric_expected(const cuda_vmm_device& d) {
  return on_the_simulator() ? sim_fabric() == "imex" : d.fabric_supported();
}

TEST(CudaVmmDevice, FabricSupportIsTheAttributeAndAWorkingExportImportCycle) {
  GPUMEM_REQUIRE_VMM_GPU();
  if (!on_the_simulator()) GTEST_SKIP() << "checks the simulator's settings";
  cuda_vmm_device d(0);
  int attribute = -1;
  ASSERT_EQ(cudaDeviceGetAttribute(
                &attribute,
                static_cast<cudaDeviceAttr>(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED), 0),
            cudaSuccess);
  // An H100 or H200 has fabric handles; without an IMEX channel they cannot be used.
  EXPECT_EQ(attribute, sim_fabric() == "unsupported" ? 0 : 1);
  const std::size_t used = used_bytes(d);
  EXPECT_EQ(d.fabric_supported(), sim_fabric() == "imex");
  EXPECT_EQ(used_bytes(d), used);  // the probe's page is gone
}

TEST(CudaVmmDevice, AutomaticHandlesAreFabricWhereTheyWorkElseFileDescriptors) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0, cuda_vmm_device::shareable_handle::automatic);
  EXPECT_EQ(d.shareable_handle_type(), cuda_vmm_device::shareable_handle::automatic);
  const auto h = d.create_physical(d.granularity());
  ASSERT_NE(h, cuda_vmm_device::invalid_physical_handle);
  const bool fabric = fabric_expected(d);
  EXPECT_EQ(d.shareable_handle_type(), fabric ? cuda_vmm_device::shareable_handle::fabric
                                              : cuda_vmm_device::shareable_handle::posix_fd);
  const CUmemAllocationProp prop = d.allocation_properties(h);
  EXPECT_EQ(prop.requestedHandleTypes,
            fabric ? CU_MEM_HANDLE_TYPE_FABRIC : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  d.release_physical(h);
}

TEST(CudaVmmDevice, AFabricHandleImportsAsTheSameMemoryHereAndInAnotherProcess) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0, cuda_vmm_device::shareable_handle::fabric);
  const std::size_t g = d.granularity();
  const auto h = d.create_physical(g);
  ASSERT_NE(h, cuda_vmm_device::invalid_physical_handle);
  if (!fabric_expected(d)) {
    // Refused at creation: the device fell back to file descriptors, and fabric bytes made
    // elsewhere do not import (CUDA_ERROR_NOT_PERMITTED without an IMEX channel,
    // CUDA_ERROR_NOT_SUPPORTED on a GPU without fabric handles).
    EXPECT_EQ(d.shareable_handle_type(), cuda_vmm_device::shareable_handle::posix_fd);
    EXPECT_THROW((void)d.export_fabric_handle(h), cuda_error);
    try {
      (void)d.import_fabric_handle(gpumem::fabric_handle{});
      ADD_FAILURE() << "imported a fabric handle without fabric access";
    } catch (const cuda_error& e) {
      if (on_the_simulator()) {
        EXPECT_EQ(e.code(), sim_fabric() == "unsupported" ? CUDA_ERROR_NOT_SUPPORTED
                                                          : CUDA_ERROR_NOT_PERMITTED)
            << e.what();
      }
    }
    d.release_physical(h);
    return;
  }
  EXPECT_EQ(d.shareable_handle_type(), cuda_vmm_device::shareable_handle::fabric);
  const gpumem::fabric_handle bytes = d.export_fabric_handle(h);
  EXPECT_EQ(d.export_fabric_handle(h), bytes);  // the same memory, the same handle
  EXPECT_NE(bytes, gpumem::fabric_handle{});
  // Memory created with fabric handles has no file descriptor.
  EXPECT_THROW((void)d.export_handle(h), cuda_error);
  gpumem::fabric_handle made_up = bytes;
  made_up[40] ^= 0xff;
  EXPECT_THROW((void)d.import_fabric_handle(made_up), cuda_error);
  const std::size_t before = used_bytes(d);
  // Another process imports, maps and writes it (on the simulator, a forked child's simulated
  // GPU is a copy of this one's, so the exported memory is there too).
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int rc = 0;
    try {
      const auto imported = d.import_fabric_handle(bytes);
      const std::uintptr_t va = d.reserve_address(g);
      d.map(va, g, 0, imported);
      d.set_access(va, g);
      if (cudaMemset(reinterpret_cast<void*>(va), 0x44, g) != cudaSuccess) rc = 2;
      d.synchronize();
      d.unmap(va, g);
      d.release_physical(imported);
      d.free_address(va, g);
    } catch (...) {
      rc = 3;
    }
    ::_exit(rc);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // Here too: the same physical page, no new memory; it lives until both handles are released.
  const auto imported = d.import_fabric_handle(bytes);
  EXPECT_EQ(used_bytes(d), before);
  d.release_physical(h);
  const std::uintptr_t va = d.reserve_address(g);
  d.map(va, g, 0, imported);
  d.set_access(va, g);
  ASSERT_EQ(cudaMemset(reinterpret_cast<void*>(va), 0x11, g), cudaSuccess);
  d.synchronize();
  d.unmap(va, g);
  d.release_physical(imported);
  d.free_address(va, g);
  if (on_the_simulator()) {
    EXPECT_EQ(used_bytes(d), before - g);
    // Released everywhere: the bytes name nothing any more.
    EXPECT_THROW((void)d.import_fabric_handle(bytes), cuda_error);
  }
}

TEST(CudaVmmDevice, FabricHandlesFallBackToFileDescriptorsWhereRefused) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0, cuda_vmm_device::shareable_handle::fabric);
  const auto h = d.create_physical(d.granularity());
  ASSERT_NE(h, cuda_vmm_device::invalid_physical_handle);
  if (on_the_simulator()) {  // fabric handles only with an IMEX channel
    EXPECT_EQ(d.shareable_handle_type(), sim_fabric() == "imex"
                                             ? cuda_vmm_device::shareable_handle::fabric
                                             : cuda_vmm_device::shareable_handle::posix_fd);
  }
  if (d.shareable_handle_type() == cuda_vmm_device::shareable_handle::posix_fd) {
    const int fd = d.export_handle(h);
    EXPECT_GE(fd, 0);
    ::close(fd);
  }
  d.release_physical(h);
}

class ShareBlock : public ::testing::TestWithParam<gpumem::allocator_policy> {};

TEST_P(ShareBlock, TheConsumerMapsTheBlocksPagesAtItsOwnAddress) {
  GPUMEM_REQUIRE_VMM_GPU();
  gpumem::allocator_config config;
  config.policy = GetParam();
  cuda_vmm_device producer(0);
  gpumem::caching_allocator<cuda_vmm_device> allocator(producer, config);
  const std::size_t g = allocator.device().granularity();
  const std::size_t size = 5 * g + 12345;
  void* ptr = allocator.allocate(size);
  ASSERT_EQ(cudaMemset(ptr, 0x5a, size), cudaSuccess);
  gpumem::shared_block shared = allocator.share_block(ptr);
  EXPECT_EQ(shared.size, size);
  ASSERT_GT(shared.page_size, 0u);
  EXPECT_EQ(shared.fds.size(), (shared.offset + size + shared.page_size - 1) / shared.page_size);
  const std::size_t used = used_bytes(allocator.device());
  {
    cuda_vmm_device consumer_device(0);
    gpumem::opened_block<cuda_vmm_device> view(consumer_device, shared);
    gpumem::close_descriptors(shared);
    EXPECT_TRUE(shared.fds.empty());
    EXPECT_NE(view.data(), ptr);
    EXPECT_EQ(view.size(), size);
    EXPECT_LE(used_bytes(allocator.device()), used + 64 * MiB);  // no new memory
    // The view is mapped and accessible over the whole block (the simulator checks every byte).
    ASSERT_EQ(cudaMemset(view.data(), 0x33, size), cudaSuccess);
    std::vector<unsigned char> host(4096, 0);
    ASSERT_EQ(cudaMemcpy(host.data(), static_cast<unsigned char*>(ptr) + size - host.size(),
                         host.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    if (!on_the_simulator()) {  // the producer's address sees what the consumer wrote
      for (unsigned char c : host) ASSERT_EQ(c, 0x33);
    }
    allocator.device().synchronize();
  }
  allocator.deallocate(ptr);
  allocator.empty_cache();
  allocator.check_invariants();
}

TEST_P(ShareBlock, ABlockOfTheClassicPolicyOrAFreedOneIsRefused) {
  GPUMEM_REQUIRE_VMM_GPU();
  gpumem::allocator_config config;
  config.policy = GetParam();
  cuda_vmm_device producer(0);
  gpumem::caching_allocator<cuda_vmm_device> allocator(producer, config);
  void* ptr = allocator.allocate(3 * MiB);
  allocator.deallocate(ptr);
  EXPECT_THROW((void)allocator.share_block(ptr), gpumem::usage_error);
}

TEST_P(ShareBlock, WithFabricHandlesTheConsumerImportsTheBytesInAnotherProcess) {
  GPUMEM_REQUIRE_VMM_GPU();
  gpumem::allocator_config config;
  config.policy = GetParam();
  cuda_vmm_device producer(0, cuda_vmm_device::shareable_handle::automatic);
  gpumem::caching_allocator<cuda_vmm_device> allocator(producer, config);
  const std::size_t g = allocator.device().granularity();
  const std::size_t size = 3 * g + 777;
  void* ptr = allocator.allocate(size);
  gpumem::shared_block shared = allocator.share_block(ptr);
  const std::size_t pages = (shared.offset + size + shared.page_size - 1) / shared.page_size;
  if (!fabric_expected(allocator.device())) {
    EXPECT_TRUE(shared.fabric.empty());
    EXPECT_EQ(shared.fds.size(), pages);
    gpumem::close_descriptors(shared);
    allocator.deallocate(ptr);
    GTEST_SKIP() << "no fabric access: shared as file descriptors";
  }
  EXPECT_TRUE(shared.fds.empty());
  ASSERT_EQ(shared.fabric.size(), pages);
  EXPECT_EQ(shared.pages(), pages);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int rc = 0;
    try {
      cuda_vmm_device consumer_device(0);
      gpumem::opened_block<cuda_vmm_device> view(consumer_device, shared);
      if (view.size() != size) rc = 2;
      if (cudaMemset(view.data(), 0x33, size) != cudaSuccess) rc = 3;
      consumer_device.synchronize();
    } catch (...) {
      rc = 4;
    }
    ::_exit(rc);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  {
    cuda_vmm_device consumer_device(0);
    const std::size_t used = used_bytes(allocator.device());
    gpumem::opened_block<cuda_vmm_device> view(consumer_device, shared);
    EXPECT_EQ(used_bytes(allocator.device()), used);  // the producer's pages, no new memory
    ASSERT_EQ(cudaMemset(view.data(), 0x33, size), cudaSuccess);
    consumer_device.synchronize();
  }
  allocator.deallocate(ptr);
  allocator.empty_cache();
  allocator.check_invariants();
}

std::string policy_name(const ::testing::TestParamInfo<gpumem::allocator_policy>& p) {
  return std::string(gpumem::to_string(p.param));
}

INSTANTIATE_TEST_SUITE_P(VmmPolicies, ShareBlock,
                         ::testing::Values(gpumem::allocator_policy::expandable,
                                           gpumem::allocator_policy::stitch),
                         policy_name);

TEST(ShareBlockClassic, ClassicSegmentsAreSharedWithCudaIpcInstead) {
  GPUMEM_REQUIRE_VMM_GPU();
  gpumem::allocator_config config;
  config.policy = gpumem::allocator_policy::classic;
  cuda_vmm_device producer(0);
  gpumem::caching_allocator<cuda_vmm_device> allocator(producer, config);
  void* ptr = allocator.allocate(3 * MiB);
  try {
    (void)allocator.share_block(ptr);
    ADD_FAILURE() << "classic memory exported as VMM pages";
  } catch (const gpumem::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaIpcGetMemHandle"), std::string::npos) << e.what();
  }
  allocator.deallocate(ptr);
}

TEST(CudaVmmDevice, CreateBeyondDeviceMemoryReturnsTheInvalidHandle) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0);
  const std::size_t g = d.granularity();
  const std::size_t total = d.total_memory();
  const std::size_t too_much = (total + g - 1) / g * g + g;  // more than the whole device
  EXPECT_EQ(d.create_physical(too_much), cuda_vmm_device::invalid_physical_handle);
  // Out of memory is not sticky: the next creation works.
  const auto h = d.create_physical(g);
  EXPECT_NE(h, cuda_vmm_device::invalid_physical_handle);
  if (h != cuda_vmm_device::invalid_physical_handle) d.release_physical(h);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaVmmDevice, CreateUntilTheDeviceIsFullReturnsTheInvalidHandle) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0);
  const std::size_t g = d.granularity();
  const std::size_t total = d.total_memory();
  const std::size_t chunk = std::max(g, total / 64 / g * g);  // about 64 calls to fill the device
  std::vector<cuda_vmm_device::physical_handle> handles;
  bool full = false;
  for (std::size_t i = 0; i < 4096 && !full; ++i) {
    const auto h = d.create_physical(chunk);
    if (h == cuda_vmm_device::invalid_physical_handle) {
      full = true;
    } else {
      handles.push_back(h);
    }
  }
  EXPECT_TRUE(full) << "created " << handles.size() << " x " << chunk
                    << " bytes without running out";
  EXPECT_LE(handles.size() * chunk, total);
  for (const auto h : handles) d.release_physical(h);
  // Everything is back: a chunk can be created again.
  const auto again = d.create_physical(chunk);
  EXPECT_NE(again, cuda_vmm_device::invalid_physical_handle);
  if (again != cuda_vmm_device::invalid_physical_handle) d.release_physical(again);
}

TEST(CudaVmmDevice, MisuseThrowsCudaErrorNamingTheCallOnTheGpu) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0);
  const std::size_t g = d.granularity();
  const std::uintptr_t va = d.reserve_address(4 * g);
  const auto h = d.create_physical(2 * g);
  ASSERT_NE(h, cuda_vmm_device::invalid_physical_handle);

  // Physical memory of a size that is not a multiple of the granularity, or of 0 bytes.
  expect_cuda_error([&] { (void)d.create_physical(g / 2); }, "cuMemCreate(&handle, size=");
  expect_cuda_error([&] { (void)d.create_physical(0); }, "cuMemCreate(&handle, size=0");
  // Mapping at an unaligned address, with an unaligned size, with a non-zero offset (CUDA
  // requires 0), or outside any reservation.
  expect_cuda_error([&] { d.map(va + g / 2, g, 0, h); }, "cuMemMap(va=");
  expect_cuda_error([&] { d.map(va, g / 2, 0, h); }, "cuMemMap(va=");
  try {  // offset != 0: "currently must be zero" in the driver documentation
    d.map(va, g, g, h);
    d.unmap(va, g);
    ADD_FAILURE() << "cuMemMap with a non-zero offset succeeded, but the CUDA driver documents "
                     "that the offset currently must be zero (a simulator that accepts it differs "
                     "from the driver, or the driver has changed)";
  } catch (const cuda_error& e) {
    EXPECT_NE(std::string(e.what()).find("offset=" + std::to_string(g)), std::string::npos)
        << e.what();
  }
  // Access to, or unmapping of, a range that is not mapped.
  expect_cuda_error([&] { d.set_access(va, g); }, "cuMemSetAccess(va=");
  expect_cuda_error([&] { d.unmap(va, g); }, "cuMemUnmap(va=");

  // Mapping onto mapped pages.
  d.map(va, 2 * g, 0, h);
  expect_cuda_error([&] { d.map(va, 2 * g, 0, h); }, "cuMemMap(va=");
  // Access to a range that runs past the mapping.
  expect_cuda_error([&] { d.set_access(va, 4 * g); }, "cuMemSetAccess(va=");
  // Unmapping part of a mapping.
  expect_cuda_error([&] { d.unmap(va, g); }, "cuMemUnmap(va=");
  d.set_access(va, 2 * g);  // the failed calls changed nothing
  d.unmap(va, 2 * g);
  d.release_physical(h);

  // Freeing a range that was never reserved, or with a different size.
  expect_cuda_error([&] { d.free_address(va + g, g); }, "cuMemAddressFree(");
  expect_cuda_error([&] { d.free_address(va, 2 * g); }, "cuMemAddressFree(");
  // Reserving 0 bytes.
  expect_cuda_error([&] { (void)d.reserve_address(0); }, "cuMemAddressReserve(&va, size=0");
  d.free_address(va, 4 * g);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // driver errors do not touch the runtime's state
}

TEST(CudaVmmDevice, ErrorMessagesNameTheDriverError) {
  GPUMEM_REQUIRE_VMM_GPU();
  cuda_vmm_device d(0);
  const std::size_t g = d.granularity();
  const std::uintptr_t va = d.reserve_address(g);
  try {
    d.unmap(va, g);  // reserved but never mapped
    FAIL() << "unmap of an unmapped range succeeded";
  } catch (const cuda_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA_ERROR_"), std::string::npos) << what;  // cuGetErrorName
    EXPECT_NE(what.find(fmt::format("size={}", g)), std::string::npos) << what;
  }
  d.free_address(va, g);
}

TEST(CudaVmmDevice, SegmentsEventsAndStreamsOnTheGpu) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA GPU: cudaGetDeviceCount failed or reported 0";
  cuda_vmm_device d(0);
  void* p = d.allocate(2 * MiB);
  ASSERT_NE(p, nullptr);
  const cudaStream_t s = d.create_stream();
  const cudaEvent_t e = d.create_event();
  d.record_event(e, s);
  d.synchronize_event(e);
  EXPECT_TRUE(d.query_event(e));
  d.destroy_event(e);
  d.destroy_stream(s);
  d.deallocate(p, 2 * MiB);
}

TEST(CudaVmmDevice, VmmCallsNeitherNeedNorChangeTheCurrentDeviceOnTheGpu) {
  GPUMEM_REQUIRE_VMM_GPU();
  const int last = cuda_vmm_device::device_count() - 1;
  ASSERT_EQ(cudaSetDevice(last), cudaSuccess);
  cuda_vmm_device d(0);
  const std::size_t g = d.granularity();
  const std::uintptr_t va = d.reserve_address(g);
  const auto h = d.create_physical(g);
  ASSERT_NE(h, cuda_vmm_device::invalid_physical_handle);
  d.map(va, g, 0, h);
  d.set_access(va, g);
  d.unmap(va, g);
  d.release_physical(h);
  d.free_address(va, g);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, last);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);

  // A fresh thread has no current context; the VMM calls work there all the same.
  std::thread worker([&] {
    EXPECT_NO_THROW({
      const std::uintptr_t va2 = d.reserve_address(g);
      const auto h2 = d.create_physical(g);
      ASSERT_NE(h2, cuda_vmm_device::invalid_physical_handle);
      d.map(va2, g, 0, h2);
      d.set_access(va2, g);
      d.unmap(va2, g);
      d.release_physical(h2);
      d.free_address(va2, g);
    });
  });
  worker.join();
}

// --- A segment source (a memory pool's own allocator) ----------------------------------------

// Segments from cudaMalloc, counted; at each free, whether work the host has not seen end was
// still pending (the simulator's pending_works), and a switch to fail the next allocations.
class counting_source final : public gpumem::segment_source {
 public:
  void* allocate(std::size_t bytes) override {
    if (fail) return nullptr;
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) return nullptr;
    ++allocations;
    return ptr;
  }
  void deallocate(void* ptr, std::size_t bytes) override {
    pending_at_free.push_back(cudasim_test::counters().pending_works);
    freed_bytes += bytes;
    ASSERT_EQ(cudaFree(ptr), cudaSuccess);
  }
  bool fail = false;
  int allocations = 0;
  std::size_t freed_bytes = 0;
  std::vector<unsigned long long> pending_at_free;
};

TEST(SegmentSource, ThePoolsSegmentsComeFromItAndGoBackOnceTheirWorkEnded) {
  GPUMEM_REQUIRE_VMM_GPU();
  if (!on_the_simulator()) GTEST_SKIP() << "counts the simulator's pending work";
  counting_source source;
  cuda_vmm_device device(0);
  device.set_segment_source(&source);
  gpumem::allocator_config config;
  config.policy = gpumem::allocator_policy::classic;
  {
    gpumem::caching_allocator<cuda_vmm_device> allocator(device, config);
    const auto before = cudasim_test::counters();
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    void* small = allocator.allocate(MiB, stream);
    void* large = allocator.allocate(30 * MiB, stream);
    EXPECT_EQ(source.allocations, 2);
    EXPECT_EQ(cudasim_test::counters().calls.malloc - before.calls.malloc, 2u);  // its cudaMallocs
    // Work that outlasts the host's calls writes the large block on its own stream, which frees
    // it at once (stream order): only the release of the segment must wait for the work.
    ASSERT_EQ(cudasim_test::launch_work(stream, {cudasim_test::writes(large, 30 * MiB)}, 0.5), 0);
    allocator.deallocate(large);
    allocator.deallocate(small);
    allocator.empty_cache();
    // Both segments went back through the source, and only after the work had ended.
    EXPECT_EQ(source.freed_bytes, 32 * MiB);
    ASSERT_EQ(source.pending_at_free.size(), 2u);
    for (unsigned long long pending : source.pending_at_free) EXPECT_EQ(pending, 0u);
    // A source out of memory is the device out of memory: the allocator frees its cache and
    // retries, then reports out_of_memory.
    void* kept = allocator.allocate(MiB, stream);
    allocator.deallocate(kept);
    source.fail = true;
    EXPECT_THROW((void)allocator.allocate(64 * MiB, stream), gpumem::out_of_memory);
    EXPECT_EQ(source.freed_bytes, 34 * MiB);  // the cached 2 MiB segment released for the retry
    source.fail = false;
    allocator.check_invariants();
    ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  }
  EXPECT_EQ(cudasim_test::violations(), 0u) << cudasim_test::last_violation();
}

}  // namespace
