// The allocator's conformance to what a GPU punishes: one suite, instantiated per (device, policy)
// — simulated_device with each policy, and on the CUDA simulator cuda_device (classic) and
// cuda_vmm_device (classic, expandable, stitch) — with work between allocations and frees
// (gpumemSimLaunchWork), cross-stream record_stream, CUDA-graph captures into private pools,
// out-of-memory during a capture, and two devices (peer access, cross-device record_stream).
//
// ctest runs it on the strict simulator (GPUMEM_CUDASIM_TEST=conformance, GPUMEM_SIM_STRICT=abort,
// two devices; labels capture and multidevice), once with work that takes no time and once with
// work that outlasts the test (conformance_slow), and asserts zero violations. The controls
// (ConformanceControls, GPUMEM_CUDASIM_TEST=conformance_controls, not strict) misuse the allocator
// as the defects did (a graph pool's memory freed under the graph, a peer not granted VMM access)
// and check that the simulator reports it, so that the suite can fail. On simulated_device the
// suite checks the same rules through the device's call counters (it has no capture or work);
// those instantiations run everywhere.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/simulated_device.hpp"

#ifdef GPUMEM_TEST_CUDASIM
#include <cuda_runtime_api.h>

#include "cudasim_support.hpp"
#include "gpumem/device/cuda_device.hpp"
#include "gpumem/device/cuda_vmm_device.hpp"
#include "gpumem/host/cuda_host_device.hpp"
#include "gpumem/host/pinned_pool.hpp"
#endif

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

gpumem::allocator_config config_for(gpumem::allocator_policy policy) {
  gpumem::allocator_config c;
  c.policy = policy;
  return c;
}

// The device calls the rules are about, whatever the device.
struct calls {
  std::size_t event_query = 0;
  std::size_t event_record = 0;
  std::size_t event_synchronize = 0;
  std::size_t free = 0;
  std::size_t mem_unmap = 0;
  std::size_t device_synchronize = 0;
};

// --- simulated_device: no capture, no work; the rules show in its call counters ---------------

struct sim_traits {
  using device = gpumem::simulated_device;
  static constexpr bool on_cudasim = false;
  static std::unique_ptr<device> make(int index) {
    gpumem::simulated_device_options o;
    o.capacity = 16 * GiB;
    o.index = index;
    return std::make_unique<device>(o);
  }
  static bool available(int) { return true; }
  static device::stream_type stream(device& d) { return d.create_stream(); }
  static void drop(device& d, device::stream_type s) { d.destroy_stream(s); }
  static void work(device&, device::stream_type, const void*, std::size_t, bool) {}
  static void begin_stream_capture(device::stream_type) {}
  static void end_stream_capture_and_replay(device::stream_type, int) {}
  static calls count(device& d) {
    const gpumem::call_counters c = d.counters();
    return {c.event_query, c.event_record, c.event_synchronize,
            c.free,        c.mem_unmap,    c.device_synchronize};
  }
  static void synchronize(device& d) { d.complete_all(); }
  static void check_clean() {}
};

#ifdef GPUMEM_TEST_CUDASIM

bool on_simulator() {
  const std::string m = cudasim_test::mode();
  return m == "conformance" || m == "conformance_slow" || m == "conformance_controls";
}

double work_seconds() {
  return cudasim_test::mode() == "conformance_slow" ? 100.0 : 0.0;
}

// The captured graph of the test under way (one at a time).
struct graph_state {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};
graph_state& current_graph() {
  static graph_state g;
  return g;
}

