/*
 * complete.c: idem_complete, idem_release and idem_lease_complete, the end of a claimed request, and their
 * bytes forms of 1.3, idem_complete_request and idem_lease_complete_request.
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/xact.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "guc.h"
#include "key_store.h"
#include "lease.h"
#include "sql_args.h"
#include "stats.h"
#include "txn_claims.h"

PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_lease_complete);

enum
{
	COMPLETE_ARG_KEY,
	COMPLETE_ARG_HTTP_STATUS,
	COMPLETE_ARG_RESPONSE_BODY,
	COMPLETE_ARG_RESPONSE_HEADERS,
	COMPLETE_ARG_SCOPE
};

enum
{
	LEASE_COMPLETE_ARG_KEY,
	LEASE_COMPLETE_ARG_TOKEN,
	LEASE_COMPLETE_ARG_HTTP_STATUS,
	LEASE_COMPLETE_ARG_RESPONSE_BODY,
	LEASE_COMPLETE_ARG_RESPONSE_HEADERS,
	LEASE_COMPLETE_ARG_SCOPE
};

enum
{
	RELEASE_ARG_KEY,
	RELEASE_ARG_SCOPE
};

/* The claim this transaction holds on the key; ERROR 55000 when it holds none. */
static TxnClaim
held_claim(const uint8 identity[IDEM_SHA256_BYTES], text *key, const char *caller)
{
	const TxnClaim *claim = txn_claims_find(identity);

	if (claim == NULL || claim->state != TXN_CLAIM_HELD)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s: idempotency key \"%s\" is not claimed by this transaction",
						caller, text_to_cstring(key)),
				 errhint("Call idem_claim in the same transaction first and act only on outcome 'claimed'.")));
	return *claim;
}

static uint64
stored_size(FunctionCallInfo fcinfo, int argno)
{
	return PG_ARGISNULL(argno) ? 0 : toast_raw_datum_size(PG_GETARG_DATUM(argno));
}

/*
 * What to do with a response of this status and size: store or release (5xx); ERROR 22023 for a status
 * outside 100..599, 54000 past idempotency.max_response_bytes.
 */
static IdemCompletion
completion_decision(int32 http_status, uint64 response_bytes)
{
	IdemCompletion decision = idem_core_decide_completion(http_status, response_bytes,
														  (uint64) idem_max_response_bytes);

	if (decision == IDEM_COMPLETION_BAD_STATUS)
		report_invalid_argument(IDEM_ARG_HTTP_STATUS, IDEM_ERR_STATUS_RANGE);
	if (decision == IDEM_COMPLETION_TOO_LARGE)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("idempotency response of %llu bytes exceeds idempotency.max_response_bytes (%d)",
						(unsigned long long) response_bytes, idem_max_response_bytes)));
	return decision;
}

/*
 * The end of a transactional completion: the key this transaction claimed is released (5xx: false) or its
 * row, deferred by the claim, is written with the response (true). caller names the SQL function in errors,
 * command in the read-only one.
 */
static bool
complete_held_claim(KeyRef *ref, const uint8 identity[IDEM_SHA256_BYTES], KeyWrite *row,
					IdemCompletion decision, const char *caller, const char *command)
{
	TxnClaim	claim = held_claim(identity, ref->key, caller);

	if (decision == IDEM_COMPLETION_RELEASE)
	{
		claim.state = TXN_CLAIM_RELEASED;
		txn_claims_record(identity, &claim);
		stats_count(IDEM_COUNT_RELEASED_5XX, 1);
		return false;
	}
	PreventCommandIfReadOnly(command);
	/* The row the claim deferred: its request hash and expiry, and the response. */
	memcpy(row->request_hash, claim.request_hash, IDEM_SHA256_BYTES);
	row->expires_at = claim.expires_at;
	row->replaces_expired_row = claim.replaces_expired_row;
	key_store_write(ref, row);
	claim.state = TXN_CLAIM_COMPLETED;
	txn_claims_record(identity, &claim);
	stats_count(IDEM_COUNT_COMPLETIONS_STORED, 1);
	return true;
}

