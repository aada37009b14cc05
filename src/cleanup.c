/* cleanup.c: batched deletes of expired keys, partition upkeep, and idem_cleanup() for one sweep from SQL. */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "storage/bufmgr.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "citus.h"
#include "cleanup.h"
#include "guc.h"
#include "key_store.h"
#include "lock_timeout.h"
#include "maintenance.h"
#include "partitions.h"
#include "stats.h"

/* How long a batch waits for a row lock before it passes locked rows by; far below deadlock_timeout. */
#define CLEANUP_LOCK_TIMEOUT "20ms"

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

/*
 * Says, once per call, which ordinary triggers on the key tables a sweep does
 * not fire (see Maintenance): a DBA who put one there learns why it is silent,
 * and an attempt to plant one shows in the log.
 */
void
cleanup_report_skipped_triggers(Oid schema)
{
	Oid			types[1] = {OIDOID};
	Datum		values[1] = {ObjectIdGetDatum(schema)};
	bool		isnull;
	Datum		names;
	int			rc = SPI_execute_with_args(
		"SELECT pg_catalog.string_agg(pg_catalog.format('%I on %I', t.tgname, c.relname), ', '"
		" ORDER BY c.relname, t.tgname)"
		" FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid"
		" WHERE c.relnamespace OPERATOR(pg_catalog.=) $1"
		" AND c.relname OPERATOR(pg_catalog.~~) 'idempotency\\_keys%'"
		" AND NOT t.tgisinternal AND t.tgenabled OPERATOR(pg_catalog.=) 'O'",
		1, types, values, NULL, true, 1);

	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idempotency: reading the key tables' triggers failed: %s", SPI_result_code_string(rc));
	names = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		ereport(LOG,
				(errmsg("idempotency: the sweep of database \"%s\" does not fire these triggers: %s",
						get_database_name(MyDatabaseId), TextDatumGetCString(names)),
				 errdetail("A sweep runs as the table's owner with session_replication_role = replica; only "
						   "triggers its owner enables ALWAYS fire, as the owner.")));
}

void
cleanup_sweep_start(SweepPosition *position)
{
	ItemPointerSet(&position->next, 0, FirstOffsetNumber);
	position->finished = false;
	position->relation = 0;
}

/* The batch statement's parameters ($1 .. $4) and its result's columns (1 .. 3). */
enum
{
	BATCH_PARAM_NOW,			/* expired: expires_at at or before it */
	BATCH_PARAM_LIMIT,
	BATCH_PARAM_FROM,			/* the TID range [from, to) */
	BATCH_PARAM_TO,
	BATCH_PARAM_TOMBSTONE_SINCE,	/* 1.4: expired rows that expired after it become tombstones */
	BATCH_PARAMS
};

enum
{
	BATCH_COL_SELECTED = 1,
	BATCH_COL_LAST,				/* the greatest TID taken */
	BATCH_COL_REMOVED
};

/*
 * What a batch deletes from: expired key rows (column expires_at), or, once the keys are done, tombstones past
 * idempotency.tombstone_ttl (column expired_at; 1.4). tombstones: the qualified tombstone table a key batch
 * turns its expired completed rows into (1.4); NULL while tombstones are off or the SQL predates them.
 */
typedef struct BatchTarget
{
	const char *table;
	const char *column;
	const char *tombstones;
} BatchTarget;

