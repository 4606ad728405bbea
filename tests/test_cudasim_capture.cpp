// Stream capture and graphs on the CUDA simulator: the three capture modes and what each
// prohibits, invalidation, captured events, cross-stream capture, and graphs whose launches
// re-issue the captured work (checked again at every launch).
//
// ctest runs it with GPUMEM_CUDASIM_TEST=capture (label capture; work takes no time). Everything
// skips elsewhere.
#include <gtest/gtest.h>

#ifdef GPUMEM_TEST_CUDASIM

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "cudasim_support.hpp"

namespace {

using namespace cudasim_test;  // NOLINT: the tests' helpers

class CudaSimCapture : public ::testing::Test {
 protected:
  void SetUp() override {
    GPUMEM_REQUIRE_SIM_MODE("capture");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    reset_violations();
    ASSERT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&t_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&buffer_, 4 * MiB), cudaSuccess);
  }
  void TearDown() override {
    if (IsSkipped()) return;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
    EXPECT_EQ(cudaStreamIsCapturing(s_, &st), cudaSuccess);
    EXPECT_EQ(st, cudaStreamCaptureStatusNone) << "a test left a capture under way";
    EXPECT_EQ(cudaFree(buffer_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(s_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(t_), cudaSuccess);
    EXPECT_EQ(violations(), 0u) << last_violation();
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a test left an error behind";
    const gpumemSimCounters c = counters();
    EXPECT_EQ(c.live_graphs, 0u);
    EXPECT_EQ(c.live_graph_execs, 0u);
  }

  cudaStreamCaptureStatus status(cudaStream_t stream) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(stream, &st), cudaSuccess);
    return st;
  }

  // Ends the capture of s_, expecting `expected`; returns the graph (nullptr on failure).
  cudaGraph_t end(cudaError_t expected = cudaSuccess) {
    cudaGraph_t g = reinterpret_cast<cudaGraph_t>(std::uintptr_t{1});
    EXPECT_EQ(cudaStreamEndCapture(s_, &g), expected);
    if (expected != cudaSuccess) {
      EXPECT_EQ(g, nullptr);
      (void)cudaGetLastError();
    }
    return g;
  }

  cudaStream_t s_ = nullptr;
  cudaStream_t t_ = nullptr;
  void* buffer_ = nullptr;
};