template <class Device>
struct cuda_traits {
  using device = Device;
  static constexpr bool on_cudasim = true;
  static std::unique_ptr<device> make(int index) { return std::make_unique<device>(index); }
  static bool available(int devices) {
    int n = 0;
    return on_simulator() && cudaGetDeviceCount(&n) == cudaSuccess && n >= devices;
  }
  static cudaStream_t stream(device& d) { return d.create_stream(); }
  static void drop(device& d, cudaStream_t s) { d.destroy_stream(s); }
  static void work(device& d, cudaStream_t s, const void* p, std::size_t bytes, bool write) {
    int previous = 0;
    ASSERT_EQ(cudaGetDevice(&previous), cudaSuccess);
    int owner = d.index();
    ASSERT_EQ(cudaStreamGetDevice(s, &owner), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(owner), cudaSuccess);  // a kernel runs on its stream's device
    const gpumemSimRange r = write ? cudasim_test::writes(p, bytes) : cudasim_test::reads(p, bytes);
    ASSERT_EQ(cudasim_test::launch_work(s, {r}, work_seconds()), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(previous), cudaSuccess);
  }
  static void begin_stream_capture(cudaStream_t s) {
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  }
  // Ends the capture (which must still be valid), instantiates it and launches it `launches`
  // times on the capture stream.
  static void end_stream_capture_and_replay(cudaStream_t s, int launches) {
    graph_state& g = current_graph();
    ASSERT_EQ(cudaStreamEndCapture(s, &g.graph), cudaSuccess) << "the capture was invalidated";
    ASSERT_EQ(cudaGraphInstantiate(&g.exec, g.graph, 0), cudaSuccess);
    for (int i = 0; i < launches; ++i) {
      ASSERT_EQ(cudaGraphLaunch(g.exec, s), cudaSuccess);
    }
  }
  static calls count(device&) {
    const gpumemSimCounters c = cudasim_test::counters();
    return {c.calls.event_query, c.calls.event_record, c.calls.event_synchronize,
            c.calls.free,        c.calls.mem_unmap,    c.calls.device_synchronize};
  }
  static void synchronize(device& d) { d.synchronize(); }
  static void check_clean() {
    EXPECT_EQ(cudasim_test::violations(), 0u) << cudasim_test::last_violation();
  }
};

void launch_current_graph(cudaStream_t s) {
  ASSERT_EQ(cudaGraphLaunch(current_graph().exec, s), cudaSuccess);
}

void destroy_current_graph() {
  graph_state& g = current_graph();
  if (g.exec != nullptr) {
    EXPECT_EQ(cudaGraphExecDestroy(g.exec), cudaSuccess);
  }
  if (g.graph != nullptr) {
    EXPECT_EQ(cudaGraphDestroy(g.graph), cudaSuccess);
  }
  g = graph_state{};
}

// Allocations during a capture: in relaxed mode, as the LibTorch adapter (and PyTorch) makes them.
struct relaxed_mode {
  cudaStreamCaptureMode previous = cudaStreamCaptureModeRelaxed;
  relaxed_mode() { EXPECT_EQ(cudaThreadExchangeStreamCaptureMode(&previous), cudaSuccess); }
  ~relaxed_mode() { EXPECT_EQ(cudaThreadExchangeStreamCaptureMode(&previous), cudaSuccess); }
  relaxed_mode(const relaxed_mode&) = delete;
  relaxed_mode& operator=(const relaxed_mode&) = delete;
};
#endif

template <class Traits, gpumem::allocator_policy Policy>
struct config {
  using traits = Traits;
  static constexpr gpumem::allocator_policy policy = Policy;
};

template <class Config>
class Conformance : public ::testing::Test {
 protected:
  using traits = typename Config::traits;
  using device_type = typename traits::device;
  using allocator = gpumem::caching_allocator<device_type>;
  using stream_type = typename device_type::stream_type;

  void SetUp() override {
    if (!traits::available(1)) {
      GTEST_SKIP() << "runs on the CUDA simulator (ctest -L capture sets GPUMEM_CUDASIM_TEST)";
    }
#ifdef GPUMEM_TEST_CUDASIM
    if (traits::on_cudasim) {
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      cudasim_test::reset_violations();
    }
#endif
    device_ = traits::make(0);
  }
  void TearDown() override {
    if (IsSkipped()) return;
    traits::check_clean();
  }

  std::unique_ptr<allocator> make_allocator() {
    return std::make_unique<allocator>(*device_, config_for(Config::policy));
  }

  void work(stream_type s, const void* p, std::size_t bytes, bool write = true) {
    traits::work(*device_, s, p, bytes, write);
  }

  std::unique_ptr<device_type> device_;
};

using configs = ::testing::Types<
    config<sim_traits, gpumem::allocator_policy::classic>,
    config<sim_traits, gpumem::allocator_policy::expandable>,
    config<sim_traits, gpumem::allocator_policy::stitch>
