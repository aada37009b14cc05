// HTTP-dates (RFC 9110 5.6.7, IMF-fixdate): the key's expiry as the header Idempotency-Key-Expires says it.
#pragma once

#include <cstdint>

#include "idem_core.h"

namespace idem::core {

// Unix seconds of 9999-12-31 23:59:59 GMT, the last instant a four-digit year writes.
constexpr std::int64_t http_date_max_seconds = 253402300799;

// "Tue, 08 Dec 2026 10:30:00 GMT" for unix_seconds, IDEM_HTTP_DATE_CHARS characters, no NUL; always in GMT,
// English day and month names: no locale, time zone or setting reaches it. IDEM_ERR_DATE_RANGE (out untouched)
// unless 0 <= unix_seconds <= http_date_max_seconds.
IdemStatus format_http_date(std::int64_t unix_seconds, char out[IDEM_HTTP_DATE_CHARS]);

}  // namespace idem::core