TEST_F(CudaSimCapture, CapturedWorkRunsAtEveryGraphLaunch) {
  const gpumemSimCounters before = counters();
  EXPECT_EQ(status(s_), cudaStreamCaptureStatusNone);
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(status(s_), cudaStreamCaptureStatusActive);
  EXPECT_EQ(status(t_), cudaStreamCaptureStatusNone);
  ASSERT_EQ(cudaMemsetAsync(buffer_, 0, MiB, s_), cudaSuccess);
  ASSERT_EQ(launch_work(s_, {reads(buffer_, MiB), writes(static_cast<char*>(buffer_) + MiB, MiB)}),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(static_cast<char*>(buffer_) + 2 * MiB, buffer_, MiB,
                            cudaMemcpyDeviceToDevice, s_),
            cudaSuccess);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t building = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  std::size_t n_deps = 0;
  ASSERT_EQ(cudaStreamGetCaptureInfo(s_, &st, &id, &building, &deps, nullptr, &n_deps),
            cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  EXPECT_NE(id, 0u);
  EXPECT_NE(building, nullptr);
  EXPECT_EQ(n_deps, 1u);  // the copy, the last node
  ASSERT_NE(deps, nullptr);
  // Nothing ran: the captured work is not work in flight.
  EXPECT_EQ(counters().pending_works, 0u);
  cudaGraph_t graph = end();
  ASSERT_EQ(graph, building);
  EXPECT_EQ(status(s_), cudaStreamCaptureStatusNone);
  std::size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 3u);
  cudaGraphNode_t list[4] = {};
  std::size_t room = 4;
  ASSERT_EQ(cudaGraphGetNodes(graph, list, &room), cudaSuccess);
  EXPECT_EQ(room, 3u);
  EXPECT_EQ(list[3], nullptr);
  std::size_t n = 0;
  ASSERT_EQ(cudaGraphNodeGetDependencies(list[2], nullptr, nullptr, &n), cudaSuccess);
  EXPECT_EQ(n, 1u);
  cudaGraphNode_t dep = nullptr;
  ASSERT_EQ(cudaGraphNodeGetDependencies(list[2], &dep, nullptr, &n), cudaSuccess);
  EXPECT_EQ(dep, list[1]);

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch),
            cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);  // the executable graph keeps its own nodes
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);
  EXPECT_EQ(counters().pending_works, 3u);  // three launches, each one piece of work
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  const gpumemSimCounters after = counters();
  EXPECT_EQ(after.captures - before.captures, 1u);
  EXPECT_EQ(after.graph_launches - before.graph_launches, 3u);
  EXPECT_EQ(after.violations, 0u) << last_violation();

  // Work is checked at each launch: a launch after the memory went away faults.
  void* gone = nullptr;
  ASSERT_EQ(cudaMalloc(&gone, MiB), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(launch_work(s_, {writes(gone, MiB)}), cudaSuccess);
  graph = end();
  cudaGraphExec_t stale = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&stale, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(stale, s_), cudaSuccess);
  ASSERT_EQ(cudaFree(gone), cudaSuccess);
  EXPECT_EQ(violations(), 0u);
  ASSERT_EQ(cudaGraphLaunch(stale, s_), cudaSuccess);
  EXPECT_EQ(counters().violations_unmapped, 1u);
  EXPECT_NE(last_violation().find("cudaGraphLaunch of graph exec"), std::string::npos)
      << last_violation();
  EXPECT_EQ(cudaStreamSynchronize(s_), cudaErrorIllegalAddress);
  reset_violations();

  EXPECT_EQ(cudaGraphExecDestroy(stale), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST_F(CudaSimCapture, GlobalModeProhibitsUnsafeCallsAndInvalidatesTheCapture) {
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(buffer_, 0, 64, s_), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, MiB), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(status(s_), cudaStreamCaptureStatusInvalidated);
  // Further work in the invalidated capture fails; ending it returns no graph.
  EXPECT_EQ(cudaMemsetAsync(buffer_, 0, 64, s_), cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  end(cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(counters().captures_invalidated, 1u);
  // The stream works normally again.
  EXPECT_EQ(cudaMemsetAsync(buffer_, 0, 64, s_), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s_), cudaSuccess);

  // The other unsafe calls: freeing, pinned memory, synchronous copies.
  for (int call = 0; call < 5; ++call) {
    SCOPED_TRACE(call);
    ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
    void* host = nullptr;
    char local[16] = {};
    switch (call) {
      case 0:
        EXPECT_EQ(cudaFree(buffer_), cudaErrorStreamCaptureUnsupported);
        break;
      case 1:
        EXPECT_EQ(cudaMallocHost(&host, 64), cudaErrorStreamCaptureUnsupported);
        break;
      case 2:
        EXPECT_EQ(cudaHostRegister(local, sizeof local, 0), cudaErrorStreamCaptureUnsupported);
        break;
      case 3:
        EXPECT_EQ(cudaMemcpy(local, buffer_, sizeof local, cudaMemcpyDeviceToHost),
                  cudaErrorStreamCaptureUnsupported);
        break;
      default:
        EXPECT_EQ(cudaMemset(buffer_, 0, 16), cudaErrorStreamCaptureUnsupported);
        break;
    }
    (void)cudaGetLastError();
    end(cudaErrorStreamCaptureInvalidated);
  }
}

TEST_F(CudaSimCapture, RelaxedThreadModeMayMakeUnsafeCalls) {
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, MiB), cudaSuccess);  // as PyTorch's allocator does during capture
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeRelaxed);
  ASSERT_EQ(launch_work(s_, {writes(p, MiB)}), cudaSuccess);
  cudaGraph_t g = end();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);

  // A capture begun in relaxed mode prohibits nothing, even on its own thread.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, MiB), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  g = end();
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
}