#ifdef GPUMEM_TEST_CUDASIM
    ,
    config<cuda_traits<gpumem::cuda_device>, gpumem::allocator_policy::classic>,
    config<cuda_traits<gpumem::cuda_vmm_device>, gpumem::allocator_policy::classic>,
    config<cuda_traits<gpumem::cuda_vmm_device>, gpumem::allocator_policy::expandable>,
    config<cuda_traits<gpumem::cuda_vmm_device>, gpumem::allocator_policy::stitch>
#endif
    >;

struct config_names {
  template <class C>
  static std::string GetName(int) {
    std::string device = C::traits::on_cudasim ? "cuda" : "simulated_device";
#ifdef GPUMEM_TEST_CUDASIM
    if (std::is_same_v<typename C::traits::device, gpumem::cuda_vmm_device>) {
      device = "cuda_vmm_device";
    } else if (std::is_same_v<typename C::traits::device, gpumem::cuda_device>) {
      device = "cuda_device";
    }
#endif
    return device + "_" + std::string(gpumem::to_string(C::policy));
  }
};

TYPED_TEST_SUITE(Conformance, configs, config_names);

// A training-step-like pattern: blocks written on their stream, read on a side stream after an
// event (record_stream), freed while that work is queued, reused at once, the cache emptied
// every other step (the unmaps must wait for the work).
TYPED_TEST(Conformance, WorkBetweenAllocationsAndFreesWithCrossStreamRecordStream) {
  using tr = typename TestFixture::traits;
  auto& d = *this->device_;
  auto alloc = this->make_allocator();
  auto main = tr::stream(d);
  auto side = tr::stream(d);
  for (int step = 0; step < 4; ++step) {
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (std::size_t size : {std::size_t{512}, 3 * MiB, 25 * MiB, 7 * MiB, 64 * MiB}) {
      void* p = alloc->allocate(size, main);
      this->work(main, p, size);
      blocks.emplace_back(p, size);
    }
    auto e = d.create_event();
    d.record_event(e, main);
    d.stream_wait_event(side, e);
    for (std::size_t i : {std::size_t{2}, std::size_t{4}}) {
      this->work(side, blocks[i].first, blocks[i].second, false);
      alloc->record_stream(blocks[i].first, side);
    }
    d.destroy_event(e);
    for (auto& [p, size] : blocks) alloc->deallocate(p);
    for (std::size_t size : {25 * MiB, 64 * MiB, 9 * MiB}) {
      void* p = alloc->allocate(size, main);
      this->work(main, p, size);
      alloc->deallocate(p);
    }
    if (step % 2 == 1) alloc->empty_cache();
    alloc->check_invariants();
  }
  alloc->empty_cache();
  EXPECT_EQ(alloc->usage().reserved, 0u);
  tr::drop(d, main);
  tr::drop(d, side);
}

// Stitch maps the free pages of a block cached on one stream into a request of another (no new
// memory): the GPU must order the second stream's work after the first's (cudaStreamWaitEvent),
// which the simulator checks on the physical pages, whatever address each stream uses.
TYPED_TEST(Conformance, APageReusedByAnotherStreamWaitsForTheFirstOnTheGpu) {
  using tr = typename TestFixture::traits;
  auto& d = *this->device_;
  auto alloc = this->make_allocator();
  auto first = tr::stream(d);
  auto second = tr::stream(d);
  void* x = alloc->allocate(8 * MiB, first);
  this->work(first, x, 8 * MiB);
  alloc->deallocate(x);  // cached, its work still queued
  const std::size_t reserved = alloc->usage().reserved;
  void* y = alloc->allocate(8 * MiB, second);
  if (TypeParam::policy == gpumem::allocator_policy::stitch) {
    EXPECT_EQ(alloc->usage().reserved, reserved);  // the pages were shared, not created
  }
  this->work(second, y, 8 * MiB);
  alloc->deallocate(y);
  tr::synchronize(d);
  alloc->empty_cache();
  alloc->check_invariants();
  tr::drop(d, first);
  tr::drop(d, second);
}

