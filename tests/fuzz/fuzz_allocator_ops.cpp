// libFuzzer target: operation sequences on caching_allocator over the simulated device, every
// policy, with fault injection; the invariant checker runs after every operation, and at the end
// the device must hold nothing. Input: byte 0 picks the policy and the fault rule; then 3 bytes per
// operation (kind, two bytes of argument).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/simulated_device.hpp"

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

gpumem::allocator_config config_for(std::uint8_t b) {
  static const char* const configs[] = {
      "policy:classic",
      "policy:expandable",
      "policy:stitch",
      "policy:classic,max_split_size_mb:40,roundup_power2_divisions:4",
      "policy:classic,per_process_memory_fraction:0.5,garbage_collection_threshold:0.5",
      "policy:stitch,per_process_memory_fraction:0.7"};
  return gpumem::allocator_config::parse(configs[b % 6]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  gpumem::simulated_device::options o;
  o.capacity = 512 * MiB;
  o.completion = gpumem::event_completion::manual;
  switch ((data[0] >> 4) % 4) {
    case 1:
      o.faults.fail_nth_call = 1 + (data[0] & 0xF);
      break;
    case 2:
      o.faults.fail_probability = 0.1, o.faults.seed = data[0];
      break;
    case 3:
      o.faults.fail_above_bytes = 64 * MiB;
      break;
    default:
      break;
  }
  gpumem::simulated_device dev{o};
  std::vector<gpumem::simulated_device::stream_type> streams{dev.default_stream(),
                                                             dev.create_stream()};
  {
    gpumem::caching_allocator<gpumem::simulated_device> a(dev, config_for(data[0]));
    std::vector<void*> live;
    for (std::size_t i = 1; i + 2 < size; i += 3) {
      const std::uint8_t kind = data[i] % 8;
      const std::size_t arg = static_cast<std::size_t>(data[i + 1]) << 8 | data[i + 2];
      try {
        switch (kind) {
          case 0:
          case 1:
          case 2:  // sizes from 1 B to ~200 MiB, most of them small
            live.push_back(a.allocate(1 + (arg * arg * 47) % (200 * MiB), streams[arg & 1]));
            break;
          case 3:
          case 4:
            if (!live.empty()) {
              const std::size_t k = arg % live.size();
              a.deallocate(live[k]);
              live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
            }
            break;
          case 5:
            if (!live.empty()) a.record_stream(live[arg % live.size()], streams[1]);
            break;
          case 6:
            dev.complete_stream(streams[arg & 1]);
            break;
          default:
            a.empty_cache();
            break;
        }
      } catch (const gpumem::out_of_memory&) {
      } catch (const gpumem::cuda_error&) {  // an injected fault the allocator reports
      }
      a.check_invariants();  // throws std::logic_error on a violation: a finding
    }
    dev.set_faults({});
    for (void* p : live) a.deallocate(p);
    dev.complete_all();
    a.empty_cache();
    a.check_invariants();
    if (a.usage().reserved != 0) std::abort();
  }
  if (dev.bytes_in_use() != 0) std::abort();  // nothing leaked once the allocator is gone
  return 0;
}
