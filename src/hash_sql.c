/* hash_sql.c: idem_hash for text, bytea and jsonb, as lowercase hex SHA-256. */
#include "postgres.h"

#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "sql_args.h"
#include "pg_compat.h"

PG_FUNCTION_INFO_V1(idem_hash_text);
PG_FUNCTION_INFO_V1(idem_hash_bytea);
PG_FUNCTION_INFO_V1(idem_hash_jsonb);

/* idem_hash(input text | bytea | jsonb) */
enum
{
	HASH_ARG_INPUT
};

/* idem_hash(payload jsonb, exclude text[]) */
enum
{
	EXCLUDE_ARG_PAYLOAD,
	EXCLUDE_ARG_EXCLUDE
};

static text *
sha256_hex_text(const void *data, size_t len)
{
	uint8		digest[IDEM_SHA256_BYTES];
	text	   *result;
	IdemStatus	status = idem_core_sha256(data, len, digest);

	if (status != IDEM_OK)
		report_core_failure(status);
	result = palloc(VARHDRSZ + IDEM_SHA256_HEX_CHARS);
	SET_VARSIZE(result, VARHDRSZ + IDEM_SHA256_HEX_CHARS);
	idem_core_sha256_to_hex(digest, VARDATA(result));
	return result;
}

/* text and bytea hash their bytes as they are. */
Datum
idem_hash_text(PG_FUNCTION_ARGS)
{
	text	   *input = PG_GETARG_TEXT_PP(HASH_ARG_INPUT);

	PG_RETURN_TEXT_P(sha256_hex_text(VARDATA_ANY(input), VARSIZE_ANY_EXHDR(input)));
}

Datum
idem_hash_bytea(PG_FUNCTION_ARGS)
{
	bytea	   *input = PG_GETARG_BYTEA_PP(HASH_ARG_INPUT);

	PG_RETURN_TEXT_P(sha256_hex_text(VARDATA_ANY(input), VARSIZE_ANY_EXHDR(input)));
}

/*
 * jsonb hashes its canonical text: jsonb's own output, where object keys are
 * already sorted and duplicates removed, and spacing is fixed. So key order
 * and white space in the request do not change the hash.
 */
Datum
idem_hash_jsonb(PG_FUNCTION_ARGS)
{
	Jsonb	   *input = PG_GETARG_JSONB_P(HASH_ARG_INPUT);
	char	   *canonical = JsonbToCString(NULL, &input->root, VARSIZE(input));

	PG_RETURN_TEXT_P(sha256_hex_text(canonical, strlen(canonical)));
}

PG_FUNCTION_INFO_V1(idem_hash_jsonb_exclude);

/*
 * The most exclude paths idem_hash(jsonb, text[]) takes (README, "Fingerprints"): each path costs one pass
 * over the payload, so the work is bounded by this times the payload's size. ERROR 22023 past it.
 */
#define IDEM_MAX_EXCLUDE_PATHS 256

/*
 * idem_hash(payload jsonb, exclude text[]): the payload without the fields named
 * by exclude, each a path of object keys joined by '.', hashed as idem_hash(jsonb).
 * In C so that nothing is looked up by name when it runs. ERROR 22004 for a NULL
 * path, 22023 for an empty one or for more than IDEM_MAX_EXCLUDE_PATHS of them.
 *
 * Memory stays proportional to the payload: each path's deletion runs in a
 * context of its own, and only its result survives it, so at most the payload,
 * one intermediate copy and the one being made are alive at once (a copy per
 * path, kept to the end of the call, grew a backend by 240 MB for 200 paths on
 * 0.5 MB).
 */
Datum
idem_hash_jsonb_exclude(PG_FUNCTION_ARGS)
{
	Datum		payload = PG_GETARG_DATUM(EXCLUDE_ARG_PAYLOAD);
	ArrayType  *exclude = PG_GETARG_ARRAYTYPE_P(EXCLUDE_ARG_EXCLUDE);
	Datum	   *paths;
	bool	   *nulls;
	int			count;
	Jsonb	   *result;
	char	   *canonical;
	text	   *hash;
	MemoryContext caller = CurrentMemoryContext;
	MemoryContext kept = NULL;

	if (ArrayGetNItems(ARR_NDIM(exclude), ARR_DIMS(exclude)) > IDEM_MAX_EXCLUDE_PATHS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency exclude paths are limited to %d", IDEM_MAX_EXCLUDE_PATHS),
				 errdetail("%d paths were given.", ArrayGetNItems(ARR_NDIM(exclude), ARR_DIMS(exclude)))));
	deconstruct_array(exclude, TEXTOID, -1, false, TYPALIGN_INT, &paths, &nulls, &count);
	for (int i = 0; i < count; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("idempotency exclude paths must not be NULL")));
		if (VARSIZE_ANY_EXHDR(DatumGetPointer(paths[i])) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("idempotency exclude paths must not be empty")));
	}
	for (int i = 0; i < count; i++)
	{
		MemoryContext step = AllocSetContextCreate(caller, "idem_hash exclude path", ALLOCSET_DEFAULT_SIZES);
		MemoryContext old = MemoryContextSwitchTo(step);
		Datum		deleted;

		/* payload #- string_to_array(path, '.') */
		deleted = DirectFunctionCall2(jsonb_delete_path, payload,
									  DirectFunctionCall2Coll(text_to_array, C_COLLATION_OID, paths[i],
															  CStringGetTextDatum(".")));
		MemoryContextSwitchTo(old);
		/* Only the result outlives the step; the previous result is freed with its own step's context. */
		if (DatumGetPointer(deleted) != DatumGetPointer(payload))
		{
			MemoryContext keep = AllocSetContextCreate(caller, "idem_hash excluded payload",
													   ALLOCSET_DEFAULT_SIZES);
			Jsonb	   *copy = MemoryContextAlloc(keep, VARSIZE_ANY(DatumGetPointer(deleted)));

			memcpy(copy, DatumGetPointer(deleted), VARSIZE_ANY(DatumGetPointer(deleted)));
			if (kept != NULL)
				MemoryContextDelete(kept);
			kept = keep;
			payload = PointerGetDatum(copy);
		}
		MemoryContextDelete(step);
	}
	result = DatumGetJsonbP(payload);
	canonical = JsonbToCString(NULL, &result->root, VARSIZE(result));
	hash = sha256_hex_text(canonical, strlen(canonical));
	pfree(canonical);
	if (kept != NULL)
		MemoryContextDelete(kept);
	PG_RETURN_TEXT_P(hash);
}