// torch.cuda.graph's allocator calls: the default pool's allocator and a private pool's, both
// told that a capture is under way; during it no event is queried or recorded by the allocator,
// a block used on the capturing stream and freed waits for the end, empty_cache is refused, and
// stitch makes no stream wait for another (a page last used on a stream outside the capture).
// The graph is replayed after the pool's empty_cache (its memory is fixed: nothing moves).
TYPED_TEST(Conformance, CaptureIntoAPrivatePool) {
  using tr = typename TestFixture::traits;
  auto& d = *this->device_;
  auto main_alloc = this->make_allocator();
  auto pool = this->make_allocator();
  pool->set_memory_fixed(true);
  auto main = tr::stream(d);
  auto side = tr::stream(d);
  auto cap = tr::stream(d);

  // Before the capture: a block that the capture will use, a cached block for an allocation
  // during it, and a block used on a side stream and freed last (its event still pending: only
  // the next allocation would query it), and pool memory last used on another stream than the
  // capture's.
  void* z = main_alloc->allocate(6 * MiB, main);
  this->work(main, z, 6 * MiB);
  void* warm = main_alloc->allocate(1 * MiB, side);  // cached for the allocation during capture
  main_alloc->deallocate(warm);
  void* y = main_alloc->allocate(8 * MiB, main);
  this->work(main, y, 8 * MiB);
  auto e = d.create_event();
  d.record_event(e, main);
  d.stream_wait_event(side, e);
  this->work(side, y, 8 * MiB, false);
  main_alloc->record_stream(y, side);
  main_alloc->deallocate(y);
  void* elsewhere = pool->allocate(24 * MiB, side);
  this->work(side, elsewhere, 24 * MiB);
  pool->deallocate(elsewhere);
  d.record_event(e, side);
  d.stream_wait_event(cap, e);
  d.record_event(e, main);
  d.stream_wait_event(cap, e);
  tr::synchronize(d);
  d.destroy_event(e);

  main_alloc->begin_capture();
  pool->begin_capture();
  tr::begin_stream_capture(cap);
  const calls before = tr::count(d);
  void* out = nullptr;
  {
#ifdef GPUMEM_TEST_CUDASIM
    std::unique_ptr<relaxed_mode> relaxed;
    if (tr::on_cudasim) relaxed = std::make_unique<relaxed_mode>();
#endif
    void* other = main_alloc->allocate(1 * MiB, side);  // another stream, same allocator
    void* t = pool->allocate(10 * MiB, cap);
    this->work(cap, t, 10 * MiB);
    this->work(cap, z, 6 * MiB, false);
    main_alloc->record_stream(z, cap);
    main_alloc->deallocate(z);  // deferred: no event recorded in the capture
    pool->deallocate(t);
    out = pool->allocate(10 * MiB, cap);  // reuses t's memory within the capture
    this->work(cap, out, 10 * MiB);
    void* u = pool->allocate(12 * MiB, cap);  // a size class of its own (stitch: a miss)
    this->work(cap, u, 12 * MiB);
    pool->deallocate(u);
    main_alloc->deallocate(other);
    main_alloc->empty_cache();  // skipped during a capture, as PyTorch skips it
    pool->empty_cache();
  }
  const calls during = tr::count(d);
  EXPECT_EQ(during.event_query, before.event_query) << "an event was queried during the capture";
  EXPECT_EQ(during.event_record, before.event_record) << "an event was recorded in the capture";
  EXPECT_EQ(during.event_synchronize, before.event_synchronize);
  EXPECT_EQ(during.free, before.free);
  EXPECT_EQ(during.mem_unmap, before.mem_unmap);
  const auto pending = [&] {
    std::size_t n = 0;
    for (const auto& s : main_alloc->snapshot()) {
      for (const auto& b : s.blocks) n += b.state == gpumem::block_state::active_pending_free;
    }
    return n;
  };
  EXPECT_GE(pending(), 1u) << "z must wait for the capture's end";
  tr::end_stream_capture_and_replay(cap, 2);
  main_alloc->end_capture();
  pool->end_capture();
  EXPECT_THROW(pool->end_capture(), gpumem::usage_error);
  main_alloc->check_invariants();
  pool->check_invariants();

  pool->empty_cache();  // the pool's memory is fixed: the graph's addresses stay mapped
#ifdef GPUMEM_TEST_CUDASIM
  if constexpr (tr::on_cudasim) launch_current_graph(cap);
#endif
  // The next allocation records the deferred events (on the capture stream, after the launches).
  const calls after_capture = tr::count(d);
  void* small = main_alloc->allocate(512, main);
  EXPECT_GT(tr::count(d).event_record, after_capture.event_record);
  main_alloc->deallocate(small);
  tr::synchronize(d);
#ifdef GPUMEM_TEST_CUDASIM
  if constexpr (tr::on_cudasim) destroy_current_graph();
#endif
  pool->deallocate(out);
  pool->set_memory_fixed(false);  // the pool is released: its memory may go
  pool->empty_cache();
  EXPECT_EQ(pool->usage().reserved, 0u);
  main_alloc->empty_cache();
  EXPECT_EQ(main_alloc->usage().reserved, 0u);
  main_alloc->check_invariants();
  tr::drop(d, main);
  tr::drop(d, side);
  tr::drop(d, cap);
}

