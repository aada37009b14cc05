/*
 * lease.c: lease mode, for handlers whose side effects cannot roll back.
 *
 * idem_lease writes the key's row as a lease (lease_until, a fencing token) in
 * a transaction the caller commits at once, so no transaction stays open across
 * the external call. Until the lease runs out every other claim answers
 * in_progress; afterwards the next claim takes the key over with a new token and
 * gets the last recovery point back. Only the current token extends,
 * checkpoints, completes or releases: a stale holder gets ERROR 55000 and
 * writes nothing. The holder's calls wait for the key's lock, so they never
 * interleave with a claim deciding on the same row.
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "claim.h"
#include "guc.h"
#include "key_lifetime.h"
#include "lease.h"
#include "sql_args.h"

PG_FUNCTION_INFO_V1(idem_lease);
PG_FUNCTION_INFO_V1(idem_lease_extend);
PG_FUNCTION_INFO_V1(idem_checkpoint);
PG_FUNCTION_INFO_V1(idem_lease_release);

enum
{
	LEASE_ARG_KEY,
	LEASE_ARG_REQUEST_HASH,
	LEASE_ARG_LEASE,
	LEASE_ARG_TTL,
	LEASE_ARG_SCOPE,
	LEASE_ARG_WAIT
};

/* The holder's functions: idem_lease_extend, idem_checkpoint, idem_lease_release. */
enum
{
	EXTEND_ARG_KEY,
	EXTEND_ARG_TOKEN,
	EXTEND_ARG_LEASE,
	EXTEND_ARG_SCOPE
};

enum
{
	CHECKPOINT_ARG_KEY,
	CHECKPOINT_ARG_TOKEN,
	CHECKPOINT_ARG_RECOVERY_POINT,
	CHECKPOINT_ARG_RECOVERY_STATE,
	CHECKPOINT_ARG_SCOPE
};

enum
{
	LEASE_RELEASE_ARG_KEY,
	LEASE_RELEASE_ARG_TOKEN,
	LEASE_RELEASE_ARG_SCOPE
};

/* A recovery point names a step, as a key names a request: at most as long. */
#define MAX_RECOVERY_POINT_BYTES 255

/* idem_lease's result: idem_claim's columns (claim.h), then the lease's. */
enum
{
	COL_LEASE_TOKEN = CLAIM_COLUMNS,
	COL_LEASE_UNTIL,
	COL_RECOVERY_POINT,
	COL_RECOVERY_STATE,
	COL_FENCING_NUMBER,			/* 1.2; a 1.1 database's result type ends before it */
	COL_RESPONSE_CONTENT_TYPE,	/* 1.3, a replay's content type and body as bytes; a 1.2 one's ends before */
	COL_RESPONSE_BYTES,
	LEASE_RESULT_COLUMNS
};

/* The clock plus the lease argument; ERROR 22004 when NULL, 22023 unless within (0, 365 days]. */
static TimestampTz
lease_end(FunctionCallInfo fcinfo, int argno)
{
	arg_require_not_null(fcinfo, argno, "lease");
	return claim_span_end(GetCurrentTimestamp(), PG_GETARG_DATUM(argno), CLAIM_SPAN_LEASE);
}

/* lease_until + ttl (the argument, or idempotency.ttl); ERROR 22023 unless the ttl is positive. */
static TimestampTz
lease_expiry(FunctionCallInfo fcinfo, TimestampTz lease_until)
{
	TimestampTz from_now = claim_expiry(fcinfo, LEASE_ARG_TTL);

	/* claim_expiry counts from the transaction's start; count from the lease's end instead. */
	return lease_until + (from_now - GetCurrentTransactionStartTimestamp());
}

static pg_uuid_t
new_token(void)
{
	pg_uuid_t	token;

	if (!pg_strong_random(token.data, UUID_LEN))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("idempotency: could not generate a random lease token")));
	/* A version 4 UUID, as gen_random_uuid() makes. */
	token.data[6] = (token.data[6] & 0x0f) | 0x40;
	token.data[8] = (token.data[8] & 0x3f) | 0x80;
	return token;
}

static void
set_column(Datum *values, bool *nulls, int column, Datum value, bool isnull)
{
	values[column] = isnull ? (Datum) 0 : value;
	nulls[column] = isnull;
}

