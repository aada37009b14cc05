// Key, scope and stored header validation: pure functions over bytes, no allocation.
#pragma once

#include <cstddef>
#include <string_view>

#include "idem_core.h"

namespace idem::core {

// The offset of the first C0 control, DEL, or UTF-8 encoding of a C1 control (U+0080..U+009F) in text;
// std::string_view::npos when it has none.
std::size_t find_control_character(std::string_view text);

IdemStatus validate_key(std::string_view key);
IdemStatus validate_scope(std::string_view scope);

// 1.4: a stored header's name (an RFC 9110 token) and value (no control but HTAB).
IdemStatus check_header_name(std::string_view name);
IdemStatus check_header_value(std::string_view value);

}  // namespace idem::core
