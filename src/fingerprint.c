/*
 * fingerprint.c: idem_fingerprint(method, path, query, content_type, body), the request fingerprint of 1.3
 * (issue 30), computed in one C call: the C++ core canonicalises the parts straight into SHA-256 (no jsonb is
 * built), and hands a body it does not canonicalise itself back to PostgreSQL's jsonb, which gives the same
 * text or the error body::jsonb gives.
 */
#include "postgres.h"

#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"

#include "fingerprint.h"
#include "sql_args.h"
#include "pg_compat.h"

PG_FUNCTION_INFO_V1(idem_fingerprint);

/* idem_fingerprint(method, path, query, content_type, body) */
enum
{
	FP_ARG_METHOD,
	FP_ARG_PATH,
	FP_ARG_QUERY,
	FP_ARG_CONTENT_TYPE,
	FP_ARG_BODY
};

static const RequestArgs fingerprint_args = {
	.method = FP_ARG_METHOD, .path = FP_ARG_PATH, .query = FP_ARG_QUERY,
	.content_type = FP_ARG_CONTENT_TYPE, .body = FP_ARG_BODY
};

static void
set_part(FunctionCallInfo fcinfo, int argno, const char **data, size_t *len)
{
	struct varlena *value;

	*data = NULL;
	*len = 0;
	if (PG_ARGISNULL(argno))
		return;
	value = PG_DETOAST_DATUM_PACKED(PG_GETARG_DATUM(argno));
	*data = VARDATA_ANY(value);
	*len = VARSIZE_ANY_EXHDR(value);
}

/* body::jsonb's text, as PostgreSQL reads and prints it; its error when the body is not JSON. */
static char *
body_as_jsonb_text(const char *body, size_t len)
{
	char	   *server = pg_any_to_server(body, (int) len, PG_UTF8);	/* 22021 when not UTF-8 */
	Jsonb	   *parsed;

	/* pg_any_to_server verified the bytes (no NUL among them) and may hand back the input itself. */
	if (server == body)
		server = pnstrdup(body, len);
	parsed = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(server)));
	return JsonbToCString(NULL, &parsed->root, VARSIZE(parsed));
}

void
request_fingerprint(FunctionCallInfo fcinfo, const RequestArgs *args, uint8 out[IDEM_SHA256_BYTES])
{
	IdemRequest request;
	IdemStatus	status;

	arg_require_not_null(fcinfo, args->method, "method");
	arg_require_not_null(fcinfo, args->path, "path");
	set_part(fcinfo, args->method, &request.method, &request.method_len);
	set_part(fcinfo, args->path, &request.path, &request.path_len);
	set_part(fcinfo, args->query, &request.query, &request.query_len);
	set_part(fcinfo, args->content_type, &request.content_type, &request.content_type_len);
	set_part(fcinfo, args->body, &request.body, &request.body_len);
	if (request.body == NULL)
		request.body = "";		/* a NULL body is an empty one */

	/* The core reads JSON as UTF-8 and writes it so: only a UTF-8 database's jsonb prints the same bytes. */
	if (GetDatabaseEncoding() == PG_UTF8 || !idem_core_fingerprint_is_json(&request))
	{
		status = idem_core_fingerprint(&request, out);
		if (status == IDEM_OK)
			return;
		if (status != IDEM_ERR_NOT_CANONICAL)
			report_core_failure(status);
	}
	{
		char	   *canonical = body_as_jsonb_text(request.body, request.body_len);

		status = idem_core_fingerprint_json_body(&request, canonical, strlen(canonical), out);
		if (status != IDEM_OK)
			report_core_failure(status);
	}
}

Datum
idem_fingerprint(PG_FUNCTION_ARGS)
{
	uint8		digest[IDEM_SHA256_BYTES];
	text	   *result = palloc(VARHDRSZ + IDEM_SHA256_HEX_CHARS);

	request_fingerprint(fcinfo, &fingerprint_args, digest);
	SET_VARSIZE(result, VARHDRSZ + IDEM_SHA256_HEX_CHARS);
	idem_core_sha256_to_hex(digest, VARDATA(result));
	PG_RETURN_TEXT_P(result);
}

Datum
response_bytes_as_jsonb(Datum content_type, bool content_type_null, Datum bytes, bool *isnull)
{
	IdemRequest probe;
	bytea	   *body = DatumGetByteaPP(bytes);
	text	   *type;
	uint8		ignored[IDEM_SHA256_BYTES];

	*isnull = true;
	if (content_type_null || GetDatabaseEncoding() != PG_UTF8)
		return (Datum) 0;
	type = DatumGetTextPP(content_type);
	memset(&probe, 0, sizeof(probe));
	probe.method = probe.path = "";
	probe.content_type = VARDATA_ANY(type);
	probe.content_type_len = VARSIZE_ANY_EXHDR(type);
	probe.body = VARDATA_ANY(body);
	probe.body_len = VARSIZE_ANY_EXHDR(body);
	/* The core reading it as JSON means jsonb_in reads it too. */
	if (!idem_core_fingerprint_is_json(&probe) || idem_core_fingerprint(&probe, ignored) != IDEM_OK)
		return (Datum) 0;
	*isnull = false;
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(pnstrdup(probe.body, probe.body_len)));
}
