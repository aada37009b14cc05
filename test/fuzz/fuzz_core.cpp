// libFuzzer target for the idempotency core: every check compares the core against a
// simple model or an invariant, and traps on violation.
//
// Input layout (missing header bytes read as zero):
//   [0]      claim facts, bits 0..6
//   [1..4]   http_status, int32 little-endian
//   [5..12]  response_bytes, uint64 little-endian
//   [13..20] max_response_bytes, uint64 little-endian
//   [21..22] split point of the text into scope | key, and the streaming piece sizes
//   [23..]   text (also a request body for the fingerprint)
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "../unit/sha256_stream.hpp"
#include "fingerprint.hpp"
#include "idem_core.h"

#define REQUIRE(cond)              \
    do {                           \
        if (!(cond))               \
            __builtin_trap();      \
    } while (0)

namespace {

constexpr std::size_t header_size = 23;

template <typename T>
T read_le(const std::uint8_t* p) {
    T v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i)
        v = static_cast<T>(v | static_cast<T>(static_cast<std::uint64_t>(p[i]) << (8 * i)));
    return v;
}

bool is_hex_digit(char c) { return std::memchr("0123456789abcdefABCDEF", c, 22) != nullptr; }

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// The character rule as stated: C0, DEL, and the UTF-8 C1 encodings C2 80..C2 9F.
bool model_has_control(std::string_view s) {
    for (std::size_t i = 0; i < s.size(); ++i) {
        const unsigned char b = static_cast<unsigned char>(s[i]);
        if (b <= 0x1f || b == 0x7f)
            return true;
        if (b == 0xc2 && i + 1 < s.size() && (static_cast<unsigned char>(s[i + 1]) & 0xe0) == 0x80)
            return true;
    }
    return false;
}

void check_validation(std::string_view text) {
    IdemStatus expected_scope = IDEM_OK;
    if (text.size() > IDEM_MAX_SCOPE_BYTES)
        expected_scope = IDEM_ERR_TOO_LONG;
    else if (model_has_control(text))
        expected_scope = IDEM_ERR_CONTROL_CHAR;
    const IdemStatus expected_key = text.empty() ? IDEM_ERR_EMPTY : expected_scope;
    const IdemStatus key = idem_core_validate_key(text.data(), text.size());
    REQUIRE(key == expected_key);
    REQUIRE(idem_core_validate_scope(text.data(), text.size()) == expected_scope);
    const char* message = idem_core_status_message(key);
    REQUIRE(message != nullptr && message[0] != '\0');
}

void check_hex(std::string_view text) {
    std::uint8_t digest[IDEM_SHA256_BYTES];
    std::memset(digest, 0xa5, sizeof digest);
    const IdemStatus status = idem_core_parse_sha256_hex(text.data(), text.size(), digest);
    bool all_hex = true;
    for (char c : text)
        all_hex = all_hex && is_hex_digit(c);
    if (text.size() != IDEM_SHA256_HEX_CHARS)
        REQUIRE(status == IDEM_ERR_HEX_LENGTH);
    else
        REQUIRE(status == (all_hex ? IDEM_OK : IDEM_ERR_HEX_DIGIT));
    if (status != IDEM_OK) {
        // A rejected hash leaves the output alone.
        for (std::uint8_t b : digest)
            REQUIRE(b == 0xa5);
        return;
    }
    char hex[IDEM_SHA256_HEX_CHARS];
    idem_core_sha256_to_hex(digest, hex);
    for (std::size_t i = 0; i < sizeof hex; ++i)
        REQUIRE(hex[i] == lower(text[i]));
}

// Any 32 bytes survive to_hex and parse, in lowercase and in uppercase.
void check_hex_round_trip(const std::uint8_t* bytes) {
    char hex[IDEM_SHA256_HEX_CHARS];
    idem_core_sha256_to_hex(bytes, hex);
    std::uint8_t back[IDEM_SHA256_BYTES];
    for (char c : hex)
        REQUIRE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
    REQUIRE(idem_core_parse_sha256_hex(hex, sizeof hex, back) == IDEM_OK);
    REQUIRE(std::memcmp(back, bytes, sizeof back) == 0);
    for (char& c : hex)
        c = (c >= 'a' && c <= 'f') ? static_cast<char>(c - 'a' + 'A') : c;
    std::memset(back, 0, sizeof back);
    REQUIRE(idem_core_parse_sha256_hex(hex, sizeof hex, back) == IDEM_OK);
    REQUIRE(std::memcmp(back, bytes, sizeof back) == 0);
}

