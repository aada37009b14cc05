/* cleanup.c: batched deletes of expired keys, and idem_cleanup() for one sweep from SQL. */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "cleanup.h"
#include "guc.h"
#include "stats.h"

int64
cleanup_delete_batch(const char *qualified_table, int batch_size)
{
	Oid			types[2] = {TIMESTAMPTZOID, INT4OID};
	Datum		values[2];
	int			rc;

	/*
	 * ctid lookups: the inner scan stops after batch_size matches, the outer
	 * delete touches only those tuples. Row locks are taken on expired keys
	 * only, which no claim ever waits for.
	 */
	values[0] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[1] = Int32GetDatum(batch_size);
	rc = SPI_execute_with_args(psprintf(
		"DELETE FROM %s WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
		"SELECT ctid FROM %s WHERE expires_at OPERATOR(pg_catalog.<=) $1 LIMIT $2))",
		qualified_table, qualified_table), 2, types, values, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "idempotency: deleting expired keys failed: %s", SPI_result_code_string(rc));
	stats_count(IDEM_COUNT_KEYS_REMOVED, SPI_processed);
	return (int64) SPI_processed;
}

char *
cleanup_installed_table(void)
{
	int			rc = SPI_execute(
		"SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e"
		" JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
		" WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'", true, 1);

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "idempotency: reading pg_extension failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 0)
		return NULL;
	return psprintf("%s.idempotency_keys", SPI_getvalue(SPI_tuptable->vals[0],
														SPI_tuptable->tupdesc, 1));
}

PG_FUNCTION_INFO_V1(idem_cleanup);

/* One sweep in the caller's transaction: every expired key, batch by batch. */
Datum
idem_cleanup(PG_FUNCTION_ARGS)
{
	Oid			schema = get_func_namespace(fcinfo->flinfo->fn_oid);
	char	   *table = psprintf("%s.idempotency_keys",
								 quote_identifier(get_namespace_name(schema)));
	int64		removed = 0;
	int64		batch;

	PreventCommandIfReadOnly("idem_cleanup()");
	SPI_connect();
	do
	{
		batch = cleanup_delete_batch(table, idem_cleanup_batch_size);
		removed += batch;
		CHECK_FOR_INTERRUPTS();
	} while (batch == idem_cleanup_batch_size);
	SPI_finish();
	PG_RETURN_INT64(removed);
}
