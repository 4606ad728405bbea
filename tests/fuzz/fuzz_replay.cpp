// libFuzzer target: replay_trace under any configuration the parser accepts. Input: a
// configuration string up to the first newline (PYTORCH_CUDA_ALLOC_CONF syntax plus policy:), then
// a gpumem trace (docs/trace_format.md). A replay may run out of memory; any other exception, a
// crash or an undefined operation is a finding, and so is a replay whose figures contradict
// themselves.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "gpumem/config.hpp"
#include "gpumem/trace/native_format.hpp"
#include "gpumem/trace/replay.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::size_t newline = text.find('\n');
  if (newline == std::string_view::npos || newline > 256) return 0;
  gpumem::replay_options options;
  options.device_memory = std::size_t{1} << 30;
  try {
    options.config = gpumem::allocator_config::parse(text.substr(0, newline));
  } catch (const gpumem::config_error&) {
    return 0;
  }
  gpumem::compiled_trace compiled;
  try {
    const gpumem::allocation_trace trace = gpumem::parse_native_trace(text.substr(newline + 1));
    if (trace.events.size() > 4000) return 0;  // keep each input fast
    compiled = gpumem::compile_trace(trace);
  } catch (const gpumem::trace_error&) {
    return 0;
  }
  const gpumem::replay_result r = gpumem::replay_trace(compiled, options);
  if (r.peak_reserved > options.device_memory) std::abort();
  if (r.completed && r.events_replayed != compiled.ops.size()) std::abort();
  if (r.peak_allocated > r.peak_reserved) std::abort();
  return 0;
}
