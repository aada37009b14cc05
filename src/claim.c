/* claim.c: idem_claim, the first call of a request with an Idempotency-Key. */
#include "postgres.h"

#include "access/htup_details.h"
#include "common/int.h"
#include "catalog/pg_type.h"
#include "access/xact.h"
#include "utils/resowner.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "guc.h"
#include "claim.h"
#include "fingerprint.h"
#include "key_lifetime.h"
#include "key_lock.h"
#include "lock_timeout.h"
#include "key_store.h"
#include "sql_args.h"
#include "stats.h"
#include "tombstones.h"
#include "txn_claims.h"
#include "pg_compat.h"

PG_FUNCTION_INFO_V1(idem_claim);
PG_FUNCTION_INFO_V1(idem_claim_wait);

/* idem_claim(key, request_hash, ttl, scope) */
enum
{
	ARG_KEY,
	ARG_REQUEST_HASH,
	ARG_TTL,
	ARG_SCOPE
};

/* idem_claim_wait(key, request_hash, wait, ttl, scope) */
enum
{
	WAIT_ARG_KEY,
	WAIT_ARG_REQUEST_HASH,
	WAIT_ARG_WAIT,
	WAIT_ARG_TTL,
	WAIT_ARG_SCOPE
};

/* Where each of the two functions has its arguments; wait NO_ARG: idem_claim never waits. */
#define NO_ARG (-1)

typedef struct ClaimArgs
{
	int			key;
	int			request_hash;
	int			ttl;
	int			scope;
	int			wait;
} ClaimArgs;

static const ClaimArgs claim_args = {
	.key = ARG_KEY, .request_hash = ARG_REQUEST_HASH, .ttl = ARG_TTL, .scope = ARG_SCOPE, .wait = NO_ARG
};
static const ClaimArgs claim_wait_args = {
	.key = WAIT_ARG_KEY, .request_hash = WAIT_ARG_REQUEST_HASH, .ttl = WAIT_ARG_TTL, .scope = WAIT_ARG_SCOPE,
	.wait = WAIT_ARG_WAIT
};

/*
 * from + span, checked against what the README's Limits promise: strictly after
 * from (an interval such as '-1 year +365 days' compares greater than zero and
 * still lands in the past) and at most max_days after it, so no stored timestamp
 * gets near the end of the range that pg_dump and a restore accept. ERROR 22023
 * otherwise; an interval past the timestamp range itself is ERROR 22008.
 *
 * 1.4: the span is a fixed duration, as extract(epoch) counts it: a day is 24 hours, a month 30 days (a year
 * 365.25), whatever the caller's TimeZone. timestamptz_pl_interval added days and months on the calendar of the
 * session's TimeZone, so a ttl of '1 day' lasted 23 or 25 hours across a DST change, and two callers with
 * different TimeZone settings got different expiries for the same key.
 */
TimestampTz
claim_span_end(TimestampTz from, Datum span, ClaimSpan kind)
{
	Interval   *interval = DatumGetIntervalP(span);
	int64		usecs = idem_core_fixed_span_usecs(interval->time, interval->day, interval->month);
	TimestampTz end;
	int			max_days = kind == CLAIM_SPAN_TTL ? IDEM_MAX_TTL_DAYS
		: kind == CLAIM_SPAN_WAIT ? IDEM_MAX_WAIT_DAYS : IDEM_MAX_LEASE_DAYS;

	if (pg_add_s64_overflow(from, usecs, &end) || !IS_VALID_TIMESTAMP(end))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	if (end <= from)
	{
		if (kind == CLAIM_SPAN_TTL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("idempotency ttl must be greater than zero")));
		if (kind == CLAIM_SPAN_WAIT)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("idempotency wait must not be negative")));
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency lease must be greater than zero")));
	}
	if (end - from > (TimestampTz) max_days * USECS_PER_DAY)
	{
		if (kind == CLAIM_SPAN_TTL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg_plural("idempotency ttl must be at most %d day",
								   "idempotency ttl must be at most %d days", max_days, max_days)));
		if (kind == CLAIM_SPAN_WAIT)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg_plural("idempotency wait must be at most %d day",
								   "idempotency wait must be at most %d days", max_days, max_days)));
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg_plural("idempotency lease must be at most %d day",
							   "idempotency lease must be at most %d days", max_days, max_days)));
	}
	return end;
}