// PyTorch's graph_capture_record_stream_reuse: during a capture, a block freed with record_stream
// uses is not reused while the graph leaves its use on another stream unordered with the
// allocating stream's next work (no event can be recorded or queried in a capture), and is reused
// once that stream joined back. Devices that expose no capture graph keep such blocks until the
// capture ends; with the setting off every device does.
TYPED_TEST(Conformance, CaptureReusesARecordStreamBlockOnceItsStreamsJoinBack) {
  using tr = typename TestFixture::traits;
  auto& d = *this->device_;
  for (const bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "graph_capture_record_stream_reuse on" : "off");
    auto pool = this->make_allocator();
    pool->set_memory_fixed(true);
    pool->set_capture_record_stream_reuse(reuse);
    auto s1 = tr::stream(d);
    auto s2 = tr::stream(d);
    auto e = d.create_event();
    pool->begin_capture();
    tr::begin_stream_capture(s1);
    void* data1 = nullptr;
    void* data2 = nullptr;
    void* data3 = nullptr;
    void* sink = nullptr;
    {
#ifdef GPUMEM_TEST_CUDASIM
      std::unique_ptr<relaxed_mode> relaxed;
      if (tr::on_cudasim) relaxed = std::make_unique<relaxed_mode>();
#endif
      sink = pool->allocate(1 * MiB, s1);
      data1 = pool->allocate(1 * MiB, s1);
      this->work(s1, data1, 1 * MiB);
      d.record_event(e, s1);  // fork: s2 reads data1 after s1 wrote it
      d.stream_wait_event(s2, e);
      this->work(s2, data1, 1 * MiB, false);
      pool->record_stream(data1, s2);
      pool->deallocate(data1);
      // Before the join: s2's read is not ordered before s1's next work.
      data2 = pool->allocate(1 * MiB, s1);
      EXPECT_NE(data2, data1);
      this->work(s1, data2, 1 * MiB);
      d.record_event(e, s2);  // join: s1 waits for s2, then works on
      d.stream_wait_event(s1, e);
      this->work(s1, sink, 1 * MiB);
      data3 = pool->allocate(1 * MiB, s1);
      this->work(s1, data3, 1 * MiB);
    }
    if (reuse && gpumem::detail::has_capture_graph_v<typename tr::device>) {
      EXPECT_EQ(data3, data1) << "data1's block was not reused after s2 joined back";
    } else {
      EXPECT_NE(data3, data1);
    }
    pool->check_invariants();
    tr::end_stream_capture_and_replay(s1, 1);
    pool->end_capture();
    tr::synchronize(d);
#ifdef GPUMEM_TEST_CUDASIM
    if constexpr (tr::on_cudasim) destroy_current_graph();
#endif
    for (void* p : {sink, data2, data3}) pool->deallocate(p);
    pool->check_invariants();
    pool->set_memory_fixed(false);
    pool->empty_cache();
    EXPECT_EQ(pool->usage().reserved, 0u);
    d.destroy_event(e);
    tr::drop(d, s1);
    tr::drop(d, s2);
  }
}