static Datum
lease_result(FunctionCallInfo fcinfo, IdemClaimOutcome outcome, const KeyRow *row,
			 TimestampTz expires_at, const LeaseGrant *grant)
{
	TupleDesc	desc;
	Datum		values[LEASE_RESULT_COLUMNS];
	bool		nulls[LEASE_RESULT_COLUMNS];
	pg_uuid_t  *token;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE || desc->natts > LEASE_RESULT_COLUMNS)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("function %s does not return the row type the idempotency library makes",
						format_procedure(fcinfo->flinfo->fn_oid)),
				 errdetail("The library makes a row of at most %d columns.", LEASE_RESULT_COLUMNS),
				 errhint("Run ALTER EXTENSION idempotency UPDATE, or undo the change to the function's result type.")));
	desc = BlessTupleDesc(desc);
	memset(nulls, true, sizeof(nulls));
	claim_outcome_columns(outcome, row, expires_at, values, nulls);
	/* 1.4, rule key-lifetime: the headers this answer carries, the stored ones and the key's expiry */
	values[CLAIM_COL_RESPONSE_HEADERS] = key_lifetime_headers(outcome, row, expires_at,
															  &nulls[CLAIM_COL_RESPONSE_HEADERS]);
	switch (outcome)
	{
		case IDEM_OUTCOME_CLAIMED:
			token = palloc(sizeof(pg_uuid_t));
			*token = grant->token;
			set_column(values, nulls, COL_LEASE_TOKEN, UUIDPGetDatum(token), false);
			set_column(values, nulls, COL_LEASE_UNTIL, TimestampTzGetDatum(grant->lease_until), false);
			/* A takeover resumes from the recovery point the last holder recorded. */
			set_column(values, nulls, COL_RECOVERY_POINT, row->recovery_point, row->recovery_point_null);
			set_column(values, nulls, COL_RECOVERY_STATE, row->recovery_state, row->recovery_state_null);
			set_column(values, nulls, COL_FENCING_NUMBER, Int64GetDatum(grant->fencing_number),
					   grant->fencing_number == 0);
			break;
		case IDEM_OUTCOME_IN_PROGRESS:
			/* The lease's end, for Retry-After; NULL when a transaction holds the key. */
			set_column(values, nulls, COL_LEASE_UNTIL, TimestampTzGetDatum(row->lease_until),
					   !(row->found && row->leased));
			break;
		case IDEM_OUTCOME_REPLAY:
			/* As idem_claim_request replays: the bytes stored, or a jsonb body's text; not for a 1.2 type. */
			if (desc->natts <= COL_RESPONSE_BYTES)
				break;
			set_column(values, nulls, COL_RESPONSE_CONTENT_TYPE, row->content_type, row->content_type_null);
			values[COL_RESPONSE_BYTES] = claim_replay_bytes(row, &nulls[COL_RESPONSE_BYTES]);
			break;
		default:
			/* mismatch: idem_claim's columns only */
			break;
	}
	Assert(desc->natts <= LEASE_RESULT_COLUMNS);
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

/* idem_lease(key, request_hash, lease, ttl, scope, wait) */
Datum
idem_lease(PG_FUNCTION_ARGS)
{
	KeyRef		ref;
	uint8		identity[IDEM_SHA256_BYTES];
	LeaseGrant	grant;
	ClaimAttempt attempt;
	TimestampTz wait_until;
	LeaseTake	how;

	ref.extension_function = fcinfo->flinfo->fn_oid;
	ref.key = arg_text_required(fcinfo, LEASE_ARG_KEY, "key");
	ref.scope = arg_text_required(fcinfo, LEASE_ARG_SCOPE, "scope");
	key_identity_from_args(ref.scope, ref.key, identity);
	claim_parse_request_hash(arg_text_required(fcinfo, LEASE_ARG_REQUEST_HASH, "request_hash"),
							 grant.request_hash);
	/* Every argument is checked before anything is done; the lease itself is timed after any wait. */
	(void) lease_expiry(fcinfo, lease_end(fcinfo, LEASE_ARG_LEASE));
	wait_until = claim_wait_deadline(fcinfo, LEASE_ARG_WAIT);
	PreventCommandIfReadOnly("idem_lease()");
	PreventCommandDuringRecovery("idem_lease()");
	grant.fencing_number = 0;

	claim_attempt(&ref, identity, grant.request_hash, wait_until, &attempt);
	if (attempt.outcome == IDEM_OUTCOME_CLAIMED)
	{
		/* A lease runs its full length from the grant, however long the claim waited for the key. */
		grant.lease_until = lease_end(fcinfo, LEASE_ARG_LEASE);
		/*
		 * The key outlives its lease by the ttl, so a lease that runs out can still
		 * be taken over with its recovery point (expiry counted from the claim would
		 * let a long lease end with the key, and its recovery point with it).
		 */
		grant.expires_at = lease_expiry(fcinfo, grant.lease_until);
		grant.token = new_token();
		if (!attempt.row.found)
			how = LEASE_NEW_ROW;
		else if (attempt.row.leased &&
				 attempt.row.expires_at > GetCurrentTransactionStartTimestamp())
			how = LEASE_TAKE_OVER;
		else
			how = LEASE_REPLACE_ROW;
		/* The key's lock stays until this transaction ends, so the row appears whole. */
		key_store_take_lease(&ref, how, &grant);
		stats_count(IDEM_COUNT_LEASES, 1);
		if (how == LEASE_TAKE_OVER)
			stats_count(IDEM_COUNT_LEASE_TAKEOVERS, 1);
		if (how != LEASE_TAKE_OVER)
			attempt.row.recovery_point_null = attempt.row.recovery_state_null = true;
	}
	/* A takeover keeps the later of the two expiries: grant.expires_at is what was stored. */
	return lease_result(fcinfo, attempt.outcome, &attempt.row, grant.expires_at, &grant);
}

