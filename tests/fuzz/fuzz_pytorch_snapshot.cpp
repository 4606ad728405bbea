// libFuzzer target: the unpickler and the PyTorch snapshot reader on any bytes. trace_error is the
// only allowed failure; what it accepts is a valid trace.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpumem/trace/pytorch_snapshot.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    gpumem::validate_trace(gpumem::detail::read_pytorch_snapshot_bytes(
        std::string_view(reinterpret_cast<const char*>(data), size), 0));
  } catch (const gpumem::trace_error&) {
  }
  return 0;
}