TEST_F(CudaSimCapture, OtherThreadsFollowTheirOwnMode) {
  // A global-mode capture prohibits unsafe calls in other threads in global mode...
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::thread([] {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, MiB), cudaErrorStreamCaptureUnsupported);
  }).join();
  EXPECT_EQ(status(s_), cudaStreamCaptureStatusInvalidated);
  end(cudaErrorStreamCaptureInvalidated);
  // ...not in thread-local mode,
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::thread([] {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, MiB), cudaSuccess);
    EXPECT_EQ(cudaFree(p), cudaSuccess);
  }).join();
  EXPECT_EQ(status(s_), cudaStreamCaptureStatusActive);
  EXPECT_EQ(cudaGraphDestroy(end()), cudaSuccess);
  // ...and a thread-local capture prohibits nothing in other threads, only in its own.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  std::thread([] {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, MiB), cudaSuccess);
    EXPECT_EQ(cudaFree(p), cudaSuccess);
  }).join();
  EXPECT_EQ(status(s_), cudaStreamCaptureStatusActive);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, MiB), cudaErrorStreamCaptureUnsupported);
  (void)cudaGetLastError();
  end(cudaErrorStreamCaptureInvalidated);
}

TEST_F(CudaSimCapture, SynchronisingWhatIsCapturedIsUnsupported) {
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE(call);
    ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed), cudaSuccess);
    switch (call) {
      case 0:
        EXPECT_EQ(cudaStreamSynchronize(s_), cudaErrorStreamCaptureUnsupported);
        break;
      case 1:
        EXPECT_EQ(cudaStreamQuery(s_), cudaErrorStreamCaptureUnsupported);
        break;
      default:
        EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
        break;
    }
    (void)cudaGetLastError();
    EXPECT_EQ(status(s_), cudaStreamCaptureStatusInvalidated);
    end(cudaErrorStreamCaptureInvalidated);
  }
  // Other streams may be synchronised during a capture.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(t_), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(t_), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(end()), cudaSuccess);
}

TEST_F(CudaSimCapture, AnEventRecordedInACaptureCannotBeQueriedOrWaitedFor) {
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE(call);
    ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(e, s_), cudaSuccess);
    EXPECT_EQ(call == 0 ? cudaEventQuery(e) : cudaEventSynchronize(e), cudaErrorCapturedEvent);
    EXPECT_EQ(cudaGetLastError(), cudaErrorCapturedEvent);
    EXPECT_EQ(status(s_), cudaStreamCaptureStatusInvalidated);
    end(cudaErrorStreamCaptureInvalidated);
  }
  // Recorded again outside a capture, it is an ordinary event.
  ASSERT_EQ(cudaEventRecord(e, s_), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(e), cudaSuccess);
  // The right way: the capture records and waits within itself.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s_, e, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(end()), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

