/* sql_args.c: NULL and validity checks with the documented SQLSTATEs. */
#include "postgres.h"

#include "sql_args.h"
#include "pg_compat.h"

#define REJECT(message) \
	ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg(message)))

void
report_invalid_argument(IdemArgument argument, IdemStatus status)
{
	switch (argument)
	{
		case IDEM_ARG_KEY:
			if (status == IDEM_ERR_EMPTY)
				REJECT("idempotency key must not be empty");
			if (status == IDEM_ERR_TOO_LONG)
				REJECT("idempotency key is longer than 255 bytes");
			if (status == IDEM_ERR_CONTROL_CHAR)
				REJECT("idempotency key contains a control character");
			break;
		case IDEM_ARG_SCOPE:
			if (status == IDEM_ERR_TOO_LONG)
				REJECT("idempotency scope is longer than 255 bytes");
			if (status == IDEM_ERR_CONTROL_CHAR)
				REJECT("idempotency scope contains a control character");
			break;
		case IDEM_ARG_REQUEST_HASH:
			if (status == IDEM_ERR_HEX_LENGTH)
				REJECT("idempotency request_hash must be 64 hexadecimal digits");
			if (status == IDEM_ERR_HEX_DIGIT)
				REJECT("idempotency request_hash contains a character that is not a hexadecimal digit");
			break;
		case IDEM_ARG_HTTP_STATUS:
			if (status == IDEM_ERR_STATUS_RANGE)
				REJECT("idempotency http_status must be between 100 and 599");
			break;
	}
	report_core_failure(status);
}

void
report_core_failure(IdemStatus status)
{
	if (status == IDEM_ERR_CRYPTO)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("idempotency: OpenSSL could not compute SHA-256")));
	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("idempotency: internal error in the idempotency core (status %d)", (int) status)));
}

void
arg_require_not_null(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("idempotency %s must not be NULL", name)));
}

text *
arg_text_required(FunctionCallInfo fcinfo, int argno, const char *name)
{
	arg_require_not_null(fcinfo, argno, name);
	return PG_GETARG_TEXT_PP(argno);
}

/*
 * The last valid (scope, key) and its identity: idem_complete names the key
 * idem_claim just hashed, and a byte comparison is cheaper than validating and
 * hashing again. Only valid inputs are remembered.
 */
static struct
{
	bool		valid;
	uint32		scope_len;
	uint32		key_len;
	char		bytes[IDEM_MAX_SCOPE_BYTES + IDEM_MAX_KEY_BYTES];
	uint8		identity[IDEM_SHA256_BYTES];
} last_identity;

static bool
remembered_identity(const char *scope, uint32 scope_len, const char *key, uint32 key_len,
					uint8 identity[IDEM_SHA256_BYTES])
{
	if (!last_identity.valid || last_identity.scope_len != scope_len ||
		last_identity.key_len != key_len ||
		memcmp(last_identity.bytes, key, key_len) != 0 ||
		memcmp(last_identity.bytes + key_len, scope, scope_len) != 0)
		return false;
	memcpy(identity, last_identity.identity, IDEM_SHA256_BYTES);
	return true;
}

void
key_identity_from_args(text *scope, text *key, uint8 identity[IDEM_SHA256_BYTES])
{
	const char *scope_bytes = VARDATA_ANY(scope);
	const char *key_bytes = VARDATA_ANY(key);
	uint32		scope_len = VARSIZE_ANY_EXHDR(scope);
	uint32		key_len = VARSIZE_ANY_EXHDR(key);
	IdemStatus	status;

	if (remembered_identity(scope_bytes, scope_len, key_bytes, key_len, identity))
		return;
	status = idem_core_validate_key(key_bytes, key_len);
	if (status != IDEM_OK)
		report_invalid_argument(IDEM_ARG_KEY, status);
	status = idem_core_validate_scope(scope_bytes, scope_len);
	if (status != IDEM_OK)
		report_invalid_argument(IDEM_ARG_SCOPE, status);
	status = idem_core_key_identity(scope_bytes, scope_len, key_bytes, key_len, identity);
	if (status != IDEM_OK)
		report_invalid_argument(IDEM_ARG_KEY, status);

	/* Valid, so both fit: at most IDEM_MAX_KEY_BYTES and IDEM_MAX_SCOPE_BYTES. */
	memcpy(last_identity.bytes, key_bytes, key_len);
	memcpy(last_identity.bytes + key_len, scope_bytes, scope_len);
	last_identity.key_len = key_len;
	last_identity.scope_len = scope_len;
	memcpy(last_identity.identity, identity, IDEM_SHA256_BYTES);
	last_identity.valid = true;
}