/* Statement texts by variant: a plain DELETE, then its fallback that passes locked rows by. */
static char *
batch_statement(const BatchTarget *target, bool skip_locked)
{
	/*
	 * The scan covers [$3, $4) of the heap (a TID range scan) and stops at $2
	 * expired rows; the delete touches only those tuples, rechecking expiry in
	 * case a tuple slot was reused meanwhile. The batch reports how far it got.
	 * With tombstones on, the rows it deletes that were completed (a status: not
	 * a lease that ran out) and expired after $5 become tombstones in the same
	 * statement, so no snapshot sees the key with neither row nor tombstone.
	 */
	const char *returning = target->tombstones == NULL ? "1"
		: "expires_at, scope, key, request_hash, http_status";
	char	   *tombstones = target->tombstones == NULL ? "" : psprintf(
		", buried AS (INSERT INTO %s (expired_at, scope, key, request_hash)"
		" SELECT expires_at, scope, key, request_hash FROM gone WHERE http_status IS NOT NULL"
		" AND expires_at OPERATOR(pg_catalog.>) $5 ON CONFLICT DO NOTHING)", target->tombstones);

	return psprintf(
		"WITH batch AS MATERIALIZED (SELECT ctid FROM %s"
		" WHERE ctid OPERATOR(pg_catalog.>=) $3 AND ctid OPERATOR(pg_catalog.<) $4"
		" AND %s OPERATOR(pg_catalog.<=) $1 LIMIT $2%s),"
		" gone AS (DELETE FROM %s WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM batch))"
		" AND %s OPERATOR(pg_catalog.<=) $1 RETURNING %s)%s"
		" SELECT (SELECT pg_catalog.count(*) FROM batch), (SELECT pg_catalog.max(ctid) FROM batch),"
		" (SELECT pg_catalog.count(*) FROM gone)",
		target->table, target->column, skip_locked ? " FOR UPDATE SKIP LOCKED" : "",
		target->table, target->column, returning, tombstones);
}

/* One batch statement and its parameters, as run_with_lock_timeout hands them to execute_batch. */
typedef struct BatchStep
{
	const char *sql;
	Datum	   *values;
} BatchStep;

static void
execute_batch(void *arg)
{
	static Oid	types[BATCH_PARAMS] = {
		[BATCH_PARAM_NOW] = TIMESTAMPTZOID,
		[BATCH_PARAM_LIMIT] = INT4OID,
		[BATCH_PARAM_FROM] = TIDOID,
		[BATCH_PARAM_TO] = TIDOID,
		[BATCH_PARAM_TOMBSTONE_SINCE] = TIMESTAMPTZOID
	};
	BatchStep  *batch = arg;
	int			rc = SPI_execute_with_args(batch->sql, BATCH_PARAMS, types, batch->values, NULL, false, 0);

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "idempotency: deleting expired keys failed: %s", SPI_result_code_string(rc));
}

/*
 * Runs one batch statement. Without skip_locked it waits at most
 * CLEANUP_LOCK_TIMEOUT for a row a transaction is replacing right now (well
 * below deadlock_timeout, so the sweep, never the request, gives way) and
 * reports false when that runs out; its work is rolled back then.
 */
static bool
run_batch(const char *sql, Datum *values, bool skip_locked)
{
	BatchStep	batch = {sql, values};

	if (skip_locked)
	{
		execute_batch(&batch);
		return true;
	}
	return run_with_lock_timeout(CLEANUP_LOCK_TIMEOUT, execute_batch, &batch);
}

static bool
relation_has_blocks(Oid relid)
{
	Relation	relation = table_open(relid, AccessShareLock);
	bool		has_blocks = RelationGetNumberOfBlocks(relation) > 0;

	table_close(relation, AccessShareLock);
	return has_blocks;
}

/*
 * The relations a sweep deletes from, in order: in partitioned storage the default partition, the only one
 * holding rows no drop will take; else idempotency_keys, which on a Citus node is its local shards (citus.c).
 */
static List *
sweep_relations(Oid schema)
{
	bool		partitioned = key_store_partitioned(schema);
	const char *relname = partitioned ? "idempotency_keys_partitioned_default" : "idempotency_keys";
	Oid			relid = get_relname_relid(relname, schema);
	Oid			tombstones;
	List	   *relations;

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("idempotency: table %s is missing from the extension's schema", qualified(schema, relname)),
				 errhint("Run ALTER EXTENSION idempotency UPDATE, or restore the table's name.")));
	relations = partitioned ? list_make1_oid(relid) : citus_sweep_relations(relid);
	/*
	 * 1.4: the tombstones last, the ones past idempotency.tombstone_ttl (all of them once it is 0). With
	 * tombstones off and none left on disk the sweep is 1.3's.
	 */
	tombstones = get_relname_relid("idempotency_tombstones", schema);
	if (OidIsValid(tombstones) && (idem_tombstone_ttl_seconds > 0 || relation_has_blocks(tombstones)))
		relations = lappend_oid(relations, tombstones);
	return relations;
}