TEST_F(CudaSimCapture, WaitingForACapturedEventJoinsTheCapture) {
  cudaEvent_t fork = nullptr;
  cudaEvent_t join = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  char* b = static_cast<char*>(buffer_);
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(launch_work(s_, {writes(b, MiB)}), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, s_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(t_, fork, 0), cudaSuccess);
  EXPECT_EQ(status(t_), cudaStreamCaptureStatusActive);  // t_ joined the capture
  unsigned long long s_id = 0;
  unsigned long long t_id = 0;
  cudaStreamCaptureStatus st{};
  ASSERT_EQ(cudaStreamGetCaptureInfo(s_, &st, &s_id), cudaSuccess);
  ASSERT_EQ(cudaStreamGetCaptureInfo(t_, &st, &t_id), cudaSuccess);
  EXPECT_EQ(s_id, t_id);
  ASSERT_EQ(launch_work(t_, {reads(b, MiB), writes(b + MiB, MiB)}), cudaSuccess);
  ASSERT_EQ(launch_work(s_, {writes(b + 2 * MiB, MiB)}), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(join, t_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s_, join, 0), cudaSuccess);
  cudaGraph_t g = end();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(status(t_), cudaStreamCaptureStatusNone);  // it left the capture with s_
  std::size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(g, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 3u);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, t_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(t_), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);

  // A fork that is not joined back fails the capture.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, s_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(t_, fork, 0), cudaSuccess);
  ASSERT_EQ(launch_work(t_, {}), cudaSuccess);
  end(cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(status(t_), cudaStreamCaptureStatusNone);
  // Ending it on the stream that joined is not allowed either.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, s_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(t_, fork, 0), cudaSuccess);
  cudaGraph_t none = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(t_, &none), cudaErrorStreamCaptureUnmatched);
  (void)cudaGetLastError();
  end(cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaEventDestroy(fork), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(join), cudaSuccess);
}

TEST_F(CudaSimCapture, DependenciesMayNotCrossTheCapturesBoundary) {
  cudaEvent_t outside = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(outside, t_), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s_, outside, 0), cudaErrorStreamCaptureIsolation);
  (void)cudaGetLastError();
  end(cudaErrorStreamCaptureInvalidated);
  // As an external event node it is allowed: each launch waits for it.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s_, outside, cudaEventWaitExternal), cudaSuccess);
  ASSERT_EQ(launch_work(s_, {writes(buffer_, MiB)}), cudaSuccess);
  ASSERT_EQ(cudaEventRecordWithFlags(outside, s_, cudaEventRecordExternal), cudaSuccess);
  cudaGraph_t g = end();
  std::size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(g, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 3u);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  ASSERT_EQ(launch_work(t_, {writes(buffer_, MiB)}), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(outside, t_), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);  // waits for t_'s write: no race
  EXPECT_EQ(violations(), 0u) << last_violation();
  // The launch recorded the event again: waiting for it orders after the graph's write.
  ASSERT_EQ(cudaStreamWaitEvent(t_, outside, 0), cudaSuccess);
  ASSERT_EQ(launch_work(t_, {writes(buffer_, MiB)}), cudaSuccess);
  EXPECT_EQ(violations(), 0u) << last_violation();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(outside), cudaSuccess);
}

TEST_F(CudaSimCapture, TheLegacyStreamConflictsWithABlockingCapture) {
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal), cudaSuccess);
  // Asking the legacy stream is an error that does not invalidate the capture...
  cudaStreamCaptureStatus st{};
  EXPECT_EQ(cudaStreamIsCapturing(nullptr, &st), cudaErrorStreamCaptureImplicit);
  (void)cudaGetLastError();
  EXPECT_EQ(status(blocking), cudaStreamCaptureStatusActive);
  // ...using it does.
  EXPECT_EQ(cudaMemsetAsync(buffer_, 0, 64, nullptr), cudaErrorStreamCaptureImplicit);
  (void)cudaGetLastError();
  EXPECT_EQ(status(blocking), cudaStreamCaptureStatusInvalidated);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(blocking, &g), cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  // A non-blocking capture leaves the legacy stream alone.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(buffer_, 0, 64, nullptr), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(end()), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
}

TEST_F(CudaSimCapture, BeginAndEndFollowTheRules) {
  // Not one of the three modes, yet a value the enumeration can hold (its enumerators 0..2 give it
  // the range 0..3; a value past that would be undefined behaviour in the caller already).
  int bad_mode = 3;
  cudaStreamCaptureMode mode{};
  std::memcpy(&mode, &bad_mode, sizeof mode);
  EXPECT_EQ(cudaStreamBeginCapture(s_, mode), cudaErrorInvalidValue);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s_, &g), cudaErrorIllegalState);  // not capturing
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
  EXPECT_EQ(cudaStreamEndCapture(s_, nullptr), cudaErrorInvalidValue);
  // Not begun in relaxed mode: it must end on its own thread.
  std::thread([&] {
    cudaGraph_t other = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s_, &other), cudaErrorStreamCaptureWrongThread);
  }).join();
  EXPECT_EQ(status(s_), cudaStreamCaptureStatusActive);
  EXPECT_EQ(cudaGraphDestroy(end()), cudaSuccess);
  // Begun in relaxed mode, any thread may end it.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  std::thread([&] {
    cudaGraph_t other = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s_, &other), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(other), cudaSuccess);
  }).join();
  (void)cudaGetLastError();
}