// A miss during a capture that the device cannot serve fails at once: no out-of-memory retry (it
// would synchronise, and free or unmap memory the captured work uses). The capture stays valid
// and its graph replays on memory that is still there.
TYPED_TEST(Conformance, OutOfMemoryDuringACaptureReleasesNothing) {
  using tr = typename TestFixture::traits;
  auto& d = *this->device_;
  auto pool = this->make_allocator();
  pool->set_memory_fraction(0.125);  // 2 GiB of 16
  auto cap = tr::stream(d);
  auto side = tr::stream(d);
  void* a = pool->allocate(1 * GiB, side);
  this->work(side, a, 1 * GiB);
  pool->deallocate(a);  // cached: the retry would free (or unmap, or share) it
  tr::synchronize(d);
  pool->begin_capture();
  tr::begin_stream_capture(cap);
  const calls before = tr::count(d);
  {
#ifdef GPUMEM_TEST_CUDASIM
    std::unique_ptr<relaxed_mode> relaxed;
    if (tr::on_cudasim) relaxed = std::make_unique<relaxed_mode>();
#endif
    void* b = pool->allocate(100 * MiB, cap);
    this->work(cap, b, 100 * MiB);
    EXPECT_THROW(pool->allocate(1536 * MiB, cap), gpumem::out_of_memory);
    pool->deallocate(b);
  }
  const calls during = tr::count(d);
  EXPECT_EQ(during.free, before.free);
  EXPECT_EQ(during.mem_unmap, before.mem_unmap);
  EXPECT_EQ(during.event_synchronize, before.event_synchronize);
  EXPECT_EQ(during.device_synchronize, before.device_synchronize);
  tr::end_stream_capture_and_replay(cap, 2);
  pool->end_capture();
  tr::synchronize(d);
#ifdef GPUMEM_TEST_CUDASIM
  if constexpr (tr::on_cudasim) destroy_current_graph();
#endif
  // Outside the capture the retry runs again: the cache goes, the request fits.
  void* c = pool->allocate(1536 * MiB, cap);
  pool->deallocate(c);
  pool->empty_cache();
  EXPECT_EQ(pool->usage().reserved, 0u);
  tr::drop(d, cap);
  tr::drop(d, side);
}

// A private pool's memory stays put while the pool lives: a miss fails rather than free or unmap
// its cache, empty_cache leaves it; once released, empty_cache returns it.
TYPED_TEST(Conformance, APoolsMemoryStaysPutUntilItIsReleased) {
  using tr = typename TestFixture::traits;
  auto& d = *this->device_;
  auto pool = this->make_allocator();
  pool->set_memory_fixed(true);
  pool->set_memory_fraction(0.125);
  auto s = tr::stream(d);
  auto side = tr::stream(d);
  void* a = pool->allocate(1200 * MiB, side);
  this->work(side, a, 1200 * MiB);
  pool->deallocate(a);
  tr::synchronize(d);
  const std::size_t reserved = pool->usage().reserved;
  const calls before = tr::count(d);
  void* big = nullptr;
  try {
    big = pool->allocate(1800 * MiB, s);  // stitch may map the free pages here as well
  } catch (const gpumem::out_of_memory&) {
  }
  if (TypeParam::policy != gpumem::allocator_policy::stitch) {
    EXPECT_EQ(big, nullptr);
  }
  pool->empty_cache();
  const calls after = tr::count(d);
  EXPECT_EQ(after.free, before.free);
  EXPECT_EQ(after.mem_unmap, before.mem_unmap);
  EXPECT_GE(pool->usage().reserved, reserved);
  if (big != nullptr) pool->deallocate(big);
  pool->set_memory_fixed(false);
  void* b = pool->allocate(1800 * MiB, s);  // the retry may free the cache now
  this->work(s, b, 1800 * MiB);
  pool->deallocate(b);
  pool->empty_cache();
  EXPECT_EQ(pool->usage().reserved, 0u);
  tr::drop(d, s);
  tr::drop(d, side);
}

// The memory fraction counts every allocator sharing the limit (a device's default pool and its
// private pools), as PyTorch counts its private pools.
TYPED_TEST(Conformance, TheMemoryFractionCountsThePrivatePools) {
  using tr = typename TestFixture::traits;
  auto& d = *this->device_;
  auto main_alloc = this->make_allocator();
  auto pool = this->make_allocator();
  pool->share_memory_limit_with(*main_alloc);
  main_alloc->set_memory_fraction(0.25);  // 4 GiB of 16
  pool->set_memory_fraction(0.25);
  auto s = tr::stream(d);
  void* a = pool->allocate(3 * GiB, s);
  EXPECT_THROW(main_alloc->allocate(2 * GiB, s), gpumem::out_of_memory);
  pool->deallocate(a);
  pool->empty_cache();
  void* b = main_alloc->allocate(2 * GiB, s);
  main_alloc->deallocate(b);
  main_alloc->empty_cache();
  tr::drop(d, s);
}