int64
cleanup_delete_batch(Oid schema, int batch_size, SweepPosition *position, int64 *pages_scanned)
{
	List	   *relations = sweep_relations(schema);
	char	   *table;
	Oid			relid;
	Relation	relation;
	BlockNumber blocks;
	BlockNumber from_block = ItemPointerGetBlockNumber(&position->next);
	BlockNumber to_block;
	ItemPointerData from = position->next;
	ItemPointerData to;
	Datum		values[BATCH_PARAMS];
	bool		isnull;
	int64		selected;
	int64		removed;
	Maintenance maintenance;
	Oid			tombstones_relid = get_relname_relid("idempotency_tombstones", schema);
	BatchTarget target;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz tombstone_since = now - (TimestampTz) idem_tombstone_ttl_seconds * USECS_PER_SEC;

	if (position->relation >= list_length(relations))
	{
		position->finished = true;
		*pages_scanned = 0;
		return 0;
	}
	relid = list_nth_oid(relations, position->relation);
	table = qualified(schema, quote_identifier(get_rel_name(relid)));

	/*
	 * The lock the DELETE takes anyway; rows appended after this are not expired yet. A session that holds a
	 * conflicting lock (an application role may LOCK the table it can UPDATE) makes the sweep pass this
	 * database by after a short wait, so the launcher goes on to the next database instead of waiting with it.
	 */
	if (!maintenance_lock_relation(relid, RowExclusiveLock))
	{
		char	   *database = get_database_name(MyDatabaseId);

		stats_count(IDEM_COUNT_SWEEPS_BLOCKED, 1);
		/* idem_stats.last_error without the database, which has a column of its own; the log line says both. */
		stats_record_error(database, psprintf("table %s was locked by another session for %d ms; its sweep is "
											  "left for the next interval", table, MAINTENANCE_TABLE_LOCK_WAIT_MS));
		ereport(LOG,
				(errmsg("idempotency: in database \"%s\", table %s was locked by another session for %d ms; its "
						"sweep is left for the next interval", database, table, MAINTENANCE_TABLE_LOCK_WAIT_MS)));
		position->finished = true;
		*pages_scanned = 0;
		return CLEANUP_TABLE_BLOCKED;
	}
	relation = table_open(relid, NoLock);
	blocks = RelationGetNumberOfBlocks(relation);
	table_close(relation, NoLock);

	/* At most batch_size pages per batch, so a table with few expired rows is paced too. */
	to_block = from_block + Min((BlockNumber) batch_size, MaxBlockNumber - from_block);
	ItemPointerSet(&to, to_block, FirstOffsetNumber);
	target.table = table;
	target.column = "expires_at";
	target.tombstones = NULL;
	if (relid == tombstones_relid)
	{
		/* Tombstones go idempotency.tombstone_ttl after their key expired. */
		target.column = "expired_at";
		now = tombstone_since;
	}
	else if (idem_tombstone_ttl_seconds > 0 && OidIsValid(tombstones_relid))
		target.tombstones = qualified(schema, "idempotency_tombstones");
	values[BATCH_PARAM_NOW] = TimestampTzGetDatum(now);
	values[BATCH_PARAM_LIMIT] = Int32GetDatum(batch_size);
	values[BATCH_PARAM_FROM] = PointerGetDatum(&from);
	values[BATCH_PARAM_TO] = PointerGetDatum(&to);
	values[BATCH_PARAM_TOMBSTONE_SINCE] = TimestampTzGetDatum(tombstone_since);
	maintenance_begin(relid, &maintenance);
	if (!run_batch(batch_statement(&target, false), values, false))
		(void) run_batch(batch_statement(&target, true), values, true);
	maintenance_end(&maintenance);

	selected = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, BATCH_COL_SELECTED,
										   &isnull));
	removed = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, BATCH_COL_REMOVED,
										  &isnull));
	if (selected == batch_size)
	{
		/* Stopped inside the range: go on right after the last row taken. */
		ItemPointer last = (ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[0],
															 SPI_tuptable->tupdesc, BATCH_COL_LAST,
															 &isnull));

		ItemPointerSet(&position->next, ItemPointerGetBlockNumber(last),
					   ItemPointerGetOffsetNumber(last) + 1);
		*pages_scanned = ItemPointerGetBlockNumber(last) - from_block + 1;
	}
	else
	{
		position->next = to;
		position->finished = to_block >= blocks;
		/* The pages there were: a relation that ends inside the range is not paced for the rest of it. */
		*pages_scanned = Min(to_block, Max(blocks, from_block)) - from_block;
	}
	/* The end of one relation's heap hands over to the next relation, if any. */
	if (position->finished && position->relation + 1 < list_length(relations))
	{
		position->relation++;
		ItemPointerSet(&position->next, 0, FirstOffsetNumber);
		position->finished = false;
	}
	/* Tombstones removed are paced like keys but not counted as keys removed. */
	if (relid != tombstones_relid)
		stats_count(IDEM_COUNT_KEYS_REMOVED, removed);
	return removed;
}