/* now() + ttl, where ttl is the argument or idempotency.ttl; ERROR 22023 unless within (0, 3650 days]. */
TimestampTz
claim_expiry(FunctionCallInfo fcinfo, int ttl_argno)
{
	Interval   *default_ttl = palloc0(sizeof(Interval));
	Datum		ttl;

	default_ttl->time = (int64) idem_ttl_seconds * USECS_PER_SEC;
	ttl = PG_ARGISNULL(ttl_argno) ? IntervalPGetDatum(default_ttl) : PG_GETARG_DATUM(ttl_argno);
	return claim_span_end(GetCurrentTransactionStartTimestamp(), ttl, CLAIM_SPAN_TTL);
}

/* Expiry counts from the transaction's start, as in 1.0; a lease runs on the clock, read now. */
static void
describe_row(const KeyRow *stored, const uint8 request_hash[IDEM_SHA256_BYTES],
			 IdemStoredRow *row)
{
	row->found = stored->found;
	row->expired = stored->found &&
		stored->expires_at <= GetCurrentTransactionStartTimestamp();
	row->hash_matches = stored->found &&
		memcmp(stored->request_hash, request_hash, IDEM_SHA256_BYTES) == 0;
	row->leased = stored->found && stored->leased;
	row->lease_live = row->leased && stored->lease_until > GetCurrentTimestamp();
}

/*
 * 1.4, tombstones: only while idempotency.tombstone_ttl is above 0. An expired row still there tells when it
 * expired; with no row, the key's tombstone does (a probe, so a claim of a new key costs nothing more while
 * tombstones are off). The core decides: expired completed keys only, never a lease that ran out.
 */
static void
describe_tombstone(const KeyRef *ref, KeyRow *stored, IdemClaimFacts *facts)
{
	TimestampTz since;

	if (idem_tombstone_ttl_seconds <= 0)
		return;
	since = GetCurrentTransactionStartTimestamp() - (TimestampTz) idem_tombstone_ttl_seconds * USECS_PER_SEC;
	if (stored->found)
		facts->row.within_tombstone_ttl = stored->expires_at > since;
	else
		facts->tombstone_found = tombstone_probe(ref, since, &stored->expires_at);
}

/* A stored response that answers every claim: found, not expired, not a lease. */
static bool
row_is_settled(const IdemStoredRow *row)
{
	return row->found && !row->expired && !(row->leased && !row->lease_live);
}

/*
 * The blessed result row types of the claim functions, kept per function in TopMemoryContext: building one
 * costs more than the rest of a replay. A few functions return them (idem_claim, idem_claim_wait,
 * idem_claim_request), so a backend that alternates them keeps each one once; a slot taken for another
 * function frees what it held. A row type changed by ALTER TYPE has a new typcache identifier and is read
 * again. A function's OID names its result type for good: CREATE OR REPLACE cannot change it.
 */
#define RESULT_DESCS 4
typedef struct ResultDesc
{
	Oid			function;
	Oid			type;			/* the named row type returned; InvalidOid: a record */
	uint64		type_identifier;	/* its typcache tupDesc_identifier when desc was made */
	TupleDesc	desc;			/* NULL: the slot is free */
} ResultDesc;

static ResultDesc result_descs[RESULT_DESCS];
static int	result_descs_next = 0;

/* The typcache's identifier of a row type's current shape. */
static uint64
row_type_identifier(Oid type)
{
	return lookup_type_cache(type, TYPECACHE_TUPDESC)->tupDesc_identifier;
}

