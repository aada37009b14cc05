/* sql_args.h: argument checks shared by the SQL-callable functions. */
#ifndef IDEM_SQL_ARGS_H
#define IDEM_SQL_ARGS_H

#include "fmgr.h"

#include "idem_core.h"
#include "pg_compat.h"

/* The argument as text; ERROR 22004 when it is NULL. */
text	   *arg_text_required(FunctionCallInfo fcinfo, int argno, const char *name);

/* ERROR 22004 when the argument is NULL. */
void		arg_require_not_null(FunctionCallInfo fcinfo, int argno, const char *name);

/* Validates key and scope and derives the key's identity; ERROR 22023 when invalid. */
void		key_identity_from_args(text *scope, text *key, uint8 identity[IDEM_SHA256_BYTES]);

/* The arguments the core validates. */
typedef enum IdemArgument
{
	IDEM_ARG_KEY,
	IDEM_ARG_SCOPE,
	IDEM_ARG_REQUEST_HASH,
	IDEM_ARG_HTTP_STATUS
} IdemArgument;

/* ERROR 22023 saying what is wrong with the argument (XX000 for a failure of the core itself). */
idem_noreturn void report_invalid_argument(IdemArgument argument, IdemStatus status);

/* ERROR XX000: the core failed (OpenSSL, or a bug), whatever the input. */
idem_noreturn void report_core_failure(IdemStatus status);

#endif
