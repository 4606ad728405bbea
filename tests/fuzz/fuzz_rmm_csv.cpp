// libFuzzer target: the RMM logging_resource_adaptor CSV reader. trace_error is the only allowed
// failure; what it accepts is a valid trace.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpumem/trace/rmm_csv.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    gpumem::validate_trace(
        gpumem::parse_rmm_csv(std::string_view(reinterpret_cast<const char*>(data), size)));
  } catch (const gpumem::trace_error&) {
  }
  return 0;
}
