// The C facade over the core: the single place where C++ exceptions stop. Every function is noexcept, as
// idem_core.h declares it; those that can throw inside run their body through guarded() (errors.hpp).
#include <cstring>

#include "errors.hpp"
#include "hex.hpp"
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
    }
    return "unknown";
}

}  // extern "C"