TEST_F(CudaSimCapture, GraphsMadeByHandAndPrintedAsDot) {
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaGraphCreate(&g, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphCreate(&g, 1), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);  // empty: nothing happens
  EXPECT_EQ(cudaGraphInstantiate(&exec, g, 1ull << 40), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);

  // A graph being captured into can be looked at, not destroyed or instantiated.
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(buffer_, 0, 64, s_), cudaSuccess);
  ASSERT_EQ(launch_work(s_, {reads(buffer_, 64)}), cudaSuccess);
  cudaStreamCaptureStatus st{};
  cudaGraph_t building = nullptr;
  ASSERT_EQ(cudaStreamGetCaptureInfo(s_, &st, nullptr, &building), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(building), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphInstantiate(&exec, building, 0), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  g = end();
  const std::string path = ::testing::TempDir() + "cudasim_graph.dot";
  ASSERT_EQ(cudaGraphDebugDotPrint(g, path.c_str(), 0), cudaSuccess);
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_NE(text.str().find("digraph"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("cudaMemsetAsync"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("n0 -> n1"), std::string::npos) << text.str();
  std::remove(path.c_str());
  std::size_t used = 1;
  ASSERT_EQ(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &used), cudaSuccess);
  EXPECT_EQ(used, 0u);
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
}

TEST_F(CudaSimCapture, TheDriverApiCapturesToo) {
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  CUevent e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_EQ(cuStreamIsCapturing(s_, &st), CUDA_SUCCESS);
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  ASSERT_EQ(launch_work(s_, {writes(buffer_, MiB)}), cudaSuccess);
  ASSERT_EQ(cuEventRecord(e, s_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitEvent(t_, e, 0), CUDA_SUCCESS);  // t_ joins
  cuuint64_t id = 0;
  CUgraph building = nullptr;
  const CUgraphNode* deps = nullptr;
  std::size_t n = 0;
  ASSERT_EQ(cuStreamGetCaptureInfo(t_, &st, &id, &building, &deps, nullptr, &n), CUDA_SUCCESS);
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_NE(id, 0u);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(cuStreamSynchronize(s_), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(g, nullptr);
  (void)cudaGetLastError();

  // The older ABI of cuStreamGetCaptureInfo, as cuGetProcAddress hands it out.
  void* fn = nullptr;
  ASSERT_EQ(cuGetProcAddress("cuStreamGetCaptureInfo", &fn, 11030, 0, nullptr), CUDA_SUCCESS);
  const auto info_v2 = reinterpret_cast<PFN_cuStreamGetCaptureInfo_v11030>(fn);
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(launch_work(s_, {writes(buffer_, MiB)}), cudaSuccess);
  ASSERT_EQ(info_v2(s_, &st, &id, &building, &deps, &n), CUDA_SUCCESS);
  EXPECT_EQ(n, 1u);
  ASSERT_EQ(cuStreamEndCapture(s_, &g), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiate(&exec, g, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphLaunch(exec, s_), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(e, s_), CUDA_SUCCESS);
  ASSERT_EQ(cuEventSynchronize(e), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(s_), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(g), CUDA_SUCCESS);
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

}  // namespace

#else  // !GPUMEM_TEST_CUDASIM

TEST(CudaSimCapture, NotBuilt) {
  GTEST_SKIP() << "the CUDA simulator is built with the tools (GPUMEM_BUILD_TOOLS=ON)";
}

#endif
