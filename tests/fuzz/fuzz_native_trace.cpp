// libFuzzer target: the native trace reader. trace_error is the only allowed failure; a trace it
// accepts is valid, writes and reads back unchanged, and replays without breaking an invariant.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/replay.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  gpumem::allocation_trace trace;
  try {
    trace = gpumem::parse_native_trace(text);
  } catch (const gpumem::trace_error&) {
    return 0;
  }
  gpumem::validate_trace(trace);  // throws (and so crashes the fuzzer) if the reader let it pass
  std::ostringstream out;
  gpumem::write_native_trace(out, trace);
  if (gpumem::parse_native_trace(out.str()) != trace) std::abort();
  if (trace.events.size() <= 2000) {
    gpumem::compiled_trace compiled;
    try {
      compiled = gpumem::compile_trace(trace);
    } catch (const gpumem::trace_error&) {
      return 0;  // live requested or recorded reserved bytes past 2^64
    }
    gpumem::replay_options o;
    o.device_memory = std::size_t{1} << 30;
    (void)gpumem::replay_trace(compiled, o);
  }
  return 0;
}