/*
 * The stored headers (argument names them in errors) must be a JSON object. 1.4: a client writes stored headers
 * back as they are on a replay, so each member must be a header it can send: its name an RFC 9110 token, and
 * every string in its value (the value, or a string within an array or object value) without CR, LF or another
 * control but HTAB (RFC 9110 field-value). ERROR 22023 otherwise, on the first bad member in jsonb's order.
 */
static void
check_stored_headers(Datum headers_datum, const char *argument)
{
	Jsonb	   *headers = DatumGetJsonbP(headers_datum);
	JsonbIterator *it;
	JsonbIteratorToken token;
	JsonbValue	v;
	int			depth = 0;
	const char *name = NULL;
	int			name_len = 0;

	if (!JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency %s must be a JSON object", argument)));
	it = JsonbIteratorInit(&headers->root);
	while ((token = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		IdemStatus	status;

		if (token == WJB_BEGIN_OBJECT || token == WJB_BEGIN_ARRAY)
			depth++;
		else if (token == WJB_END_OBJECT || token == WJB_END_ARRAY)
			depth--;
		else if (token == WJB_KEY && depth == 1)
		{
			status = idem_core_check_header_name(v.val.string.val, (size_t) v.val.string.len);
			if (status != IDEM_OK)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("idempotency %s: a header name %s", argument,
								idem_core_status_message(status))));
			name = v.val.string.val;
			name_len = v.val.string.len;
		}
		else if ((token == WJB_VALUE || token == WJB_ELEM) && v.type == jbvString)
		{
			status = idem_core_check_header_value(v.val.string.val, (size_t) v.val.string.len);
			if (status != IDEM_OK)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("idempotency %s: the value of header \"%.*s\" %s", argument, name_len, name,
								idem_core_status_message(status))));
		}
	}
}

/*
 * The response from the arguments, checked, and what to do with it: store, or
 * release (5xx). ERROR 22004 / 22023 / 54000 on bad input.
 */
static IdemCompletion
response_from_args(FunctionCallInfo fcinfo, int status_argno, int body_argno, int headers_argno,
				   ResponseToStore *response)
{
	uint64		response_bytes;

	arg_require_not_null(fcinfo, status_argno, "http_status");
	response->http_status = PG_GETARG_INT32(status_argno);
	response_bytes = stored_size(fcinfo, body_argno) + stored_size(fcinfo, headers_argno);
	response->body_null = PG_ARGISNULL(body_argno);
	response->body = response->body_null ? (Datum) 0 : PG_GETARG_DATUM(body_argno);
	response->headers_null = PG_ARGISNULL(headers_argno);
	response->headers = response->headers_null ? (Datum) 0 : PG_GETARG_DATUM(headers_argno);
	response->content_type_null = response->bytes_null = true;
	response->content_type = response->bytes = (Datum) 0;
	if (!response->headers_null)
		check_stored_headers(response->headers, "response_headers");

	return completion_decision(response->http_status, response_bytes);
}

Datum
idem_complete(PG_FUNCTION_ARGS)
{
	KeyRef		ref;
	uint8		identity[IDEM_SHA256_BYTES];
	KeyWrite	row;
	IdemCompletion decision;

	ref.extension_function = fcinfo->flinfo->fn_oid;
	ref.key = arg_text_required(fcinfo, COMPLETE_ARG_KEY, "key");
	ref.scope = arg_text_required(fcinfo, COMPLETE_ARG_SCOPE, "scope");
	key_identity_from_args(ref.scope, ref.key, identity);
	decision = response_from_args(fcinfo, COMPLETE_ARG_HTTP_STATUS, COMPLETE_ARG_RESPONSE_BODY,
								  COMPLETE_ARG_RESPONSE_HEADERS, &row.response);
	PG_RETURN_BOOL(complete_held_claim(&ref, identity, &row, decision, "idem_complete", "idem_complete()"));
}

/*
 * The end of a lease by its holder's completion: the response stored (true), or for a 5xx the lease ended now
 * with its recovery point kept (false). ERROR 55000 when the token is not the key's current one.
 */
