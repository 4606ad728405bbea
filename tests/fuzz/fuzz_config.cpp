// libFuzzer target: allocator_config::parse on any text. A config_error is the only allowed
// failure; an accepted config must print and re-parse to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "gpumem/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const gpumem::allocator_config c = gpumem::allocator_config::parse(text);
    if (gpumem::allocator_config::parse(c.to_string()) != c) std::abort();  // round trip
    (void)c.notes();
  } catch (const gpumem::config_error&) {
  }
  return 0;
}