// Two devices: a block of device 0 read by a kernel on device 1 (peer access; for VMM memory,
// add_peer_access grants device 1 every page, mapped now or later) and recorded on device 1's
// stream: the event is made on device 1, and the block is reused only after that work.
TYPED_TEST(Conformance, TwoDevicesWithPeerAccessAndCrossDeviceRecordStream) {
  using tr = typename TestFixture::traits;
  if (!tr::on_cudasim || !tr::available(2)) {
    GTEST_SKIP() << "needs two devices of the CUDA simulator";
  }
#ifdef GPUMEM_TEST_CUDASIM
  if constexpr (tr::on_cudasim) {
    auto& d0 = *this->device_;
    auto d1 = tr::make(1);
    auto a0 = this->make_allocator();
    auto a1 = std::make_unique<typename TestFixture::allocator>(*d1, config_for(TypeParam::policy));
    auto s0 = tr::stream(d0);
    auto s1 = tr::stream(*d1);
    void* before_peer = a0->allocate(20 * MiB, s0);  // mapped before the peer is added
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    const cudaError_t enabled = cudaDeviceEnablePeerAccess(0, 0);
    ASSERT_TRUE(enabled == cudaSuccess || enabled == cudaErrorPeerAccessAlreadyEnabled);
    (void)cudaGetLastError();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    a0->add_peer_access(1);
    void* after_peer = a0->allocate(30 * MiB, s0);
    for (int round = 0; round < 3; ++round) {
      for (auto [p, size] : {std::pair<void*, std::size_t>{before_peer, 20 * MiB},
                             std::pair<void*, std::size_t>{after_peer, 30 * MiB}}) {
        this->work(s0, p, size);
        cudaEvent_t e = nullptr;
        ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
        ASSERT_EQ(cudaEventRecord(e, s0), cudaSuccess);
        ASSERT_EQ(cudaStreamWaitEvent(s1, e, 0), cudaSuccess);
        this->work(s1, p, size, false);  // device 1 reads device 0's memory
        a0->record_stream(p, s1);
        ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
      }
      a0->deallocate(before_peer);
      a0->deallocate(after_peer);
      before_peer = a0->allocate(20 * MiB, s0);  // reused after device 1's reads only
      this->work(s0, before_peer, 20 * MiB);
      after_peer = a0->allocate(30 * MiB, s0);
      this->work(s0, after_peer, 30 * MiB);
      // Device 1's own allocator, used on its own stream meanwhile (with device 1 current, as
      // PyTorch allocates: the simulator reserves addresses in the current device's range).
      ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
      void* own = a1->allocate(4 * MiB, s1);
      this->work(s1, own, 4 * MiB);
      a1->deallocate(own);
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      a0->check_invariants();
    }
    a0->deallocate(before_peer);
    a0->deallocate(after_peer);
    a0->empty_cache();
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    a1->empty_cache();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(a0->usage().reserved, 0u);
    tr::drop(d0, s0);
    tr::drop(*d1, s1);
    a1.reset();
    d1.reset();
  }
#endif
}

#ifdef GPUMEM_TEST_CUDASIM

// The pinned pool's memory is copied to several GPUs: an event recorded on another GPU's stream
// is made on that GPU, and the block is reused only after that copy.
TEST(ConformancePinnedPool, RecordEventOnAnotherGpusStream) {
  if (!cuda_traits<gpumem::cuda_device>::available(2)) {
    GTEST_SKIP() << "needs two devices of the CUDA simulator";
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudasim_test::reset_violations();
  gpumem::cuda_host_device host(0);
  gpumem::pinned_pool<gpumem::cuda_host_device> pool(host, gpumem::allocator_config{});
  gpumem::cuda_device gpu1(1);
  const cudaStream_t s1 = gpu1.create_stream();
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  void* device_buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&device_buffer, 4 * MiB), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  for (int round = 0; round < 4; ++round) {
    void* src = pool.allocate(4 * MiB);
    ASSERT_EQ(cudaMemcpyAsync(device_buffer, src, 4 * MiB, cudaMemcpyHostToDevice, s1),
              cudaSuccess);
    pool.record_event(src, s1);
    pool.deallocate(src);  // must not throw: the event is device 1's
    void* next = pool.allocate(4 * MiB);
    if (work_seconds() > 0) {  // the copy outlasts the test: its block cannot be reused yet
      EXPECT_NE(next, src) << "reused before the copy on device 1 was known complete";
    }
    pool.deallocate(next);
    ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  }
  pool.empty_cache();
  ASSERT_EQ(cudaFree(device_buffer), cudaSuccess);
  gpu1.destroy_stream(s1);
  EXPECT_EQ(cudasim_test::violations(), 0u) << cudasim_test::last_violation();
}