static bool
lease_complete(LeaseHolder *holder, IdemCompletion decision, LeaseChangeValues *values, const char *caller)
{
	if (decision == IDEM_COMPLETION_RELEASE)
	{
		values->until = GetCurrentTimestamp();
		lease_holder_change(holder, LEASE_RELEASE, values, caller);
		stats_count(IDEM_COUNT_RELEASED_5XX, 1);
		return false;
	}
	lease_holder_change(holder, LEASE_COMPLETE, values, caller);
	stats_count(IDEM_COUNT_COMPLETIONS_STORED, 1);
	return true;
}

/*
 * idem_lease_complete(key, lease_token, http_status, response_body, response_headers, scope):
 * the lease's holder stores the response, which then replays exactly as in 1.0;
 * a 5xx is never stored: the lease ends now and its recovery point stays.
 */
Datum
idem_lease_complete(PG_FUNCTION_ARGS)
{
	LeaseHolder holder;
	LeaseChangeValues values;
	IdemCompletion decision;

	lease_holder_args(fcinfo, LEASE_COMPLETE_ARG_KEY, LEASE_COMPLETE_ARG_TOKEN, LEASE_COMPLETE_ARG_SCOPE,
					  &holder);
	memset(&values, 0, sizeof(values));
	decision = response_from_args(fcinfo, LEASE_COMPLETE_ARG_HTTP_STATUS, LEASE_COMPLETE_ARG_RESPONSE_BODY,
								  LEASE_COMPLETE_ARG_RESPONSE_HEADERS, &values.response);
	PG_RETURN_BOOL(lease_complete(&holder, decision, &values, "idem_lease_complete"));
}

Datum
idem_release(PG_FUNCTION_ARGS)
{
	text	   *key = arg_text_required(fcinfo, RELEASE_ARG_KEY, "key");
	text	   *scope = arg_text_required(fcinfo, RELEASE_ARG_SCOPE, "scope");
	uint8		identity[IDEM_SHA256_BYTES];
	TxnClaim	claim;

	key_identity_from_args(scope, key, identity);
	claim = held_claim(identity, key, "idem_release");
	claim.state = TXN_CLAIM_RELEASED;
	txn_claims_record(identity, &claim);
	stats_count(IDEM_COUNT_RELEASES, 1);
	PG_RETURN_BOOL(true);
}

/*
 * idem_complete_request(key, scope, http_status, content_type, headers, body bytea) (1.3, issue 30): stores
 * the response of the key this transaction claimed as the bytes sent, with its content type, parsing nothing
 * but the headers' jsonb; a 5xx releases the key and returns false, as idem_complete.
 */
PG_FUNCTION_INFO_V1(idem_complete_request);

enum
{
	COMPLETE_REQUEST_ARG_KEY,
	COMPLETE_REQUEST_ARG_SCOPE,
	COMPLETE_REQUEST_ARG_HTTP_STATUS,
	COMPLETE_REQUEST_ARG_CONTENT_TYPE,
	COMPLETE_REQUEST_ARG_HEADERS,
	COMPLETE_REQUEST_ARG_BODY
};

/* Where a bytes completion has its response's arguments. */
typedef struct BytesResponseArgs
{
	int			http_status;
	int			content_type;
	int			headers;
	int			body;
} BytesResponseArgs;

/*
 * The response as the bytes sent, with its content type, checked, and what to do with it: store, or release
 * (5xx). Nothing is parsed but the headers' jsonb. ERROR 22004 / 22023 / 54000 on bad input.
 */
