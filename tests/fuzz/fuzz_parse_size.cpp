// libFuzzer target: parse_size (--device-memory, --overhead and the other size arguments).
// std::invalid_argument is the only allowed failure; an accepted size reads back the same from its
// byte count and, when format_bytes writes it without decimals, from that text too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "gpumem/detail/size_units.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::size_t bytes = 0;
  try {
    bytes = gpumem::parse_size(text);
  } catch (const std::invalid_argument& e) {
    // The message quotes the input escaped and cut short.
    if (std::string_view(e.what()).size() > 1000) std::abort();
    return 0;
  }
  if (gpumem::parse_size(std::to_string(bytes)) != bytes) std::abort();
  const std::string formatted = gpumem::format_bytes(bytes);
  if (formatted.find('.') == std::string::npos && gpumem::parse_size(formatted) != bytes) {
    std::abort();
  }
  return 0;
}
