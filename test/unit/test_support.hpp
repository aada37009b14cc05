// Helpers shared by the unit tests; deliberately independent of the core's own hex code.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "idem_core.h"

using Digest = std::array<std::uint8_t, IDEM_SHA256_BYTES>;

inline std::string hex_of(const std::uint8_t* bytes, std::size_t len) {
    std::string out;
    char pair[3];
    for (std::size_t i = 0; i < len; ++i) {
        std::snprintf(pair, sizeof pair, "%02x", bytes[i]);
        out += pair;
    }
    return out;
}

inline std::string hex_of(const Digest& d) { return hex_of(d.data(), d.size()); }

inline Digest digest_from_hex(const std::string& hex) {
    if (hex.size() != 2 * IDEM_SHA256_BYTES)
        throw std::invalid_argument("expected 64 hex digits: " + hex);
    Digest d{};
    for (std::size_t i = 0; i < d.size(); ++i)
        d[i] = static_cast<std::uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
    return d;
}

inline Digest sha256_one_shot(const std::string& message) {
    Digest d{};
    if (idem_core_sha256(message.data(), message.size(), d.data()) != IDEM_OK)
        throw std::runtime_error("idem_core_sha256 failed");
    return d;
}
