// The C facade over the core: the single place where C++ exceptions stop. Every function is noexcept, as
// idem_core.h declares it; those that can throw inside run their body through guarded() (errors.hpp).
#include <cstring>

#include <string>

#include "errors.hpp"
#include "fingerprint.hpp"
#include "hex.hpp"
#include "http_date.hpp"
#include "idem_core.h"
#include "outcome.hpp"
#include "sha256.hpp"
#include "text_rules.hpp"

using idem::core::guarded;
using idem::core::Sha256;
using idem::core::Sha256Digest;

namespace {

void copy_digest(const Sha256Digest& digest, uint8_t out[IDEM_SHA256_BYTES]) {
    std::memcpy(out, digest.data(), digest.size());
}

std::string_view view(const char* data, size_t len) { return data == nullptr ? std::string_view() : std::string_view(data, len); }

std::string_view query_of(const IdemRequest& r) {
    std::string_view q = view(r.query, r.query_len);
    if (!q.empty() && q.front() == '?')
        q.remove_prefix(1);
    return q;
}

constexpr std::size_t kept_buffer_bytes = 64 * 1024;

// The bytes form: a tag no JSON text starts with, then each part as a 64-bit big-endian length and its bytes.
constexpr char bytes_form_tag[] = "idempotency fingerprint 1.3 bytes\n";

void update_framed(Sha256& digest, std::string_view part) {
    unsigned char length[8];
    const uint64_t n = part.size();
    for (int i = 0; i < 8; ++i)
        length[i] = static_cast<unsigned char>(n >> (56 - 8 * i));
    digest.update(length, sizeof length);
    digest.update(part.data(), part.size());
}

// The JSON form's text, hashed as it is written: no copy of the body.
void json_form_digest(const IdemRequest& r, std::string_view canonical_body, uint8_t out[IDEM_SHA256_BYTES]) {
    thread_local std::string tail;
    tail.clear();
    idem::core::append_json_form_tail(view(r.method, r.method_len), view(r.path, r.path_len), query_of(r), tail);
    static constexpr std::string_view head = idem::core::json_form_head;
    Sha256& digest = Sha256::reusable();
    digest.update(head.data(), head.size());
    digest.update(canonical_body.data(), canonical_body.size());
    digest.update(tail.data(), tail.size());
    copy_digest(digest.finish(), out);
}

}  // namespace

