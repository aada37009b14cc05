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

namespace {

// RFC 9110 5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" /
// "~" / DIGIT / ALPHA.
bool is_tchar(unsigned char byte) {
    if ((byte >= '0' && byte <= '9') || (byte >= 'a' && byte <= 'z') || (byte >= 'A' && byte <= 'Z'))
        return true;
    switch (byte) {
        case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-': case '.':
        case '^': case '_': case '`': case '|': case '~':
            return true;
        default:
            return false;
    }
}

}  // namespace

IdemStatus check_header_name(std::string_view name) {
    if (name.empty())
        return IDEM_ERR_EMPTY;
    for (const char c : name)
        if (!is_tchar(static_cast<unsigned char>(c)))
            return IDEM_ERR_NOT_TOKEN;
    return IDEM_OK;
}

// RFC 9110 5.5: field-value = *field-content of VCHAR, SP, HTAB and obs-text (0x80..0xff); a CTL but HTAB, above
// all CR or LF, would end the field line where a client writes it back.
IdemStatus check_header_value(std::string_view value) {
    for (const char c : value) {
        const auto byte = static_cast<unsigned char>(c);
        if ((byte < 0x20 && byte != '\t') || byte == 0x7f)
            return IDEM_ERR_CONTROL_CHAR;
    }
    return IDEM_OK;
}

}  // namespace idem::core
