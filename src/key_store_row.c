/* key_store_row.c: the columns of a key row and the one decoder both paths read rows with. */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/timestamp.h"

#include "key_store_internal.h"
#include "pg_compat.h"

const char *const key_column_names[KEY_COLUMNS] = {
	"expires_at", "created_at", "http_status", "scope", "key", "request_hash",
	"response_headers", "response_body",
	"lease_until", "lease_token", "recovery_point", "recovery_state",
	"response_content_type", "response_bytes"
};

const Oid	key_column_types[KEY_COLUMNS] = {
	TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID, TEXTOID, TEXTOID, BYTEAOID, JSONBOID, JSONBOID,
	TIMESTAMPTZOID, UUIDOID, TEXTOID, JSONBOID,
	TEXTOID, BYTEAOID
};

static Datum
copy_varlena(Datum value, bool isnull, MemoryContext context)
{
	MemoryContext old;

	if (isnull)
		return (Datum) 0;
	old = MemoryContextSwitchTo(context);
	value = PointerGetDatum(PG_DETOAST_DATUM_COPY(value));
	MemoryContextSwitchTo(old);
	return value;
}

void
key_row_decode(const Datum *values, const bool *nulls, bool has_lease_columns, bool has_bytes_columns,
			   KeyRow *out, MemoryContext context)
{
	bytea	   *hash;

	memset(out, 0, sizeof(*out));
	out->found = true;
	out->expires_at = DatumGetTimestampTz(values[KEY_COL_EXPIRES_AT]);
	hash = nulls[KEY_COL_REQUEST_HASH] ? NULL : DatumGetByteaPP(values[KEY_COL_REQUEST_HASH]);
	if (hash == NULL || VARSIZE_ANY_EXHDR(hash) != IDEM_SHA256_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("idempotency: a stored request_hash is not 32 bytes")));
	memcpy(out->request_hash, VARDATA_ANY(hash), IDEM_SHA256_BYTES);
	out->http_status_null = nulls[KEY_COL_HTTP_STATUS];
	out->http_status = out->http_status_null ? 0 : DatumGetInt32(values[KEY_COL_HTTP_STATUS]);
	out->body_null = nulls[KEY_COL_RESPONSE_BODY];
	out->body = copy_varlena(values[KEY_COL_RESPONSE_BODY], out->body_null, context);
	out->headers_null = nulls[KEY_COL_RESPONSE_HEADERS];
	out->headers = copy_varlena(values[KEY_COL_RESPONSE_HEADERS], out->headers_null, context);

	out->content_type_null = out->bytes_null = true;
	if (has_bytes_columns)
	{
		out->content_type_null = nulls[KEY_COL_RESPONSE_CONTENT_TYPE];
		out->content_type = copy_varlena(values[KEY_COL_RESPONSE_CONTENT_TYPE], out->content_type_null,
										 context);
		out->bytes_null = nulls[KEY_COL_RESPONSE_BYTES];
		out->bytes = copy_varlena(values[KEY_COL_RESPONSE_BYTES], out->bytes_null, context);
	}

	out->recovery_point_null = out->recovery_state_null = true;
	if (!has_lease_columns)
		return;
	out->leased = out->http_status_null && !nulls[KEY_COL_LEASE_UNTIL];
	if (!nulls[KEY_COL_LEASE_UNTIL])
		out->lease_until = DatumGetTimestampTz(values[KEY_COL_LEASE_UNTIL]);
	if (!nulls[KEY_COL_LEASE_TOKEN])
		out->lease_token = *DatumGetUUIDP(values[KEY_COL_LEASE_TOKEN]);
	out->recovery_point_null = nulls[KEY_COL_RECOVERY_POINT];
	out->recovery_point = copy_varlena(values[KEY_COL_RECOVERY_POINT], out->recovery_point_null,
									   context);
	out->recovery_state_null = nulls[KEY_COL_RECOVERY_STATE];
	out->recovery_state = copy_varlena(values[KEY_COL_RECOVERY_STATE], out->recovery_state_null,
									   context);
}

bytea *
key_hash_bytea(const uint8 hash[IDEM_SHA256_BYTES])
{
	bytea	   *result = palloc(VARHDRSZ + IDEM_SHA256_BYTES);

	SET_VARSIZE(result, VARHDRSZ + IDEM_SHA256_BYTES);
	memcpy(VARDATA(result), hash, IDEM_SHA256_BYTES);
	return result;
}