void
lease_holder_args(FunctionCallInfo fcinfo, int key_argno, int token_argno, int scope_argno,
				  LeaseHolder *holder)
{
	uint8		identity[IDEM_SHA256_BYTES];

	holder->ref.extension_function = fcinfo->flinfo->fn_oid;
	holder->ref.key = arg_text_required(fcinfo, key_argno, "key");
	arg_require_not_null(fcinfo, token_argno, "lease_token");
	holder->token = *PG_GETARG_UUID_P(token_argno);
	holder->ref.scope = arg_text_required(fcinfo, scope_argno, "scope");
	key_identity_from_args(holder->ref.scope, holder->ref.key, identity);
	memcpy(holder->identity, identity, IDEM_SHA256_BYTES);
}

TimestampTz
lease_holder_change(LeaseHolder *holder, LeaseChange change, const LeaseChangeValues *values,
					const char *caller)
{
	TimestampTz lease_until;

	PreventCommandIfReadOnly(caller);
	PreventCommandDuringRecovery(caller);
	/* Waits out a claim that is reading the row right now (it holds the lock for microseconds). */
	key_lock_wait(holder->identity);
	if (!key_store_change_lease(&holder->ref, &holder->token, change, values, &lease_until))
	{
		stats_count(IDEM_COUNT_STALE_TOKENS, 1);
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s: idempotency lease token is not the current one for key \"%s\"",
						caller, text_to_cstring(holder->ref.key)),
				 errdetail("The lease was taken over after it ran out, or was completed or released."),
				 errhint("Stop working on this request: another attempt owns it now.")));
	}
	return lease_until;
}

/* idem_lease_extend(key, lease_token, lease, scope) */
Datum
idem_lease_extend(PG_FUNCTION_ARGS)
{
	LeaseHolder holder;
	LeaseChangeValues values;

	lease_holder_args(fcinfo, EXTEND_ARG_KEY, EXTEND_ARG_TOKEN, EXTEND_ARG_SCOPE, &holder);
	memset(&values, 0, sizeof(values));
	values.until = lease_end(fcinfo, EXTEND_ARG_LEASE);
	PG_RETURN_TIMESTAMPTZ(lease_holder_change(&holder, LEASE_EXTEND, &values, "idem_lease_extend"));
}

/* idem_checkpoint(key, lease_token, recovery_point, recovery_state, scope) */
Datum
idem_checkpoint(PG_FUNCTION_ARGS)
{
	LeaseHolder holder;
	LeaseChangeValues values;

	lease_holder_args(fcinfo, CHECKPOINT_ARG_KEY, CHECKPOINT_ARG_TOKEN, CHECKPOINT_ARG_SCOPE, &holder);
	memset(&values, 0, sizeof(values));
	values.recovery_point = PointerGetDatum(arg_text_required(fcinfo, CHECKPOINT_ARG_RECOVERY_POINT,
															  "recovery_point"));
	if (VARSIZE_ANY_EXHDR(DatumGetPointer(values.recovery_point)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency recovery_point must not be empty")));
	if (VARSIZE_ANY_EXHDR(DatumGetPointer(values.recovery_point)) > MAX_RECOVERY_POINT_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("idempotency recovery_point is longer than %d bytes", MAX_RECOVERY_POINT_BYTES)));
	values.recovery_state_null = PG_ARGISNULL(CHECKPOINT_ARG_RECOVERY_STATE);
	values.recovery_state = values.recovery_state_null ? (Datum) 0
		: PG_GETARG_DATUM(CHECKPOINT_ARG_RECOVERY_STATE);
	/* The state is kept like a response body, under the same limit. */
	if (!values.recovery_state_null &&
		toast_raw_datum_size(values.recovery_state) > (Size) idem_max_response_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("idempotency recovery_state of %zu bytes exceeds idempotency.max_response_bytes (%d)",
						toast_raw_datum_size(values.recovery_state), idem_max_response_bytes)));
	lease_holder_change(&holder, LEASE_CHECKPOINT, &values, "idem_checkpoint");
	stats_count(IDEM_COUNT_CHECKPOINTS, 1);
	PG_RETURN_VOID();
}

/* idem_lease_release(key, lease_token, scope) */
Datum
idem_lease_release(PG_FUNCTION_ARGS)
{
	LeaseHolder holder;
	LeaseChangeValues values;

	lease_holder_args(fcinfo, LEASE_RELEASE_ARG_KEY, LEASE_RELEASE_ARG_TOKEN, LEASE_RELEASE_ARG_SCOPE, &holder);
	memset(&values, 0, sizeof(values));
	values.until = GetCurrentTimestamp();
	lease_holder_change(&holder, LEASE_RELEASE, &values, "idem_lease_release");
	stats_count(IDEM_COUNT_RELEASES, 1);
	PG_RETURN_BOOL(true);
}