/* The result row type of the called function; ERROR unless it is a row of natts columns (0: any number). */
static TupleDesc
cached_result_desc(FunctionCallInfo fcinfo, int natts)
{
	Oid			function = fcinfo->flinfo->fn_oid;
	ResultDesc *slot = NULL;
	TupleDesc	built;
	Oid			type;
	MemoryContext old;

	for (int i = 0; i < RESULT_DESCS; i++)
		if (result_descs[i].desc != NULL && result_descs[i].function == function)
		{
			slot = &result_descs[i];
			break;
		}
	if (slot != NULL &&
		(!OidIsValid(slot->type) || row_type_identifier(slot->type) == slot->type_identifier))
		return slot->desc;

	if (get_call_result_type(fcinfo, &type, &built) != TYPEFUNC_COMPOSITE ||
		(natts != 0 && built->natts != natts))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("function %s does not return the row type the idempotency library makes",
						format_procedure(function)),
				 errdetail("The library makes a row of %d columns.", natts),
				 errhint("Run ALTER EXTENSION idempotency UPDATE, or undo the change to the function's result type.")));
	if (slot == NULL)
	{
		slot = &result_descs[result_descs_next];
		result_descs_next = (result_descs_next + 1) % RESULT_DESCS;
	}
	if (slot->desc != NULL)
		FreeTupleDesc(slot->desc);
	slot->desc = NULL;
	old = MemoryContextSwitchTo(TopMemoryContext);
	built = BlessTupleDesc(CreateTupleDescCopy(built));
	MemoryContextSwitchTo(old);
	slot->function = function;
	slot->type = type == RECORDOID ? InvalidOid : type;
	slot->type_identifier = OidIsValid(slot->type) ? row_type_identifier(slot->type) : 0;
	slot->desc = built;
	return built;
}

static TupleDesc
claim_result_desc(FunctionCallInfo fcinfo)
{
	return cached_result_desc(fcinfo, CLAIM_COLUMNS);
}

void
claim_outcome_columns(IdemClaimOutcome outcome, const KeyRow *stored, TimestampTz claimed_until,
					  Datum *values, bool *nulls)
{
	for (int column = 0; column < CLAIM_COLUMNS; column++)
	{
		values[column] = (Datum) 0;
		nulls[column] = true;
	}
	values[CLAIM_COL_OUTCOME] = CStringGetTextDatum(idem_core_outcome_name(outcome));
	nulls[CLAIM_COL_OUTCOME] = false;

	switch (outcome)
	{
		case IDEM_OUTCOME_CLAIMED:
			values[CLAIM_COL_EXPIRES_AT] = TimestampTzGetDatum(claimed_until);
			nulls[CLAIM_COL_EXPIRES_AT] = false;
			break;
		case IDEM_OUTCOME_REPLAY:
			values[CLAIM_COL_HTTP_STATUS] = Int32GetDatum(stored->http_status);
			nulls[CLAIM_COL_HTTP_STATUS] = stored->http_status_null;
			values[CLAIM_COL_RESPONSE_BODY] = stored->body;
			nulls[CLAIM_COL_RESPONSE_BODY] = stored->body_null;
			/* A response stored as bytes (1.3): its body as jsonb when it is JSON, else none. */
			if (stored->body_null && !stored->bytes_null)
				values[CLAIM_COL_RESPONSE_BODY] =
					response_bytes_as_jsonb(stored->content_type, stored->content_type_null, stored->bytes,
											&nulls[CLAIM_COL_RESPONSE_BODY]);
			values[CLAIM_COL_RESPONSE_HEADERS] = stored->headers;
			nulls[CLAIM_COL_RESPONSE_HEADERS] = stored->headers_null;
			values[CLAIM_COL_EXPIRES_AT] = TimestampTzGetDatum(stored->expires_at);
			nulls[CLAIM_COL_EXPIRES_AT] = false;
			break;
		case IDEM_OUTCOME_MISMATCH:
			values[CLAIM_COL_HTTP_STATUS] = Int32GetDatum(idem_mismatch_status);
			nulls[CLAIM_COL_HTTP_STATUS] = false;
			values[CLAIM_COL_EXPIRES_AT] = TimestampTzGetDatum(stored->expires_at);
			nulls[CLAIM_COL_EXPIRES_AT] = false;
			break;
		case IDEM_OUTCOME_IN_PROGRESS:
			values[CLAIM_COL_HTTP_STATUS] = Int32GetDatum(409);
			nulls[CLAIM_COL_HTTP_STATUS] = false;
			break;
		case IDEM_OUTCOME_EXPIRED:
			/* 410 Gone, and when the key's response expired */
			values[CLAIM_COL_HTTP_STATUS] = Int32GetDatum(410);
			nulls[CLAIM_COL_HTTP_STATUS] = false;
			values[CLAIM_COL_EXPIRES_AT] = TimestampTzGetDatum(stored->expires_at);
			nulls[CLAIM_COL_EXPIRES_AT] = false;
			break;
		default:
			elog(ERROR, "idempotency: outcome %s is not an answer",
				 idem_core_outcome_name(outcome));
	}
}