extern "C" {

// The one text of each status: the SQL layer reports an argument's as "idempotency <argument> <text>"
// and a failure as "idempotency: <text>" (src/sql_args.c); the regression tests' expected output holds them.
const char* idem_core_status_message(IdemStatus status) noexcept {
    switch (status) {
        case IDEM_OK: return "ok";
        case IDEM_ERR_EMPTY: return "must not be empty";
        case IDEM_ERR_TOO_LONG: return "is longer than 255 bytes";
        case IDEM_ERR_CONTROL_CHAR: return "contains a control character";
        case IDEM_ERR_HEX_LENGTH: return "must be 64 hexadecimal digits";
        case IDEM_ERR_HEX_DIGIT: return "contains a character that is not a hexadecimal digit";
        case IDEM_ERR_STATUS_RANGE: return "must be between 100 and 599";
        case IDEM_ERR_CRYPTO: return "OpenSSL could not compute SHA-256";
        case IDEM_ERR_INTERNAL: return "internal error in the idempotency core";
        case IDEM_ERR_NOT_CANONICAL: return "is not JSON the core canonicalises";
        case IDEM_ERR_DATE_RANGE: return "is outside the years 1970 to 9999 an HTTP-date writes";
        case IDEM_ERR_NOT_TOKEN: return "is not an RFC 9110 token";
    }
    return "unknown status";
}

IdemStatus idem_core_validate_key(const char* key, size_t len) noexcept {
    return guarded([&] { return idem::core::validate_key({key, len}); });
}

IdemStatus idem_core_validate_scope(const char* scope, size_t len) noexcept {
    return guarded([&] { return idem::core::validate_scope({scope, len}); });
}

IdemStatus idem_core_check_controls(const char* utf8, size_t len) noexcept {
    return guarded([&] {
        return idem::core::find_control_character({utf8, len}) == std::string_view::npos ? IDEM_OK
                                                                                          : IDEM_ERR_CONTROL_CHAR;
    });
}

IdemStatus idem_core_check_header_name(const char* name, size_t len) noexcept {
    return guarded([&] { return idem::core::check_header_name({name, len}); });
}

IdemStatus idem_core_check_header_value(const char* value, size_t len) noexcept {
    return guarded([&] { return idem::core::check_header_value({value, len}); });
}

int64_t idem_core_fixed_span_usecs(int64_t time_usecs, int32_t days, int32_t months) noexcept {
    // extract(epoch from interval): whole years of 365.25 days, the other months of 30 days, days of 24 hours.
    // The sum's terms are each under 2^75, so __int128 holds it exactly.
    constexpr __int128 usecs_per_day = static_cast<__int128>(86400) * 1000000;
    const __int128 span = static_cast<__int128>(time_usecs) + static_cast<__int128>(days) * usecs_per_day +
                          static_cast<__int128>(months / 12) * (usecs_per_day * 1461 / 4) +
                          static_cast<__int128>(months % 12) * (usecs_per_day * 30);
    if (span > INT64_MAX)
        return INT64_MAX;
    if (span < INT64_MIN)
        return INT64_MIN;
    return static_cast<int64_t>(span);
}

IdemStatus idem_core_parse_sha256_hex(const char* hex, size_t len,
                                      uint8_t out[IDEM_SHA256_BYTES]) noexcept {
    return guarded([&] {
        Sha256Digest digest{};
        const IdemStatus status = idem::core::parse_sha256_hex({hex, len}, digest);
        if (status == IDEM_OK)
            copy_digest(digest, out);
        return status;
    });
}

void idem_core_sha256_to_hex(const uint8_t digest[IDEM_SHA256_BYTES],
                             char out[IDEM_SHA256_HEX_CHARS]) noexcept {
    Sha256Digest copy{};
    std::memcpy(copy.data(), digest, copy.size());
    idem::core::sha256_to_hex(copy, out);
}

IdemStatus idem_core_http_date(int64_t unix_seconds, char out[IDEM_HTTP_DATE_CHARS]) noexcept {
    return guarded([&] { return idem::core::format_http_date(unix_seconds, out); });
}

IdemStatus idem_core_sha256(const void* data, size_t len, uint8_t out[IDEM_SHA256_BYTES]) noexcept {
    return guarded([&] {
        copy_digest(idem::core::sha256(data, len), out);
        return IDEM_OK;
    });
}

IdemStatus idem_core_key_identity(const char* scope, size_t scope_len, const char* key, size_t key_len,
                                  uint8_t out[IDEM_SHA256_BYTES]) noexcept {
    return guarded([&] {
        // Length prefixes keep ("a","bc") and ("ab","c") apart.
        const uint32_t lengths[2] = {static_cast<uint32_t>(scope_len), static_cast<uint32_t>(key_len)};
        Sha256& digest = Sha256::reusable();
        digest.update(&lengths[0], sizeof lengths[0]);
        digest.update(scope, scope_len);
        digest.update(&lengths[1], sizeof lengths[1]);
        digest.update(key, key_len);
        copy_digest(digest.finish(), out);
        return IDEM_OK;
    });
}

uint64_t idem_core_lock_tag(const uint8_t identity[IDEM_SHA256_BYTES]) noexcept {
    uint64_t tag = 0;
    for (int i = 0; i < 8; ++i)
        tag = (tag << 8) | identity[i];
    return tag;
}

IdemClaimOutcome idem_core_decide_claim(const IdemClaimFacts* facts) noexcept {
    return idem::core::decide_claim(*facts);
}

IdemCompletion idem_core_decide_completion(int32_t http_status, uint64_t response_bytes,
                                           uint64_t max_response_bytes) noexcept {
    return idem::core::decide_completion(http_status, response_bytes, max_response_bytes);
}

const char* idem_core_outcome_name(IdemClaimOutcome outcome) noexcept {
    switch (outcome) {
        case IDEM_OUTCOME_CLAIMED: return "claimed";
        case IDEM_OUTCOME_REPLAY: return "replay";
        case IDEM_OUTCOME_MISMATCH: return "mismatch";
        case IDEM_OUTCOME_IN_PROGRESS: return "in_progress";
        case IDEM_OUTCOME_SERIALIZATION_FAILURE: return "serialization_failure";
        case IDEM_OUTCOME_EXPIRED: return "expired";
    }
    return "unknown";
}

bool idem_core_fingerprint_is_json(const IdemRequest* request) noexcept {
    try {
        if (request->content_type == nullptr)
            return request->body_len > 0;
        return idem::core::is_json_media_type(view(request->content_type, request->content_type_len));
    } catch (...) {
        return false;
    }
}

IdemStatus idem_core_fingerprint(const IdemRequest* request, uint8_t out[IDEM_SHA256_BYTES]) noexcept {
    return guarded([&] {
        const IdemRequest& r = *request;
        if (idem_core_fingerprint_is_json(request)) {
            // One buffer per thread, kept: its capacity is reused by every later request.
            thread_local std::string body;
            body.clear();
            const bool canonical = idem::core::canonical_json(view(r.body, r.body_len), body);
            if (canonical)
                json_form_digest(r, body, out);
            if (body.capacity() > kept_buffer_bytes)
                std::string().swap(body);  // a large body's buffer is not kept for the backend's life
            return canonical ? IDEM_OK : IDEM_ERR_NOT_CANONICAL;
        }
        Sha256& digest = Sha256::reusable();
        digest.update(bytes_form_tag, sizeof bytes_form_tag - 1);
        update_framed(digest, view(r.method, r.method_len));
        update_framed(digest, view(r.path, r.path_len));
        update_framed(digest, query_of(r));
        update_framed(digest, r.content_type == nullptr
                                  ? std::string()
                                  : idem::core::normalise_content_type(view(r.content_type, r.content_type_len)));
        update_framed(digest, view(r.body, r.body_len));
        copy_digest(digest.finish(), out);
        return IDEM_OK;
    });
}

IdemStatus idem_core_fingerprint_json_body(const IdemRequest* request, const char* canonical_body,
                                           size_t canonical_body_len, uint8_t out[IDEM_SHA256_BYTES]) noexcept {
    return guarded([&] {
        json_form_digest(*request, view(canonical_body, canonical_body_len), out);
        return IDEM_OK;
    });
}

}  // extern "C"
