#include "text_rules.hpp"

namespace idem::core {

std::size_t find_control_character(std::string_view text) {
    for (std::size_t i = 0; i < text.size(); ++i) {
        const auto byte = static_cast<unsigned char>(text[i]);
        if (byte < 0x20 || byte == 0x7f)
            return i;
        // U+0080..U+009F are encoded as C2 80..C2 9F in UTF-8.
        if (byte == 0xc2 && i + 1 < text.size()) {
            const auto next = static_cast<unsigned char>(text[i + 1]);
            if (next >= 0x80 && next <= 0x9f)
                return i;
        }
    }
    return std::string_view::npos;
}

namespace {

IdemStatus validate_text(std::string_view text, std::size_t max_bytes) {
    if (text.size() > max_bytes)
        return IDEM_ERR_TOO_LONG;
    if (find_control_character(text) != std::string_view::npos)
        return IDEM_ERR_CONTROL_CHAR;
    return IDEM_OK;
}

}  // namespace

IdemStatus validate_key(std::string_view key) {
    if (key.empty())
        return IDEM_ERR_EMPTY;
    return validate_text(key, IDEM_MAX_KEY_BYTES);
}

IdemStatus validate_scope(std::string_view scope) {
    return validate_text(scope, IDEM_MAX_SCOPE_BYTES);
}

}  // namespace idem::core