static Datum
claim_result(FunctionCallInfo fcinfo, IdemClaimOutcome outcome,
			 const KeyRow *stored, TimestampTz claimed_until)
{
	TupleDesc	desc = claim_result_desc(fcinfo);
	Datum		values[CLAIM_COLUMNS];
	bool		nulls[CLAIM_COLUMNS];

	claim_outcome_columns(outcome, stored, claimed_until, values, nulls);
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

IdemCounter
claim_outcome_counter(IdemClaimOutcome outcome)
{
	switch (outcome)
	{
		case IDEM_OUTCOME_REPLAY:
			return IDEM_COUNT_REPLAYS;
		case IDEM_OUTCOME_MISMATCH:
			return IDEM_COUNT_MISMATCHES;
		case IDEM_OUTCOME_IN_PROGRESS:
			return IDEM_COUNT_IN_PROGRESS;
		default:
			return IDEM_COUNT_CLAIMS;
	}
}

/*
 * REPEATABLE READ and SERIALIZABLE: does the latest snapshot show the key's
 * row other than the caller's does? A completion, or the replacement or removal
 * of an expired row, committed after the caller's snapshot was taken.
 */
static bool
row_changed_after_snapshot(const KeyRef *ref, const KeyRow *seen)
{
	KeyRow latest;

	key_store_lookup(ref, LOOKUP_LATEST_SNAPSHOT, &latest);
	if (latest.found != seen->found)
		return true;
	return latest.found && (latest.expires_at != seen->expires_at ||
							memcmp(latest.request_hash, seen->request_hash, IDEM_SHA256_BYTES) != 0 ||
							latest.leased != seen->leased || latest.lease_until != seen->lease_until ||
							memcmp(&latest.lease_token, &seen->lease_token, sizeof(pg_uuid_t)) != 0);
}

/* Sleeps up to the deadline, at most max_ms, waking for interrupts (cancel, statement_timeout). */
static void
sleep_until(TimestampTz deadline, long max_ms)
{
	long		remaining_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);

	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 Max(1, Min(remaining_ms, max_ms)), PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}

static void
wait_step(void *identity)
{
	key_lock_wait(identity);
}

/*
 * Waits for a transaction holding the key's lock to end, at most until the
 * deadline: a lock wait, so it wakes the moment the holder commits or rolls
 * back. A lock timeout ends it; any other error (cancel, statement_timeout,
 * deadlock) goes on to the caller. True when the lock was granted: it is this
 * transaction's now.
 */
static bool
wait_for_key_lock(const uint8 identity[IDEM_SHA256_BYTES], TimestampTz deadline)
{
	long		remaining_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
	char		timeout[32];

	snprintf(timeout, sizeof(timeout), "%ld", Max(remaining_ms, 1));
	return run_with_lock_timeout(timeout, wait_step, (void *) identity);
}