int64
cleanup_drop_expired_partitions(Oid schema, int limit, bool *more)
{
	Maintenance maintenance;
	int			partitions;
	int64		keys;

	*more = false;
	if (!key_store_partitioned(schema))
		return 0;
	maintenance_begin(partitions_parent(schema), &maintenance);
	partitions_drop_expired(schema, limit, &partitions, &keys, more);
	maintenance_end(&maintenance);
	stats_count(IDEM_COUNT_PARTITIONS_DROPPED, partitions);
	stats_count(IDEM_COUNT_KEYS_REMOVED, keys);
	return keys;
}

int64
cleanup_premake_partitions(Oid schema)
{
	Maintenance maintenance;
	int64		created;

	if (!key_store_partitioned(schema))
		return 0;
	maintenance_begin(partitions_parent(schema), &maintenance);
	created = partitions_premake(schema);
	maintenance_end(&maintenance);
	stats_count(IDEM_COUNT_PARTITIONS_CREATED, created);
	return created;
}

PG_FUNCTION_INFO_V1(idem_cleanup);

/*
 * One sweep in the caller's transaction: expired keys outside partitions deleted
 * batch by batch, then expired partitions dropped, last: a drop's lock on the
 * parent holds every partitioned claim until the caller's transaction ends. It
 * makes no partitions: creating and dropping never share a transaction
 * (idem_premake_partitions() does that part).
 */
Datum
idem_cleanup(PG_FUNCTION_ARGS)
{
	Oid			schema = get_func_namespace(fcinfo->flinfo->fn_oid);
	int64		removed;
	int64		pages;
	bool		more;
	SweepPosition position;

	PreventCommandIfReadOnly("idem_cleanup()");
	SPI_connect();
	removed = 0;
	cleanup_sweep_start(&position);
	while (!position.finished)
	{
		int64		batch = cleanup_delete_batch(schema, idem_cleanup_batch_size, &position, &pages);

		if (batch == CLEANUP_TABLE_BLOCKED)
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("idempotency: a key table is locked by another session"),
					 errhint("idem_cleanup() waits at most %d ms for it; try again later.",
							 MAINTENANCE_TABLE_LOCK_WAIT_MS)));
		removed += batch;
		CHECK_FOR_INTERRUPTS();
	}
	removed += cleanup_drop_expired_partitions(schema, 0, &more);
	SPI_finish();
	PG_RETURN_INT64(removed);
}