// --- Controls: the defects the suite guards against, reproduced by hand, are reported ---------

class ConformanceControls : public ::testing::Test {
 protected:
  void SetUp() override {
    GPUMEM_REQUIRE_SIM_MODE("conformance_controls");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudasim_test::reset_violations();
  }
  void TearDown() override {
    if (IsSkipped()) return;
    cudasim_test::reset_violations();
  }
};

// What a graph's private pool must not do: free its memory while the graph lives. Freeing the
// pool's cache (as an unfixed pool's empty_cache or out-of-memory retry would) under the graph
// makes its next launch touch memory that is gone.
TEST_F(ConformanceControls, FreeingAGraphPoolsMemoryUnderTheGraphIsReported) {
  for (auto policy : {gpumem::allocator_policy::classic, gpumem::allocator_policy::expandable,
                      gpumem::allocator_policy::stitch}) {
    SCOPED_TRACE(gpumem::to_string(policy));
    cudasim_test::reset_violations();
    gpumem::cuda_vmm_device d(0);
    gpumem::caching_allocator<gpumem::cuda_vmm_device> pool(d, config_for(policy));
    cudaStream_t cap = d.create_stream();
    void* warm = pool.allocate(16 * MiB, cap);  // the capture reuses this memory
    pool.deallocate(warm);
    pool.begin_capture();
    ASSERT_EQ(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal), cudaSuccess);
    void* t = pool.allocate(16 * MiB, cap);
    ASSERT_EQ(cudasim_test::launch_work(cap, {cudasim_test::writes(t, 16 * MiB)}), cudaSuccess);
    pool.deallocate(t);
    cuda_traits<gpumem::cuda_vmm_device>::end_stream_capture_and_replay(cap, 1);
    pool.end_capture();
    d.synchronize();
    pool.empty_cache();  // the defect: the pool is not fixed, its memory goes
    ASSERT_EQ(cudaGraphLaunch(current_graph().exec, cap), cudaSuccess);
    EXPECT_GE(cudasim_test::counters().violations_unmapped, 1u);
    cudasim_test::reset_violations();
    (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
    destroy_current_graph();
    d.destroy_stream(cap);
  }
}

// What add_peer_access is for: VMM memory read by a peer's kernel without cuMemSetAccess for it
// is reported (peer access from cudaDeviceEnablePeerAccess does not cover it).
TEST_F(ConformanceControls, APeerWithoutVmmAccessIsReported) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  if (n < 2) GTEST_SKIP() << "needs two devices";
  gpumem::cuda_vmm_device d0(0);
  gpumem::cuda_vmm_device d1(1);
  gpumem::caching_allocator<gpumem::cuda_vmm_device> a0(
      d0, config_for(gpumem::allocator_policy::expandable));
  cudaStream_t s0 = d0.create_stream();
  cudaStream_t s1 = d1.create_stream();
  void* p = a0.allocate(8 * MiB, s0);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  const cudaError_t enabled = cudaDeviceEnablePeerAccess(0, 0);
  ASSERT_TRUE(enabled == cudaSuccess || enabled == cudaErrorPeerAccessAlreadyEnabled);
  (void)cudaGetLastError();
  ASSERT_EQ(cudasim_test::launch_work(s1, {cudasim_test::reads(p, 8 * MiB)}), cudaSuccess);
  EXPECT_GE(cudasim_test::counters().violations_inaccessible, 1u);
  cudasim_test::reset_violations();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  a0.add_peer_access(1);  // the fix: now it may
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudasim_test::launch_work(s1, {cudasim_test::reads(p, 8 * MiB)}), cudaSuccess);
  EXPECT_EQ(cudasim_test::violations(), 0u) << cudasim_test::last_violation();
  ASSERT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  a0.deallocate(p);
  a0.empty_cache();
  d0.destroy_stream(s0);
  d1.destroy_stream(s1);
}

#endif

}  // namespace
