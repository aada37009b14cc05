/* cleanup.c: batched deletes of expired keys, partition upkeep, and idem_cleanup() for one sweep from SQL. */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "cleanup.h"
#include "guc.h"
#include "key_store.h"
#include "stats.h"

static char *
qualified(Oid schema, const char *name)
{
	return psprintf("%s.%s", quote_identifier(get_namespace_name(schema)), name);
}

Oid
cleanup_extension_schema(void)
{
	int			rc = SPI_execute("SELECT e.extnamespace FROM pg_catalog.pg_extension e"
								 " WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'", true, 1);
	bool		isnull;

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "idempotency: reading pg_extension failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 0)
		return InvalidOid;
	return DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

int64
cleanup_delete_batch(Oid schema, int batch_size)
{
	/* In partitioned storage only the default partition holds rows no drop will take. */
	char	   *table = qualified(schema, key_store_partitioned(schema)
								  ? "idempotency_keys_partitioned_default" : "idempotency_keys");
	Oid			types[2] = {TIMESTAMPTZOID, INT4OID};
	Datum		values[2];
	int			rc;

	/*
	 * ctid lookups: the inner scan stops after batch_size matches, the outer
	 * delete touches only those tuples. Rows being replaced by a completion
	 * right now are skipped, not waited for (the next sweep sees them).
	 */
	values[0] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[1] = Int32GetDatum(batch_size);
	rc = SPI_execute_with_args(psprintf(
		"DELETE FROM %s WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
		"SELECT ctid FROM %s WHERE expires_at OPERATOR(pg_catalog.<=) $1 LIMIT $2"
		" FOR UPDATE SKIP LOCKED))",
		table, table), 2, types, values, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "idempotency: deleting expired keys failed: %s", SPI_result_code_string(rc));
	stats_count(IDEM_COUNT_KEYS_REMOVED, SPI_processed);
	return (int64) SPI_processed;
}

int64
cleanup_drop_expired_partitions(Oid schema)
{
	int			rc;
	bool		isnull;
	int64		partitions;
	int64		keys;

	if (!key_store_partitioned(schema))
		return 0;
	rc = SPI_execute(psprintf("SELECT partitions_dropped::bigint, keys_removed FROM %s()",
							  qualified(schema, "idem_drop_expired_partitions")), false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idempotency: dropping expired partitions failed: %s", SPI_result_code_string(rc));
	partitions = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	keys = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	stats_count(IDEM_COUNT_PARTITIONS_DROPPED, partitions);
	stats_count(IDEM_COUNT_KEYS_REMOVED, keys);
	return keys;
}

int64
cleanup_premake_partitions(Oid schema)
{
	int			rc;
	bool		isnull;
	int64		created;

	if (!key_store_partitioned(schema))
		return 0;
	rc = SPI_execute(psprintf("SELECT %s()::bigint", qualified(schema, "idem_premake_partitions")),
					 false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idempotency: making partitions failed: %s", SPI_result_code_string(rc));
	created = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	stats_count(IDEM_COUNT_PARTITIONS_CREATED, created);
	return created;
}

PG_FUNCTION_INFO_V1(idem_cleanup);

/*
 * One sweep in the caller's transaction: expired partitions dropped, then every
 * other expired key deleted batch by batch. It makes no partitions: creating and
 * dropping never share a transaction (idem_premake_partitions() does that part).
 */
Datum
idem_cleanup(PG_FUNCTION_ARGS)
{
	Oid			schema = get_func_namespace(fcinfo->flinfo->fn_oid);
	int64		removed;
	int64		batch;

	PreventCommandIfReadOnly("idem_cleanup()");
	SPI_connect();
	removed = cleanup_drop_expired_partitions(schema);
	do
	{
		batch = cleanup_delete_batch(schema, idem_cleanup_batch_size);
		removed += batch;
		CHECK_FOR_INTERRUPTS();
	} while (batch == idem_cleanup_batch_size);
	SPI_finish();
	PG_RETURN_INT64(removed);
}