void stream_update(Sha256Stream* s, const void* data, std::size_t len) {
    REQUIRE(sha256_stream_update(s, data, len) == IDEM_OK);
}

// One-shot equals streaming in input-chosen pieces; key identity equals its documented format.
void check_hashing(std::string_view text, std::uint16_t split) {
    std::uint8_t one_shot[IDEM_SHA256_BYTES], again[IDEM_SHA256_BYTES], streamed[IDEM_SHA256_BYTES];
    REQUIRE(idem_core_sha256(text.data(), text.size(), one_shot) == IDEM_OK);
    Sha256Stream* s = sha256_stream_begin();
    REQUIRE(s != nullptr);
    const std::size_t piece = 1 + split % 131;
    for (std::size_t at = 0; at < text.size(); at += piece)
        stream_update(s, text.data() + at, std::min(piece, text.size() - at));
    REQUIRE(sha256_stream_finish(s, streamed) == IDEM_OK);
    REQUIRE(std::memcmp(one_shot, streamed, sizeof one_shot) == 0);
    s = sha256_stream_begin();
    REQUIRE(s != nullptr);
    stream_update(s, text.data(), text.size());
    sha256_stream_abandon(s);  // a leak here is reported by LeakSanitizer
    REQUIRE(idem_core_sha256(text.data(), text.size(), again) == IDEM_OK);
    REQUIRE(std::memcmp(one_shot, again, sizeof one_shot) == 0);

    const std::size_t cut = split % (text.size() + 1);
    const std::string_view scope = text.substr(0, cut), key = text.substr(cut);
    std::uint8_t identity[IDEM_SHA256_BYTES], expected[IDEM_SHA256_BYTES];
    REQUIRE(idem_core_key_identity(scope.data(), scope.size(), key.data(), key.size(), identity) == IDEM_OK);
    const std::uint32_t scope_len = static_cast<std::uint32_t>(scope.size());
    const std::uint32_t key_len = static_cast<std::uint32_t>(key.size());
    s = sha256_stream_begin();
    REQUIRE(s != nullptr);
    stream_update(s, &scope_len, sizeof scope_len);
    stream_update(s, scope.data(), scope.size());
    stream_update(s, &key_len, sizeof key_len);
    stream_update(s, key.data(), key.size());
    REQUIRE(sha256_stream_finish(s, expected) == IDEM_OK);
    REQUIRE(std::memcmp(identity, expected, sizeof identity) == 0);

    // Moving the boundary by one byte must change the identity.
    if (!key.empty()) {
        const std::string_view longer_scope = text.substr(0, cut + 1), shorter_key = text.substr(cut + 1);
        std::uint8_t moved[IDEM_SHA256_BYTES];
        REQUIRE(idem_core_key_identity(longer_scope.data(), longer_scope.size(), shorter_key.data(),
                                       shorter_key.size(), moved) == IDEM_OK);
        REQUIRE(std::memcmp(identity, moved, sizeof identity) != 0);
    }

    std::uint64_t tag = 0;
    for (int i = 7; i >= 0; --i)
        tag |= static_cast<std::uint64_t>(identity[i]) << (8 * (7 - i));
    REQUIRE(idem_core_lock_tag(identity) == tag);
}