void
claim_attempt(const KeyRef *ref, const uint8 identity[IDEM_SHA256_BYTES],
			  const uint8 request_hash[IDEM_SHA256_BYTES], TimestampTz wait_until, ClaimAttempt *out)
{
	const TxnClaim *held = txn_claims_find(identity);
	IdemClaimFacts facts;
	long		pause_ms = 2;
	bool		waited = false;
	bool		lock_waited_for = false;

	out->lock = KEY_LOCK_BUSY;

	for (;;)
	{
		memset(&facts, 0, sizeof(facts));
		memset(&out->row, 0, sizeof(out->row));
		facts.claimed_by_this_transaction = held != NULL && held->state == TXN_CLAIM_HELD;
		if (!facts.claimed_by_this_transaction)
		{
			/*
			 * Lock first, then read: under READ COMMITTED the read takes a new
			 * snapshot, which sees every completion committed before the lock was
			 * granted (a transaction is visible before it releases its locks).
			 */
			out->lock = lock_waited_for ? KEY_LOCK_TAKEN : key_lock_try(identity);
			facts.lock_granted = out->lock != KEY_LOCK_BUSY;
			key_store_lookup(ref, LOOKUP_CALLER_SNAPSHOT, &out->row);
			describe_row(&out->row, request_hash, &facts.row);
			if (!row_is_settled(&facts.row))
				describe_tombstone(ref, &out->row, &facts);
			if (IsolationUsesXactSnapshot() && !row_is_settled(&facts.row))
				facts.row_changed_after_snapshot = row_changed_after_snapshot(ref, &out->row);
		}
		out->outcome = idem_core_decide_claim(&facts);

		/*
		 * A lock taken only to find a finished request is not kept. One granted
		 * after a wait belongs to the transaction's resource owner (the wait's
		 * subtransaction handed it up), not the portal's: release it there.
		 */
		if (out->lock == KEY_LOCK_TAKEN && out->outcome != IDEM_OUTCOME_CLAIMED)
		{
			ResourceOwner owner = CurrentResourceOwner;

			if (lock_waited_for)
				CurrentResourceOwner = CurTransactionResourceOwner;
			key_lock_release(identity);
			CurrentResourceOwner = owner;
		}
		lock_waited_for = false;

		/*
		 * Bounded wait, until the key settles or the deadline passes. A
		 * transaction holding the key: wait for its lock, which wakes at its
		 * end. A lease (no lock held): look again after a pause that doubles
		 * up to 50 ms, holding nothing. A transaction's own claim never
		 * settles while it waits.
		 */
		if (out->outcome != IDEM_OUTCOME_IN_PROGRESS || facts.claimed_by_this_transaction ||
			wait_until == 0 || GetCurrentTimestamp() >= wait_until)
			break;
		waited = true;
		if (out->lock == KEY_LOCK_BUSY)
			lock_waited_for = wait_for_key_lock(identity, wait_until);
		else
		{
			sleep_until(wait_until, pause_ms);
			pause_ms = Min(pause_ms * 2, 50);
		}
	}
	if (waited)
		stats_count(IDEM_COUNT_WAITS, 1);

	if (out->outcome == IDEM_OUTCOME_SERIALIZATION_FAILURE)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access: idempotency key was completed by a concurrent transaction"),
				 errdetail("The transaction's snapshot predates the key's stored response."),
				 errhint("Retry the transaction.")));
	/* expired has no idem_stats counter in 1.4 (the view keeps its columns); it is not counted as a claim */
	if (out->outcome != IDEM_OUTCOME_EXPIRED)
		stats_count(claim_outcome_counter(out->outcome), 1);
}

TimestampTz
claim_wait_deadline(FunctionCallInfo fcinfo, int wait_argno)
{
	Interval   *zero = palloc0(sizeof(Interval));
	Datum		wait;

	if (PG_ARGISNULL(wait_argno))
		return 0;
	wait = PG_GETARG_DATUM(wait_argno);
	if (DatumGetBool(DirectFunctionCall2(interval_eq, wait, IntervalPGetDatum(zero))))
		return 0;
	return claim_span_end(GetCurrentTimestamp(), wait, CLAIM_SPAN_WAIT);
}

