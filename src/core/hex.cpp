#include "hex.hpp"

namespace idem::core {

namespace {

int hex_value(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

}  // namespace

IdemStatus parse_sha256_hex(std::string_view hex, Sha256Digest& out) {
    if (hex.size() != IDEM_SHA256_HEX_CHARS)
        return IDEM_ERR_HEX_LENGTH;
    for (std::size_t i = 0; i < out.size(); ++i) {
        const int high = hex_value(hex[2 * i]);
        const int low = hex_value(hex[2 * i + 1]);
        if (high < 0 || low < 0)
            return IDEM_ERR_HEX_DIGIT;
        out[i] = static_cast<std::uint8_t>((high << 4) | low);
    }
    return IDEM_OK;
}

void sha256_to_hex(const Sha256Digest& digest, char out[IDEM_SHA256_HEX_CHARS]) {
    static constexpr char digits[] = "0123456789abcdef";
    for (std::size_t i = 0; i < digest.size(); ++i) {
        out[2 * i] = digits[digest[i] >> 4];
        out[2 * i + 1] = digits[digest[i] & 0x0f];
    }
}

}  // namespace idem::core
