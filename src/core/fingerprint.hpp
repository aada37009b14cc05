// The request fingerprint of 1.3 (issue 30): method, path, query, content type and body canonicalised straight
// into SHA-256. The JSON form writes exactly the text PostgreSQL's jsonb prints for
// jsonb_build_object('method', m, 'path', p[, 'query', q], 'body', body::jsonb), so a request without a query
// hashes as 1.2's idem_hash of that object; the bytes form frames the parts with length prefixes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "idem_core.h"

#ifdef PG_VERSION_NUM
#error "src/core includes no PostgreSQL header: the PostgreSQL layer reaches it only through idem_core.h"
#endif

namespace idem::core {

// True for application/json and any type/subtype+json, case-insensitive, parameters ignored.
bool is_json_media_type(std::string_view content_type);

// The content type as the bytes form hashes it: trimmed of spaces and tabs, the media type before ';'
// lower-cased, the parameters as sent.
std::string normalise_content_type(std::string_view content_type);

// jsonb's output text of one JSON text in UTF-8 (a UTF-8 database), appended to out. False, with out
// unspecified, when the input is not JSON or lies outside what this canonicaliser reproduces exactly (\u0000,
// numbers with more than max_number_digits digits or an exponent beyond it, nesting deeper than max_depth):
// the caller then asks PostgreSQL.
constexpr std::size_t max_number_digits = 1000;
constexpr int max_depth = 256;
bool canonical_json(std::string_view json, std::string& out);

// escape_json of PostgreSQL: the string in double quotes, with " \ \b \f \n \r \t escaped and every other
// byte below 0x20 as \u00xx (lowercase hex).
void append_json_string(std::string_view text, std::string& out);

// The JSON form's text around a canonical body: json_form_head, the body, then the tail.
constexpr std::string_view json_form_head = "{\"body\": ";
void append_json_form_tail(std::string_view method, std::string_view path, std::string_view query,
                           std::string& out);
void append_json_form(std::string_view method, std::string_view path, std::string_view query,
                      std::string_view canonical_body, std::string& out);

}  // namespace idem::core
