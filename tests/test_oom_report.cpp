// The out_of_memory error: PyTorch's sentence first, then gpumem's diagnosis.
#include <string>

#include <gtest/gtest.h>

#include "support/sim.hpp"

namespace {

using namespace gpumem_test;
using gpumem::simulated_device;

std::string oom_text(allocator& a, std::size_t size,
                     gpumem::out_of_memory::details* info = nullptr) {
  try {
    a.allocate(size);
  } catch (const gpumem::out_of_memory& e) {
    if (info != nullptr) *info = e.info();
    return e.what();
  }
  ADD_FAILURE() << "no out_of_memory for " << size;
  return {};
}

TEST(OomReport, FormatSizeMatchesPyTorch) {
  EXPECT_EQ(gpumem::format_size(0), "0 bytes");
  EXPECT_EQ(gpumem::format_size(1024), "1024 bytes");
  EXPECT_EQ(gpumem::format_size(1025), "1.00 KiB");
  EXPECT_EQ(gpumem::format_size(1536), "1.50 KiB");
  EXPECT_EQ(gpumem::format_size(1048576), "1024.00 KiB");
  EXPECT_EQ(gpumem::format_size(20 * MiB), "20.00 MiB");
  EXPECT_EQ(gpumem::format_size(GiB), "1024.00 MiB");
  EXPECT_EQ(gpumem::format_size(GiB + GiB / 4), "1.25 GiB");
}

TEST(OomReport, FragmentationIsDiagnosedAndStitchSuggested) {
  simulated_device dev{device_options(200 * MiB)};
  allocator a(dev, config());
  // Ten 20 MiB segments, each kept alive by one 1.5 MiB block: 185 MiB cached but split.
  std::vector<void*> keep;
  std::vector<void*> release;
  for (int i = 0; i < 10; ++i) {
    release.push_back(a.allocate(9 * MiB + 512 * KiB));  // a 20 MiB segment...
    release.push_back(a.allocate(9 * MiB));              // ...its remainder, split again...
    keep.push_back(a.allocate(1536 * KiB));              // ...and the last 1.5 MiB
  }
  for (void* p : release) a.deallocate(p);
  ASSERT_EQ(a.stats().segment[0].current, 10);
  gpumem::out_of_memory::details info;
  const std::string msg = oom_text(a, 30 * MiB, &info);
  EXPECT_EQ(
      msg.rfind("CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total capacity "
                "of 200.00 MiB of which 0 bytes is free. Of the allocated memory 15.00 MiB is "
                "allocated by gpumem, and 185.00 MiB is reserved by gpumem but unallocated.",
                0),
      0u)
      << msg;
  EXPECT_NE(msg.find("largest free block: 18.50 MiB overall, 18.50 MiB in this request's pool"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("free cached: 185.00 MiB in 10 blocks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("185.00 MiB of the 200.00 MiB reserved (92.5%)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("this is fragmentation. policy:stitch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_split_size_mb"), std::string::npos) << msg;
  EXPECT_EQ(info.requested_bytes, 30 * MiB);
  EXPECT_EQ(info.device_request_bytes, 30 * MiB);
  EXPECT_EQ(info.reserved_bytes, 200 * MiB);
  EXPECT_EQ(info.largest_free_block_bytes, 18 * MiB + 512 * KiB);
  for (void* p : keep) a.deallocate(p);
}

TEST(OomReport, FractionLimitIsNamed) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config("per_process_memory_fraction:0.5"));
  void* p = a.allocate(400 * MiB);
  const std::string msg = oom_text(a, 200 * MiB);
  EXPECT_NE(msg.find("is free. 512.00 MiB allowed; Of the allocated memory"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("memory fraction: 0.5 caps reserved memory at 512.00 MiB"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("suggestion: the memory fraction (0.5) refused it"), std::string::npos) << msg;
  a.deallocate(p);
}

TEST(OomReport, CacheAndDeviceTogetherEnoughIsFragmentation) {
  // 40 MiB cached in a segment a live block keeps, 40 MiB free on the device, 50 MiB asked.
  simulated_device dev{device_options(100 * MiB)};
  allocator a(dev, config());
  a.deallocate(a.allocate(60 * MiB));
  void* p = a.allocate(20 * MiB);
  const std::string msg = oom_text(a, 50 * MiB);
  EXPECT_NE(msg.find("suggestion: 40.00 MiB is cached but unallocated and 40.00 MiB is free on "
                     "the device"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("this is fragmentation. policy:stitch"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("the live allocations"), std::string::npos) << msg;
  a.deallocate(p);
}

TEST(OomReport, GenuineShortageSuggestsUsingLessMemory) {
  simulated_device dev{device_options(1 * GiB)};
  allocator a(dev, config());
  void* p = a.allocate(900 * MiB);
  const std::string msg = oom_text(a, 200 * MiB);
  EXPECT_NE(msg.find("Tried to allocate 200.00 MiB"), std::string::npos);
  EXPECT_NE(msg.find("suggestion: the live allocations (900.00 MiB) plus this request exceed"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("fragmentation. policy:stitch"), std::string::npos);
  // The small-request case reports the 20 MiB segment it tried to obtain, as PyTorch does.
  void* q = a.allocate(110 * MiB);
  const std::string small = oom_text(a, 5 * MiB);
  EXPECT_NE(small.find("Tried to allocate 20.00 MiB"), std::string::npos) << small;
  a.deallocate(p);
  a.deallocate(q);
}

TEST(OomReport, IsABadAlloc) {
  simulated_device dev{device_options(64 * MiB)};
  allocator a(dev, config());
  EXPECT_THROW(a.allocate(1 * GiB), std::bad_alloc);
  EXPECT_EQ(a.stats().num_ooms, 1);
}

}  // namespace
