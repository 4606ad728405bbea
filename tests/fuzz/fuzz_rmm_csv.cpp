// libFuzzer target: the RMM logging_resource_adaptor CSV reader. trace_error is the only allowed
// failure; what it accepts is a valid trace that writes and reads back unchanged, as an RMM log
// (frees of size 0 come back with their allocation's size, as write_rmm_csv says) and as a
// native trace.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/rmm_csv.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gpumem::allocation_trace trace;
  try {
    trace = gpumem::parse_rmm_csv(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const gpumem::trace_error&) {
    return 0;
  }
  gpumem::validate_trace(trace);  // throws (and so crashes the fuzzer) if the reader let it pass

  std::ostringstream csv;
  gpumem::write_rmm_csv(csv, trace);
  gpumem::allocation_trace expected = trace;
  std::unordered_map<std::uint64_t, std::uint64_t> sizes;
  for (gpumem::trace_event& e : expected.events) {
    if (e.kind == gpumem::trace_event_kind::alloc) sizes[e.address] = e.size;
    if (e.kind == gpumem::trace_event_kind::free_requested && e.size == 0)
      e.size = sizes[e.address];
  }
  if (gpumem::parse_rmm_csv(csv.str()) != expected) std::abort();

  std::ostringstream native;
  gpumem::write_native_trace(native, trace);
  if (gpumem::parse_native_trace(native.str()) != trace) std::abort();
  return 0;
}