static IdemCompletion
bytes_response_from_args(FunctionCallInfo fcinfo, const BytesResponseArgs *args, ResponseToStore *response)
{
	uint64		response_bytes;

	arg_require_not_null(fcinfo, args->http_status, "http_status");
	response->http_status = PG_GETARG_INT32(args->http_status);
	response->body_null = true;
	response->body = (Datum) 0;
	response->headers_null = PG_ARGISNULL(args->headers);
	response->headers = response->headers_null ? (Datum) 0 : PG_GETARG_DATUM(args->headers);
	response->content_type_null = PG_ARGISNULL(args->content_type);
	response->content_type = response->content_type_null ? (Datum) 0
		: PointerGetDatum(PG_GETARG_TEXT_PP(args->content_type));
	response->bytes_null = PG_ARGISNULL(args->body);
	response->bytes = response->bytes_null ? (Datum) 0 : PG_GETARG_DATUM(args->body);
	if (!response->headers_null)
		check_stored_headers(response->headers, "headers");
	if (!response->content_type_null)
	{
		text	   *type = DatumGetTextPP(response->content_type);
		const char *p = VARDATA_ANY(type);

		/* Replayed as a header value: no CR, LF or other control character (a tab is allowed). */
		for (size_t i = 0; i < VARSIZE_ANY_EXHDR(type); i++)
			if (((unsigned char) p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7f)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("idempotency content_type contains a control character")));
	}
	response_bytes = stored_size(fcinfo, args->body) + stored_size(fcinfo, args->headers) +
		stored_size(fcinfo, args->content_type);
	return completion_decision(response->http_status, response_bytes);
}

static const BytesResponseArgs complete_request_response = {
	.http_status = COMPLETE_REQUEST_ARG_HTTP_STATUS, .content_type = COMPLETE_REQUEST_ARG_CONTENT_TYPE,
	.headers = COMPLETE_REQUEST_ARG_HEADERS, .body = COMPLETE_REQUEST_ARG_BODY
};

Datum
idem_complete_request(PG_FUNCTION_ARGS)
{
	KeyRef		ref;
	uint8		identity[IDEM_SHA256_BYTES];
	KeyWrite	row;
	IdemCompletion decision;

	ref.extension_function = fcinfo->flinfo->fn_oid;
	ref.key = arg_text_required(fcinfo, COMPLETE_REQUEST_ARG_KEY, "key");
	ref.scope = arg_text_required(fcinfo, COMPLETE_REQUEST_ARG_SCOPE, "scope");
	arg_require_not_null(fcinfo, COMPLETE_REQUEST_ARG_HTTP_STATUS, "http_status");
	key_identity_from_args(ref.scope, ref.key, identity);
	decision = bytes_response_from_args(fcinfo, &complete_request_response, &row.response);
	PG_RETURN_BOOL(complete_held_claim(&ref, identity, &row, decision, "idem_complete_request",
									   "idem_complete_request()"));
}

/*
 * idem_lease_complete_request(key, scope, lease_token, http_status, content_type, headers, body bytea) (1.3):
 * idem_lease_complete with the response as the bytes sent and its content type, as idem_complete_request
 * stores it; a 5xx is never stored: the lease ends now, its recovery point stays, and it returns false.
 */
PG_FUNCTION_INFO_V1(idem_lease_complete_request);

enum
{
	LEASE_COMPLETE_REQUEST_ARG_KEY,
	LEASE_COMPLETE_REQUEST_ARG_SCOPE,
	LEASE_COMPLETE_REQUEST_ARG_TOKEN,
	LEASE_COMPLETE_REQUEST_ARG_HTTP_STATUS,
	LEASE_COMPLETE_REQUEST_ARG_CONTENT_TYPE,
	LEASE_COMPLETE_REQUEST_ARG_HEADERS,
	LEASE_COMPLETE_REQUEST_ARG_BODY
};

static const BytesResponseArgs lease_complete_request_response = {
	.http_status = LEASE_COMPLETE_REQUEST_ARG_HTTP_STATUS, .content_type = LEASE_COMPLETE_REQUEST_ARG_CONTENT_TYPE,
	.headers = LEASE_COMPLETE_REQUEST_ARG_HEADERS, .body = LEASE_COMPLETE_REQUEST_ARG_BODY
};

Datum
idem_lease_complete_request(PG_FUNCTION_ARGS)
{
	LeaseHolder holder;
	LeaseChangeValues values;

	lease_holder_args(fcinfo, LEASE_COMPLETE_REQUEST_ARG_KEY, LEASE_COMPLETE_REQUEST_ARG_TOKEN,
					  LEASE_COMPLETE_REQUEST_ARG_SCOPE, &holder);
	memset(&values, 0, sizeof(values));
	PG_RETURN_BOOL(lease_complete(&holder, bytes_response_from_args(fcinfo, &lease_complete_request_response,
																	&values.response),
								  &values, "idem_lease_complete_request"));
}