void check_claim(std::uint8_t bits) {
    IdemClaimFacts f{};
    f.claimed_by_this_transaction = bits & 0x01;
    f.lock_granted = bits & 0x02;
    f.row_changed_after_snapshot = bits & 0x04;
    f.row.found = bits & 0x08;
    f.row.expired = bits & 0x10;
    f.row.hash_matches = bits & 0x20;
    const IdemClaimOutcome o = idem_core_decide_claim(&f);
    const bool live = f.row.found && !f.row.expired;

    REQUIRE(o >= IDEM_OUTCOME_CLAIMED && o <= IDEM_OUTCOME_SERIALIZATION_FAILURE);
    const char* name = idem_core_outcome_name(o);
    REQUIRE(name != nullptr && name[0] != '\0');
    if (f.claimed_by_this_transaction)
        REQUIRE(o == IDEM_OUTCOME_IN_PROGRESS);
    // The request runs only for the lock holder, and never over a live response or a missed change.
    if (o == IDEM_OUTCOME_CLAIMED)
        REQUIRE(!f.claimed_by_this_transaction && f.lock_granted && !live && !f.row_changed_after_snapshot);
    if (o == IDEM_OUTCOME_REPLAY)
        REQUIRE(live && f.row.hash_matches);
    if (o == IDEM_OUTCOME_MISMATCH)
        REQUIRE(live && !f.row.hash_matches);
    if (o == IDEM_OUTCOME_SERIALIZATION_FAILURE)
        REQUIRE(f.row_changed_after_snapshot && !live);
    // A live row is answered from, even while another replay holds the lock.
    if (!f.claimed_by_this_transaction && live)
        REQUIRE(o == IDEM_OUTCOME_REPLAY || o == IDEM_OUTCOME_MISMATCH);
    // No live row: a missed change must be retried, else the lock decides.
    if (!f.claimed_by_this_transaction && !live)
        REQUIRE(o == (f.row_changed_after_snapshot ? IDEM_OUTCOME_SERIALIZATION_FAILURE
                      : f.lock_granted             ? IDEM_OUTCOME_CLAIMED
                                                   : IDEM_OUTCOME_IN_PROGRESS));
}

void check_completion(std::int32_t status, std::uint64_t bytes, std::uint64_t max) {
    const IdemCompletion c = idem_core_decide_completion(status, bytes, max);
    if (status < 100 || status > 599)
        REQUIRE(c == IDEM_COMPLETION_BAD_STATUS);
    else if (status >= 500)
        REQUIRE(c == IDEM_COMPLETION_RELEASE);
    else
        REQUIRE(c == (bytes > max ? IDEM_COMPLETION_TOO_LARGE : IDEM_COMPLETION_STORE));
}

// The fingerprint (1.3) of the text as a request body. The JSON form either is canonicalised or is left to
// PostgreSQL; canonical text is a fixed point (jsonb's output read again prints itself), so the canonical text
// as a body has the same fingerprint; the bytes form always hashes.
void check_fingerprint(std::string_view text) {
    IdemRequest r{};
    r.method = "POST";
    r.method_len = 4;
    r.path = "/p";
    r.path_len = 2;
    r.content_type = "application/json";
    r.content_type_len = 16;
    r.body = text.data();
    r.body_len = text.size();
    std::uint8_t first[IDEM_SHA256_BYTES], again[IDEM_SHA256_BYTES];
    const IdemStatus status = idem_core_fingerprint(&r, first);
    REQUIRE(status == IDEM_OK || status == IDEM_ERR_NOT_CANONICAL);
    std::string canonical;
    REQUIRE(idem::core::canonical_json(text, canonical) == (status == IDEM_OK));
    if (status == IDEM_OK) {
        std::string twice;
        REQUIRE(idem::core::canonical_json(canonical, twice) && twice == canonical);
        r.body = canonical.data();
        r.body_len = canonical.size();
        REQUIRE(idem_core_fingerprint(&r, again) == IDEM_OK);
        REQUIRE(std::memcmp(first, again, sizeof first) == 0);
    }
    r.content_type = "application/octet-stream";
    r.content_type_len = 24;
    r.body = text.data();
    r.body_len = text.size();
    REQUIRE(idem_core_fingerprint(&r, again) == IDEM_OK);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::uint8_t header[header_size] = {};
    if (size > 0)
        std::memcpy(header, data, std::min(size, header_size));
    const std::string_view text = size > header_size
        ? std::string_view(reinterpret_cast<const char*>(data) + header_size, size - header_size)
        : std::string_view();
    const std::uint16_t split = read_le<std::uint16_t>(header + 21);

    check_claim(header[0]);
    check_completion(read_le<std::int32_t>(header + 1), read_le<std::uint64_t>(header + 5),
                     read_le<std::uint64_t>(header + 13));
    check_validation(text);
    check_hex(text);
    std::uint8_t bytes[IDEM_SHA256_BYTES] = {};
    if (!text.empty())
        std::memcpy(bytes, text.data(), std::min(text.size(), sizeof bytes));
    check_hex_round_trip(bytes);
    check_hashing(text, split);
    check_fingerprint(text);
    return 0;
}
