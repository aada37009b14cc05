/* claim.c: idem_claim, the first call of a request with an Idempotency-Key. */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "guc.h"
#include "key_lock.h"
#include "key_store.h"
#include "sql_args.h"
#include "stats.h"
#include "txn_claims.h"

PG_FUNCTION_INFO_V1(idem_claim);

enum
{
	ARG_KEY,
	ARG_REQUEST_HASH,
	ARG_TTL,
	ARG_SCOPE
};

enum
{
	COL_OUTCOME,
	COL_HTTP_STATUS,
	COL_RESPONSE_BODY,
	COL_RESPONSE_HEADERS,
	COL_EXPIRES_AT,
	CLAIM_RESULT_COLUMNS
};

/* now() + ttl, where ttl is the argument or idempotency.ttl; ERROR 22023 unless positive. */
static TimestampTz
claim_expiry(FunctionCallInfo fcinfo)
{
	Datum		now = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	Interval   *zero = palloc0(sizeof(Interval));
	Interval   *default_ttl = palloc0(sizeof(Interval));
	Datum		ttl;

	default_ttl->time = (int64) idem_ttl_seconds * USECS_PER_SEC;
	ttl = PG_ARGISNULL(ARG_TTL) ? IntervalPGetDatum(default_ttl) : PG_GETARG_DATUM(ARG_TTL);
	if (!DatumGetBool(DirectFunctionCall2(interval_gt, ttl, IntervalPGetDatum(zero))))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency ttl must be greater than zero")));
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval, now, ttl));
}

static void
describe_row(const KeyRow *stored, const uint8 request_hash[IDEM_SHA256_BYTES],
			 IdemStoredRow *row)
{
	row->found = stored->found;
	row->expired = stored->found &&
		stored->expires_at <= GetCurrentTransactionStartTimestamp();
	row->hash_matches = stored->found &&
		memcmp(stored->request_hash, request_hash, IDEM_SHA256_BYTES) == 0;
}

/* The blessed result row type, built once per backend: it costs more than the lookup. */
static TupleDesc
claim_result_desc(FunctionCallInfo fcinfo)
{
	static TupleDesc desc = NULL;
	static Oid	desc_function = InvalidOid;
	TupleDesc	built;
	MemoryContext old;

	if (desc != NULL && desc_function == fcinfo->flinfo->fn_oid)
		return desc;
	if (get_call_result_type(fcinfo, NULL, &built) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "idempotency: idem_claim must return a row");
	old = MemoryContextSwitchTo(TopMemoryContext);
	desc = BlessTupleDesc(CreateTupleDescCopy(built));
	MemoryContextSwitchTo(old);
	desc_function = fcinfo->flinfo->fn_oid;
	return desc;
}

static Datum
claim_result(FunctionCallInfo fcinfo, IdemClaimOutcome outcome,
			 const KeyRow *stored, TimestampTz claimed_until)
{
	TupleDesc	desc;
	Datum		values[CLAIM_RESULT_COLUMNS];
	bool		nulls[CLAIM_RESULT_COLUMNS];

	desc = claim_result_desc(fcinfo);
	memset(nulls, true, sizeof(nulls));
	values[COL_OUTCOME] = CStringGetTextDatum(idem_core_outcome_name(outcome));
	nulls[COL_OUTCOME] = false;

	switch (outcome)
	{
		case IDEM_OUTCOME_CLAIMED:
			values[COL_EXPIRES_AT] = TimestampTzGetDatum(claimed_until);
			nulls[COL_EXPIRES_AT] = false;
			break;
		case IDEM_OUTCOME_REPLAY:
			values[COL_HTTP_STATUS] = Int32GetDatum(stored->http_status);
			nulls[COL_HTTP_STATUS] = stored->http_status_null;
			values[COL_RESPONSE_BODY] = stored->body;
			nulls[COL_RESPONSE_BODY] = stored->body_null;
			values[COL_RESPONSE_HEADERS] = stored->headers;
			nulls[COL_RESPONSE_HEADERS] = stored->headers_null;
			values[COL_EXPIRES_AT] = TimestampTzGetDatum(stored->expires_at);
			nulls[COL_EXPIRES_AT] = false;
			break;
		case IDEM_OUTCOME_MISMATCH:
			values[COL_HTTP_STATUS] = Int32GetDatum(idem_mismatch_status);
			nulls[COL_HTTP_STATUS] = false;
			values[COL_EXPIRES_AT] = TimestampTzGetDatum(stored->expires_at);
			nulls[COL_EXPIRES_AT] = false;
			break;
		case IDEM_OUTCOME_IN_PROGRESS:
			values[COL_HTTP_STATUS] = Int32GetDatum(409);
			nulls[COL_HTTP_STATUS] = false;
			break;
		default:
			elog(ERROR, "idempotency: outcome %s is not an answer",
				 idem_core_outcome_name(outcome));
	}
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

static IdemCounter
outcome_counter(IdemClaimOutcome outcome)
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
							memcmp(latest.request_hash, seen->request_hash, IDEM_SHA256_BYTES) != 0);
}

