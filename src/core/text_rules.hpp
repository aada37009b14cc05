// Key and scope validation: pure functions over bytes, no allocation.
#pragma once

#include <cstddef>
#include <string_view>

#include "idem_core.h"

#ifdef PG_VERSION_NUM
#error "src/core includes no PostgreSQL header: the PostgreSQL layer reaches it only through idem_core.h"
#endif

namespace idem::core {

// True for C0 controls, DEL, and the UTF-8 encodings of C1 controls (U+0080..U+009F).
std::size_t find_control_character(std::string_view text);

IdemStatus validate_key(std::string_view key);
IdemStatus validate_scope(std::string_view scope);

}  // namespace idem::core
