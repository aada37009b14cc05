// Hexadecimal digests: strict parsing (64 digits, either case) and lowercase output.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "idem_core.h"

namespace idem::core {

using Sha256Digest = std::array<std::uint8_t, IDEM_SHA256_BYTES>;

IdemStatus parse_sha256_hex(std::string_view hex, Sha256Digest& out);
void sha256_to_hex(const Sha256Digest& digest, char out[IDEM_SHA256_HEX_CHARS]);

}  // namespace idem::core
