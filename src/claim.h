/* claim.h: one claim attempt, shared by the transactional claim (claim.c) and lease mode (lease.c). */
#ifndef IDEM_CLAIM_H
#define IDEM_CLAIM_H

#include "fmgr.h"

#include "key_lock.h"
#include "key_store.h"
#include "stats.h"

typedef struct ClaimAttempt
{
	IdemClaimOutcome outcome;	/* never SERIALIZATION_FAILURE: that is an ERROR */
	KeyRow		row;			/* the key's row as seen by the deciding lookup */
	KeyLockResult lock;			/* kept only when the outcome is CLAIMED */
} ClaimAttempt;

/*
 * Tries the key's lock, reads its row and decides; while the answer is
 * in_progress and wait_until (0: never wait) has not passed, pauses holding
 * nothing and tries again. ERROR 40001 when the snapshot is too old.
 */
void		claim_attempt(const KeyRef *ref, const uint8 identity[IDEM_SHA256_BYTES],
						  const uint8 request_hash[IDEM_SHA256_BYTES], TimestampTz wait_until,
						  ClaimAttempt *out);

/* The longest lease and wait (README, Limits); the longest ttl, idempotency.ttl's maximum too, is in guc.h. */
#define IDEM_MAX_LEASE_DAYS 365
#define IDEM_MAX_WAIT_DAYS 1

/* The spans claim_span_end checks, each with its own messages. */
typedef enum ClaimSpan
{
	CLAIM_SPAN_TTL,				/* at most IDEM_MAX_TTL_DAYS */
	CLAIM_SPAN_WAIT,			/* at most IDEM_MAX_WAIT_DAYS */
	CLAIM_SPAN_LEASE			/* at most IDEM_MAX_LEASE_DAYS */
} ClaimSpan;

/* from + span as a fixed duration (a day 24 hours, a month 30 days: 1.4); ERROR 22023 unless later than from
 * and at most the span's limit in days after it, 22008 past the timestamp range. */
TimestampTz claim_span_end(TimestampTz from, Datum span, ClaimSpan kind);

/* now() + ttl (the argument, or idempotency.ttl when NULL); ERROR 22023 unless within (0, 3650 days]. */
TimestampTz claim_expiry(FunctionCallInfo fcinfo, int ttl_argno);

/* The clock plus the wait argument; 0 when it is NULL or zero; ERROR 22023 when negative or over a day. */
TimestampTz claim_wait_deadline(FunctionCallInfo fcinfo, int wait_argno);

/* 64 hex digits into 32 bytes; ERROR 22023 otherwise. */
void		claim_parse_request_hash(text *hex, uint8 request_hash[IDEM_SHA256_BYTES]);

IdemCounter claim_outcome_counter(IdemClaimOutcome outcome);

/* The columns idem_claim's result has, and idem_lease's begins with. */
typedef enum ClaimColumn
{
	CLAIM_COL_OUTCOME,
	CLAIM_COL_HTTP_STATUS,
	CLAIM_COL_RESPONSE_BODY,
	CLAIM_COL_RESPONSE_HEADERS,
	CLAIM_COL_EXPIRES_AT,
	CLAIM_COLUMNS
} ClaimColumn;

/*
 * The one mapping from an answer to those columns: the outcome's name, then
 * the stored response (replay), the mismatch status, 409 (in_progress), and
 * the expiry: claimed_until for a claim, the stored row's otherwise. ERROR
 * for an outcome that is not an answer.
 */
void		claim_outcome_columns(IdemClaimOutcome outcome, const KeyRow *stored,
								  TimestampTz claimed_until, Datum *values, bool *nulls);

/*
 * The stored response's body as the bytes a replay sends: the bytes stored (1.3), or a jsonb body's text in
 * UTF-8 (1.0-1.2); *isnull when the response has no body.
 */
Datum		claim_replay_bytes(const KeyRow *stored, bool *isnull);

#endif