Datum
idem_claim(PG_FUNCTION_ARGS)
{
	KeyRef		ref;
	text	   *request_hash_hex;
	uint8		identity[IDEM_SHA256_BYTES];
	uint8		request_hash[IDEM_SHA256_BYTES];
	const TxnClaim *held;
	IdemClaimFacts facts;
	IdemClaimOutcome outcome;
	KeyRow stored;
	KeyLockResult lock;
	TxnClaim	claim;
	TimestampTz expires_at;
	IdemStatus	status;

	ref.extension_function = fcinfo->flinfo->fn_oid;
	ref.key = arg_text_required(fcinfo, ARG_KEY, "key");
	request_hash_hex = arg_text_required(fcinfo, ARG_REQUEST_HASH, "request_hash");
	ref.scope = arg_text_required(fcinfo, ARG_SCOPE, "scope");
	key_identity_from_args(ref.scope, ref.key, identity);
	status = idem_core_parse_sha256_hex(VARDATA_ANY(request_hash_hex),
										VARSIZE_ANY_EXHDR(request_hash_hex), request_hash);
	if (status != IDEM_OK)
		report_invalid_argument(IDEM_ARG_REQUEST_HASH, status);
	expires_at = claim_expiry(fcinfo);
	PreventCommandIfReadOnly("idem_claim()");
	PreventCommandDuringRecovery("idem_claim()");

	memset(&facts, 0, sizeof(facts));
	memset(&stored, 0, sizeof(stored));
	held = txn_claims_find(identity);
	facts.claimed_by_this_transaction = held != NULL && held->state == TXN_CLAIM_HELD;

	lock = KEY_LOCK_BUSY;
	if (!facts.claimed_by_this_transaction)
	{
		/*
		 * Lock first, then read: under READ COMMITTED the read takes a new
		 * snapshot, which sees every completion committed before the lock was
		 * granted (a transaction is visible before it releases its locks).
		 */
		lock = key_lock_try(identity);
		facts.lock_granted = lock != KEY_LOCK_BUSY;
		key_store_lookup(&ref, LOOKUP_CALLER_SNAPSHOT, &stored);
		describe_row(&stored, request_hash, &facts.row);
		if (IsolationUsesXactSnapshot() && !(facts.row.found && !facts.row.expired))
			facts.row_changed_after_snapshot = row_changed_after_snapshot(&ref, &stored);
	}
	outcome = idem_core_decide_claim(&facts);

	/* A lock taken only to find a finished request is not kept. */
	if (lock == KEY_LOCK_TAKEN && outcome != IDEM_OUTCOME_CLAIMED)
		key_lock_release(identity);

	if (outcome == IDEM_OUTCOME_SERIALIZATION_FAILURE)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access: idempotency key was completed by a concurrent transaction"),
				 errdetail("The transaction's snapshot predates the key's stored response."),
				 errhint("Retry the transaction.")));

	if (outcome == IDEM_OUTCOME_CLAIMED)
	{
		claim.state = TXN_CLAIM_HELD;
		memcpy(claim.request_hash, request_hash, IDEM_SHA256_BYTES);
		claim.expires_at = expires_at;
		claim.replaces_expired_row = stored.found;
		txn_claims_record(identity, &claim);
	}
	stats_count(outcome_counter(outcome), 1);
	return claim_result(fcinfo, outcome, &stored, expires_at);
}
