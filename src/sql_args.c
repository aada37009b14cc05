/* sql_args.c: NULL and validity checks with the documented SQLSTATEs. */
#include "postgres.h"

#include "mb/pg_wchar.h"

#include "sql_args.h"
#include "pg_compat.h"

/* The names the messages give the arguments, as the SQL functions name them. */
static const char *const argument_names[] = {
	[IDEM_ARG_KEY] = "key",
	[IDEM_ARG_SCOPE] = "scope",
	[IDEM_ARG_REQUEST_HASH] = "request_hash",
	[IDEM_ARG_HTTP_STATUS] = "http_status"
};

/* Whether the core's status says what is wrong with that argument. */
static bool
rejects_argument(IdemArgument argument, IdemStatus status)
{
	switch (argument)
	{
		case IDEM_ARG_KEY:
			return status == IDEM_ERR_EMPTY || status == IDEM_ERR_TOO_LONG ||
				status == IDEM_ERR_CONTROL_CHAR;
		case IDEM_ARG_SCOPE:
			return status == IDEM_ERR_TOO_LONG || status == IDEM_ERR_CONTROL_CHAR;
		case IDEM_ARG_REQUEST_HASH:
			return status == IDEM_ERR_HEX_LENGTH || status == IDEM_ERR_HEX_DIGIT;
		case IDEM_ARG_HTTP_STATUS:
			return status == IDEM_ERR_STATUS_RANGE;
	}
	return false;
}

/*
 * One whole message per status (the core's idem_core_status_message says the same in its own words, for its
 * own tests), so each can be translated.
 */
void
report_invalid_argument(IdemArgument argument, IdemStatus status)
{
	const char *name = argument_names[argument];

	if (rejects_argument(argument, status))
	{
		switch (status)
		{
			case IDEM_ERR_EMPTY:
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("idempotency %s must not be empty", name)));
				break;
			case IDEM_ERR_TOO_LONG:
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("idempotency %s is longer than %d bytes", name,
								argument == IDEM_ARG_SCOPE ? IDEM_MAX_SCOPE_BYTES : IDEM_MAX_KEY_BYTES)));
				break;
			case IDEM_ERR_CONTROL_CHAR:
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("idempotency %s contains a control character", name)));
				break;
			case IDEM_ERR_HEX_LENGTH:
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("idempotency %s must be 64 hexadecimal digits", name)));
				break;
			case IDEM_ERR_HEX_DIGIT:
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("idempotency %s contains a character that is not a hexadecimal digit", name)));
				break;
			case IDEM_ERR_STATUS_RANGE:
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("idempotency %s must be between 100 and 599", name)));
				break;
			default:
				break;
		}
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

static IdemStatus
controls_in_utf8(const char *text, uint32 len)
{
	char	   *utf8 = pg_server_to_any(text, len, PG_UTF8);
	/* The input itself comes back when no conversion was needed; it has no terminator. */
	IdemStatus	status = idem_core_check_controls(utf8, utf8 == text ? len : strlen(utf8));

	if (utf8 != text)
		pfree(utf8);
	return status;
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
	/*
	 * The core reads C1 controls as UTF-8 (C2 80..C2 9F); in another server
	 * encoding they are other bytes (LATIN1: 80..9F), so the character rule is
	 * applied again to the text converted to UTF-8. SQL_ASCII has no characters
	 * above 7F to convert: its bytes are checked as they are.
	 */
	if (GetDatabaseEncoding() != PG_UTF8 && GetDatabaseEncoding() != PG_SQL_ASCII)
	{
		status = controls_in_utf8(key_bytes, key_len);
		if (status != IDEM_OK)
			report_invalid_argument(IDEM_ARG_KEY, status);
		status = controls_in_utf8(scope_bytes, scope_len);
		if (status != IDEM_OK)
			report_invalid_argument(IDEM_ARG_SCOPE, status);
	}
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
