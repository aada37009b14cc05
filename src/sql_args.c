/* sql_args.c: NULL and validity checks with the documented SQLSTATEs. */
#include "postgres.h"

#include "sql_args.h"

void
report_invalid_argument(const char *name, IdemStatus status)
{
	if (status == IDEM_ERR_CRYPTO || status == IDEM_ERR_INTERNAL)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("idempotency: %s", idem_core_status_message(status))));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("idempotency %s %s", name, idem_core_status_message(status))));
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

void
key_identity_from_args(text *scope, text *key, uint8 identity[IDEM_SHA256_BYTES])
{
	IdemStatus	status;

	status = idem_core_validate_key(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
	if (status != IDEM_OK)
		report_invalid_argument("key", status);
	status = idem_core_validate_scope(VARDATA_ANY(scope), VARSIZE_ANY_EXHDR(scope));
	if (status != IDEM_OK)
		report_invalid_argument("scope", status);
	status = idem_core_key_identity(VARDATA_ANY(scope), VARSIZE_ANY_EXHDR(scope),
									VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), identity);
	if (status != IDEM_OK)
		report_invalid_argument("key", status);
}