/* The transactional claim, by idem_claim (never waits) and idem_claim_wait. */
static Datum
claim_transactional(FunctionCallInfo fcinfo, const ClaimArgs *args)
{
	KeyRef		ref;
	text	   *request_hash_hex;
	uint8		identity[IDEM_SHA256_BYTES];
	uint8		request_hash[IDEM_SHA256_BYTES];
	ClaimAttempt attempt;
	TxnClaim	claim;
	TimestampTz expires_at;
	TimestampTz wait_until;

	ref.extension_function = fcinfo->flinfo->fn_oid;
	ref.key = arg_text_required(fcinfo, args->key, "key");
	request_hash_hex = arg_text_required(fcinfo, args->request_hash, "request_hash");
	ref.scope = arg_text_required(fcinfo, args->scope, "scope");
	key_identity_from_args(ref.scope, ref.key, identity);
	claim_parse_request_hash(request_hash_hex, request_hash);
	expires_at = claim_expiry(fcinfo, args->ttl);
	wait_until = args->wait == NO_ARG ? 0 : claim_wait_deadline(fcinfo, args->wait);
	PreventCommandIfReadOnly("idem_claim()");
	PreventCommandDuringRecovery("idem_claim()");

	claim_attempt(&ref, identity, request_hash, wait_until, &attempt);
	if (attempt.outcome == IDEM_OUTCOME_CLAIMED)
	{
		claim.state = TXN_CLAIM_HELD;
		memcpy(claim.request_hash, request_hash, IDEM_SHA256_BYTES);
		claim.expires_at = expires_at;
		claim.replaces_expired_row = attempt.row.found;
		txn_claims_record_claim(identity, ref.scope, ref.key, &claim);
	}
	return claim_result(fcinfo, attempt.outcome, &attempt.row, expires_at);
}

void
claim_parse_request_hash(text *hex, uint8 request_hash[IDEM_SHA256_BYTES])
{
	IdemStatus	status = idem_core_parse_sha256_hex(VARDATA_ANY(hex), VARSIZE_ANY_EXHDR(hex),
													request_hash);

	if (status != IDEM_OK)
		report_invalid_argument(IDEM_ARG_REQUEST_HASH, status);
}

Datum
idem_claim(PG_FUNCTION_ARGS)
{
	return claim_transactional(fcinfo, &claim_args);
}

Datum
idem_claim_wait(PG_FUNCTION_ARGS)
{
	return claim_transactional(fcinfo, &claim_wait_args);
}

/*
 * idem_claim_request(key, scope, method, path, query, content_type, body, ttl): the transactional claim of
 * idem_claim with the request's fingerprint computed here (1.3, issue 30), answering one idem_request_claim
 * value: outcome, http_status, content_type, headers, body (bytea). A replay returns the stored bytes; a
 * response stored as jsonb (1.0-1.2) comes back as the UTF-8 bytes of its jsonb text.
 */
PG_FUNCTION_INFO_V1(idem_claim_request);

enum
{
	REQUEST_ARG_KEY,
	REQUEST_ARG_SCOPE,
	REQUEST_ARG_METHOD,
	REQUEST_ARG_PATH,
	REQUEST_ARG_QUERY,
	REQUEST_ARG_CONTENT_TYPE,
	REQUEST_ARG_BODY,
	REQUEST_ARG_TTL
};

static const RequestArgs claim_request_args = {
	.method = REQUEST_ARG_METHOD, .path = REQUEST_ARG_PATH, .query = REQUEST_ARG_QUERY,
	.content_type = REQUEST_ARG_CONTENT_TYPE, .body = REQUEST_ARG_BODY
};

enum
{
	REQUEST_COL_OUTCOME,
	REQUEST_COL_HTTP_STATUS,
	REQUEST_COL_CONTENT_TYPE,
	REQUEST_COL_HEADERS,
	REQUEST_COL_BODY,
	REQUEST_COLUMNS
};

/* The blessed idem_request_claim row type. */
static TupleDesc
request_claim_desc(FunctionCallInfo fcinfo)
{
	return cached_result_desc(fcinfo, REQUEST_COLUMNS);
}

/* A jsonb body of 1.0-1.2 as the bytes of its text, in UTF-8. */
static bytea *
jsonb_body_as_bytes(Datum body)
{
	Jsonb	   *jb = DatumGetJsonbP(body);
	char	   *text = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
	char	   *utf8 = pg_server_to_any(text, strlen(text), PG_UTF8);
	size_t		len = strlen(utf8);
	bytea	   *result = palloc(VARHDRSZ + len);

	SET_VARSIZE(result, VARHDRSZ + len);
	memcpy(VARDATA(result), utf8, len);
	return result;
}

