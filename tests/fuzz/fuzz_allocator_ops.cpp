// libFuzzer target: operation sequences on caching_allocator over the simulated device, under any
// configuration the parser accepts, with fault injection; the invariant checker runs after every
// operation, and at the end the device must hold nothing.
// Input: byte 0 = n, then n pairs (key, value) that make the configuration string: each key byte
// picks one of gpumem's keys, each value byte a value from a list of edge cases (0, 1, the
// thresholds, 2^44 - 1 MiB, 2^64 - 1, fractions, True/False, lists, policies) — a string that does
// not parse ends the input. Then one byte picks the fault rule, the device size and how many
// times the operations run (1 to 4, as the steps of a loop: what is live at the end of a step is
// freed, so stitch's placement by the step before is offered its previous step's addresses),
// then 3 bytes per operation (kind, two bytes of argument).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpumem/config.hpp"
#include "gpumem/core/caching_allocator.hpp"
#include "gpumem/device/simulated_device.hpp"

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

constexpr const char* keys[] = {"policy",
                                "large_segment_size_mb",
                                "max_split_size_mb",
                                "max_non_split_rounding_mb",
                                "roundup_power2_divisions",
                                "garbage_collection_threshold",
                                "per_process_memory_fraction",
                                "expandable_segments",
                                "pinned_num_register_threads",
                                "pinned_reserve_segment_size_mb",
                                "stitch_step_match"};
constexpr const char* values[] = {"classic",
                                  "expandable",
                                  "stitch",
                                  "auto",
                                  "True",
                                  "False",
                                  "0",
                                  "1",
                                  "2",
                                  "4",
                                  "10",
                                  "11",
                                  "16",
                                  "20",
                                  "21",
                                  "64",
                                  "100",
                                  "1000",
                                  "1048576",
                                  "1048577",
                                  "17592186044415",
                                  "17592186044416",
                                  "9223372036854775808",
                                  "18446744073709551615",
                                  "0.0001",
                                  "0.3",
                                  "0.5",
                                  "0.999",
                                  "1",
                                  "[1:2,64:8,>:4]",
                                  "[>:16]",
                                  "[256:1,1024:1048576]",
                                  "[1:4611686018427387904]"};

std::string config_text(const std::uint8_t* data, std::size_t pairs) {
  std::string text;
  for (std::size_t i = 0; i < pairs; ++i) {
    if (!text.empty()) text += ',';
    text += keys[data[2 * i] % (sizeof keys / sizeof *keys)];
    text += ':';
    text += values[data[2 * i + 1] % (sizeof values / sizeof *values)];
  }
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* input, std::size_t input_size) {
  if (input_size < 1) return 0;
  const std::size_t pairs = input[0] % 8;
  if (input_size < 1 + 2 * pairs) return 0;
  gpumem::allocator_config config;
  try {
    config = gpumem::allocator_config::parse(config_text(input + 1, pairs));
  } catch (const gpumem::config_error&) {
    return 0;
  }
  const std::uint8_t* data = input + 1 + 2 * pairs;
  const std::size_t size = input_size - 1 - 2 * pairs;
  if (size < 1) return 0;
  gpumem::simulated_device::options o;
  // 512 MiB, or 3 GiB: more than the largest segment a small large_segment_size_mb gives.
  o.capacity = (data[0] & 0x8) != 0 ? 3072 * MiB : 512 * MiB;
  o.completion = gpumem::event_completion::manual;
  switch ((data[0] >> 4) % 4) {
    case 1:
      o.faults.fail_nth_call = 1 + (data[0] & 0x7);
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
    gpumem::caching_allocator<gpumem::simulated_device> a(dev, config);
    std::vector<void*> live;
    const int steps = 1 + (data[0] >> 6);
    for (int step = 0; step < steps; ++step) {
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
      if (step + 1 < steps) {
        for (void* p : live) a.deallocate(p);
        live.clear();
        a.check_invariants();
      }
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
