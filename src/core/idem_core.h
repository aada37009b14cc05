/*
 * idem_core.h: the C interface of the idempotency core.
 *
 * This header is the one error boundary between the C++17 core and the
 * PostgreSQL layer. Every function here is implemented in C++ and declared
 * noexcept (IDEM_CORE_NOEXCEPT, empty for C): each catches every exception and
 * reports it as a status code, and an exception that got past would end the
 * process at the boundary rather than unwind through C frames. No PostgreSQL
 * header is included on either side of it (every core file refuses them), and
 * the core never calls into PostgreSQL, so no ERROR can longjmp over a C++
 * frame.
 */
#ifndef IDEM_CORE_H
#define IDEM_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The core's one guard against PostgreSQL headers, for every core file: each includes this header, itself or
 * through another core header. The Makefile compiles the core without PostgreSQL's include directory, so no
 * core file can include one; and the C layer includes this header after postgres.h, so C++ including it after
 * a PostgreSQL header is the core doing so.
 */
#if defined(__cplusplus) && defined(PG_VERSION_NUM)
#error "src/core includes no PostgreSQL header: the PostgreSQL layer reaches it only through idem_core.h"
#endif

#ifdef __cplusplus
#define IDEM_CORE_NOEXCEPT noexcept
extern "C" {
#else
#define IDEM_CORE_NOEXCEPT
#endif

#define IDEM_SHA256_BYTES 32
#define IDEM_SHA256_HEX_CHARS 64
#define IDEM_MAX_KEY_BYTES 255
#define IDEM_MAX_SCOPE_BYTES 255
/* an IMF-fixdate, "Tue, 08 Dec 2026 10:30:00 GMT" */
#define IDEM_HTTP_DATE_CHARS 29

/* Why an input was rejected; IDEM_OK when it was not. */
typedef enum IdemStatus
{
	IDEM_OK = 0,
	IDEM_ERR_EMPTY,
	IDEM_ERR_TOO_LONG,
	IDEM_ERR_CONTROL_CHAR,
	IDEM_ERR_HEX_LENGTH,
	IDEM_ERR_HEX_DIGIT,
	IDEM_ERR_STATUS_RANGE,
	IDEM_ERR_CRYPTO,
	IDEM_ERR_INTERNAL,
	/* a request body the core does not canonicalise itself: PostgreSQL's jsonb decides (fingerprint) */
	IDEM_ERR_NOT_CANONICAL,
	/* 1.4: a time an HTTP-date cannot write (before 1970 or after 9999) */
	IDEM_ERR_DATE_RANGE,
	/* 1.4: a stored header's name that is not an RFC 9110 token */
	IDEM_ERR_NOT_TOKEN
} IdemStatus;

/* What idem_claim answers. */
typedef enum IdemClaimOutcome
{
	IDEM_OUTCOME_CLAIMED = 0,
	IDEM_OUTCOME_REPLAY,
	IDEM_OUTCOME_MISMATCH,
	IDEM_OUTCOME_IN_PROGRESS,
	/* the key's row changed after this snapshot: the client must retry */
	IDEM_OUTCOME_SERIALIZATION_FAILURE,
	/* 1.4: the key's response expired within idempotency.tombstone_ttl; the request is not run again */
	IDEM_OUTCOME_EXPIRED
} IdemClaimOutcome;

/* What idem_complete does with a response. */
typedef enum IdemCompletion
{
	IDEM_COMPLETION_STORE = 0,
	IDEM_COMPLETION_RELEASE,	/* 5xx: never cached, the key is given back */
	IDEM_COMPLETION_BAD_STATUS,
	IDEM_COMPLETION_TOO_LARGE
} IdemCompletion;

/* The stored row for a key, as one lookup saw it. */
typedef struct IdemStoredRow
{
	bool		found;
	bool		expired;
	bool		hash_matches;
	/* lease mode (1.1): the row is a lease, not a stored response */
	bool		leased;
	/* and the lease has not run out */
	bool		lease_live;
	/* 1.4: expired less than idempotency.tombstone_ttl ago (always false when tombstones are off) */
	bool		within_tombstone_ttl;
} IdemStoredRow;

/*
 * Everything the claim decision depends on. The key's lock is tried first;
 * the row is then read with a snapshot taken after that, or, under REPEATABLE
 * READ and SERIALIZABLE, with the caller's snapshot and, when that shows no
 * live row, once more with the latest one.
 */
typedef struct IdemClaimFacts
{
	/* this transaction claimed the key and has neither completed nor released it */
	bool		claimed_by_this_transaction;
	/* the key's try-lock was granted now or was already this transaction's */
	bool		lock_granted;
	/* the latest snapshot shows the key's row other than the caller's snapshot does */
	bool		row_changed_after_snapshot;
	/* the key's row as the caller's snapshot sees it */
	IdemStoredRow row;
	/* 1.4: no row, and a tombstone of the key younger than idempotency.tombstone_ttl */
	bool		tombstone_found;
} IdemClaimFacts;

/* What is wrong with an argument, to follow its name ("must not be empty"), or what failed in the core. */
const char *idem_core_status_message(IdemStatus status) IDEM_CORE_NOEXCEPT;

/* Keys: 1..255 bytes, no C0/C1 control character and no DEL. */
IdemStatus	idem_core_validate_key(const char *key, size_t len) IDEM_CORE_NOEXCEPT;

/* Scopes: 0..255 bytes, same character rule as keys. */
IdemStatus	idem_core_validate_scope(const char *scope, size_t len) IDEM_CORE_NOEXCEPT;

/*
 * The character rule alone, on UTF-8 text: IDEM_ERR_CONTROL_CHAR for a C0 or C1
 * control or DEL. The PostgreSQL layer applies it to a key or scope converted to
 * UTF-8 when the database encoding is another one.
 */
IdemStatus	idem_core_check_controls(const char *utf8, size_t len) IDEM_CORE_NOEXCEPT;

/*
 * 1.4: a stored response header, as a client writes it back on a replay. A name is an RFC 9110 token (1*tchar):
 * IDEM_ERR_EMPTY or IDEM_ERR_NOT_TOKEN otherwise. A value (RFC 9110 field-value) holds no control but HTAB:
 * IDEM_ERR_CONTROL_CHAR for NUL, CR, LF, any other C0 control or DEL (bytes from 0x80 are obs-text, allowed).
 */
IdemStatus	idem_core_check_header_name(const char *name, size_t len) IDEM_CORE_NOEXCEPT;
IdemStatus	idem_core_check_header_value(const char *value, size_t len) IDEM_CORE_NOEXCEPT;

/*
 * 1.4: an interval as a fixed duration in microseconds, as extract(epoch) counts it, whatever the TimeZone: a day
 * is 24 hours, a month 30 days, a year (12 months) 365.25 days. Saturates at INT64_MIN / INT64_MAX.
 */
int64_t		idem_core_fixed_span_usecs(int64_t time_usecs, int32_t days, int32_t months) IDEM_CORE_NOEXCEPT;

/* 64 hexadecimal digits, either case, into 32 bytes. */
IdemStatus	idem_core_parse_sha256_hex(const char *hex, size_t len,
									   uint8_t out[IDEM_SHA256_BYTES]) IDEM_CORE_NOEXCEPT;

/* Lowercase hex of a 32-byte digest, not NUL-terminated. */
void		idem_core_sha256_to_hex(const uint8_t digest[IDEM_SHA256_BYTES],
									char out[IDEM_SHA256_HEX_CHARS]) IDEM_CORE_NOEXCEPT;

/* SHA-256 of one buffer (OpenSSL EVP). */
IdemStatus	idem_core_sha256(const void *data, size_t len,
							 uint8_t out[IDEM_SHA256_BYTES]) IDEM_CORE_NOEXCEPT;

/*
 * The identity of a key within its scope: SHA-256 over the length-prefixed
 * scope and key, so ("a", "bc") and ("ab", "c") differ.
 */
IdemStatus	idem_core_key_identity(const char *scope, size_t scope_len,
								   const char *key, size_t key_len,
								   uint8_t out[IDEM_SHA256_BYTES]) IDEM_CORE_NOEXCEPT;

/* The 64-bit lock tag derived from a key identity. */
uint64_t	idem_core_lock_tag(const uint8_t identity[IDEM_SHA256_BYTES]) IDEM_CORE_NOEXCEPT;

IdemClaimOutcome idem_core_decide_claim(const IdemClaimFacts *facts) IDEM_CORE_NOEXCEPT;

IdemCompletion idem_core_decide_completion(int32_t http_status,
										   uint64_t response_bytes,
										   uint64_t max_response_bytes) IDEM_CORE_NOEXCEPT;

const char *idem_core_outcome_name(IdemClaimOutcome outcome) IDEM_CORE_NOEXCEPT;

/*
 * The parts of an HTTP request that make its fingerprint (1.3). content_type NULL: the request had none (or
 * the caller wants its body hashed as JSON whatever the header said). query: without or with a leading '?'
 * (dropped); empty means none.
 */
typedef struct IdemRequest
{
	const char *method;
	size_t		method_len;
	const char *path;
	size_t		path_len;
	const char *query;
	size_t		query_len;
	const char *content_type;
	size_t		content_type_len;
	const char *body;
	size_t		body_len;
} IdemRequest;

/*
 * Which form the fingerprint takes: JSON (a JSON media type, or no content type and a body) or bytes (any other
 * content type, or neither content type nor body).
 */
bool		idem_core_fingerprint_is_json(const IdemRequest *request) IDEM_CORE_NOEXCEPT;

/*
 * The fingerprint, 32 bytes. The JSON form is canonicalised here for a UTF-8 database (the body's text is the
 * database's): IDEM_ERR_NOT_CANONICAL when the body is not JSON or lies outside what the core reproduces
 * exactly, and the caller then canonicalises it with PostgreSQL's jsonb (which reports what is wrong) and calls
 * idem_core_fingerprint_json_body.
 */
IdemStatus	idem_core_fingerprint(const IdemRequest *request, uint8_t out[IDEM_SHA256_BYTES]) IDEM_CORE_NOEXCEPT;

/* The JSON form around a body already in jsonb's canonical text. */
IdemStatus	idem_core_fingerprint_json_body(const IdemRequest *request, const char *canonical_body,
											size_t canonical_body_len,
											uint8_t out[IDEM_SHA256_BYTES]) IDEM_CORE_NOEXCEPT;

/*
 * 1.4, rule key-lifetime: unix_seconds (from 1970-01-01 00:00:00 GMT, a timestamp truncated to the second) as an
 * RFC 9110 IMF-fixdate, "Tue, 08 Dec 2026 10:30:00 GMT": IDEM_HTTP_DATE_CHARS characters, not NUL-terminated, in
 * GMT with English names whatever the locale. IDEM_ERR_DATE_RANGE, out untouched, before 1970 or after 9999.
 */
IdemStatus	idem_core_http_date(int64_t unix_seconds, char out[IDEM_HTTP_DATE_CHARS]) IDEM_CORE_NOEXCEPT;

#ifdef __cplusplus
}
#endif

#endif							/* IDEM_CORE_H */