Datum
claim_replay_bytes(const KeyRow *stored, bool *isnull)
{
	*isnull = false;
	if (!stored->bytes_null)
		return stored->bytes;
	if (!stored->body_null)
		return PointerGetDatum(jsonb_body_as_bytes(stored->body));
	*isnull = true;
	return (Datum) 0;
}

Datum
idem_claim_request(PG_FUNCTION_ARGS)
{
	KeyRef		ref;
	uint8		identity[IDEM_SHA256_BYTES];
	uint8		request_hash[IDEM_SHA256_BYTES];
	ClaimAttempt attempt;
	TxnClaim	claim;
	TimestampTz expires_at;
	Datum		values[REQUEST_COLUMNS] = {0};
	bool		nulls[REQUEST_COLUMNS] = {true, true, true, true, true};

	ref.extension_function = fcinfo->flinfo->fn_oid;
	ref.key = arg_text_required(fcinfo, REQUEST_ARG_KEY, "key");
	ref.scope = arg_text_required(fcinfo, REQUEST_ARG_SCOPE, "scope");
	key_identity_from_args(ref.scope, ref.key, identity);
	request_fingerprint(fcinfo, &claim_request_args, request_hash);
	expires_at = claim_expiry(fcinfo, REQUEST_ARG_TTL);
	PreventCommandIfReadOnly("idem_claim_request()");
	PreventCommandDuringRecovery("idem_claim_request()");

	claim_attempt(&ref, identity, request_hash, 0, &attempt);
	values[REQUEST_COL_OUTCOME] = CStringGetTextDatum(idem_core_outcome_name(attempt.outcome));
	nulls[REQUEST_COL_OUTCOME] = false;
	switch (attempt.outcome)
	{
		case IDEM_OUTCOME_CLAIMED:
			claim.state = TXN_CLAIM_HELD;
			memcpy(claim.request_hash, request_hash, IDEM_SHA256_BYTES);
			claim.expires_at = expires_at;
			claim.replaces_expired_row = attempt.row.found;
			txn_claims_record_claim(identity, ref.scope, ref.key, &claim);
			break;
		case IDEM_OUTCOME_REPLAY:
			values[REQUEST_COL_HTTP_STATUS] = Int32GetDatum(attempt.row.http_status);
			nulls[REQUEST_COL_HTTP_STATUS] = attempt.row.http_status_null;
			values[REQUEST_COL_CONTENT_TYPE] = attempt.row.content_type;
			nulls[REQUEST_COL_CONTENT_TYPE] = attempt.row.content_type_null;
			values[REQUEST_COL_BODY] = claim_replay_bytes(&attempt.row, &nulls[REQUEST_COL_BODY]);
			break;
		case IDEM_OUTCOME_MISMATCH:
			values[REQUEST_COL_HTTP_STATUS] = Int32GetDatum(idem_mismatch_status);
			nulls[REQUEST_COL_HTTP_STATUS] = false;
			break;
		case IDEM_OUTCOME_IN_PROGRESS:
			values[REQUEST_COL_HTTP_STATUS] = Int32GetDatum(409);
			nulls[REQUEST_COL_HTTP_STATUS] = false;
			break;
		case IDEM_OUTCOME_EXPIRED:
			values[REQUEST_COL_HTTP_STATUS] = Int32GetDatum(410);
			nulls[REQUEST_COL_HTTP_STATUS] = false;
			break;
		default:
			elog(ERROR, "idempotency: outcome %s is not an answer", idem_core_outcome_name(attempt.outcome));
	}
	/* 1.4, rule key-lifetime: the headers this answer carries, the stored ones and the key's expiry */
	values[REQUEST_COL_HEADERS] = key_lifetime_headers(attempt.outcome, &attempt.row, expires_at,
													   &nulls[REQUEST_COL_HEADERS]);
	return HeapTupleGetDatum(heap_form_tuple(request_claim_desc(fcinfo), values, nulls));
}
