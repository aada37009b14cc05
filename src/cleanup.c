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
#include "stats.h"

/* How long a batch waits for a row lock before it passes locked rows by; far below deadlock_timeout. */
#define CLEANUP_LOCK_TIMEOUT "20ms"

/*
 * Maintenance acts as the owner of the table it works on, inside a
 * security-restricted operation with a safe search_path, as autovacuum and
 * REFRESH MATERIALIZED VIEW do: a trigger, policy or function anyone planted
 * then runs with no more rights than the table's owner has, and cannot change
 * the session (SET ROLE, temporary objects) for what runs after it. Ordinary
 * triggers do not fire at all (session_replication_role = replica, as in a
 * logical replication apply): a role granted TRIGGER on a superuser's table must
 * not get its function run by the superuser's sweep. Only the table's owner can
 * make a trigger fire ALWAYS, and it then runs as that owner. Everything is
 * restored at maintenance_end, or by the transaction's abort on an ERROR.
 */
typedef struct Maintenance
{
	Oid			saved_user;
	int			saved_security_context;
	int			guc_nest_level;
} Maintenance;

static void
maintenance_begin(Oid relid, Maintenance *maintenance)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			owner;

	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "idempotency: relation %u is gone", relid);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);

	GetUserIdAndSecContext(&maintenance->saved_user, &maintenance->saved_security_context);
	maintenance->guc_nest_level = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("session_replication_role", "replica", PGC_SUSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	SetUserIdAndSecContext(owner, maintenance->saved_security_context | SECURITY_RESTRICTED_OPERATION);
}

static void
maintenance_end(const Maintenance *maintenance)
{
	AtEOXact_GUC(false, maintenance->guc_nest_level);
	SetUserIdAndSecContext(maintenance->saved_user, maintenance->saved_security_context);
}

/*
 * One of the extension's own functions without arguments, by the OID of its
 * schema: nothing is looked up by a name that someone could redirect.
 */
static Oid
extension_function(Oid schema, const char *name)
{
	Oid			function = GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid, CStringGetDatum(name),
										   PointerGetDatum(buildoidvector(NULL, 0)),
										   ObjectIdGetDatum(schema));

	if (!OidIsValid(function))
		elog(ERROR, "idempotency: function %s() is missing from the extension's schema", name);
	return function;
}

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
	BATCH_PARAMS
};

enum
{
	BATCH_COL_SELECTED = 1,
	BATCH_COL_LAST,				/* the greatest TID taken */
	BATCH_COL_REMOVED
};

/* Statement texts by variant: a plain DELETE, then its fallback that passes locked rows by. */
static char *
batch_statement(const char *table, bool skip_locked)
{
	/*
	 * The scan covers [$3, $4) of the heap (a TID range scan) and stops at $2
	 * expired rows; the delete touches only those tuples, rechecking expiry in
	 * case a tuple slot was reused meanwhile. The batch reports how far it got.
	 */
	return psprintf(
		"WITH batch AS MATERIALIZED (SELECT ctid FROM %s"
		" WHERE ctid OPERATOR(pg_catalog.>=) $3 AND ctid OPERATOR(pg_catalog.<) $4"
		" AND expires_at OPERATOR(pg_catalog.<=) $1 LIMIT $2%s),"
		" gone AS (DELETE FROM %s WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM batch))"
		" AND expires_at OPERATOR(pg_catalog.<=) $1 RETURNING 1)"
		" SELECT (SELECT pg_catalog.count(*) FROM batch), (SELECT pg_catalog.max(ctid) FROM batch),"
		" (SELECT pg_catalog.count(*) FROM gone)",
		table, skip_locked ? " FOR UPDATE SKIP LOCKED" : "", table);
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
		[BATCH_PARAM_TO] = TIDOID
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

	if (!OidIsValid(relid))
		elog(ERROR, "idempotency: table %s is missing", qualified(schema, relname));
	return partitioned ? list_make1_oid(relid) : citus_sweep_relations(relid);
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

	if (position->relation >= list_length(relations))
	{
		position->finished = true;
		*pages_scanned = 0;
		return 0;
	}
	relid = list_nth_oid(relations, position->relation);
	table = qualified(schema, quote_identifier(get_rel_name(relid)));
	/* The lock the DELETE takes anyway; rows appended after this are not expired yet. */
	relation = table_open(relid, RowExclusiveLock);
	blocks = RelationGetNumberOfBlocks(relation);
	table_close(relation, NoLock);

	/* At most batch_size pages per batch, so a table with few expired rows is paced too. */
	to_block = from_block + Min((BlockNumber) batch_size, MaxBlockNumber - from_block);
	ItemPointerSet(&to, to_block, FirstOffsetNumber);
	values[BATCH_PARAM_NOW] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[BATCH_PARAM_LIMIT] = Int32GetDatum(batch_size);
	values[BATCH_PARAM_FROM] = PointerGetDatum(&from);
	values[BATCH_PARAM_TO] = PointerGetDatum(&to);
	maintenance_begin(relid, &maintenance);
	if (!run_batch(batch_statement(table, false), values, false))
		(void) run_batch(batch_statement(table, true), values, true);
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
		*pages_scanned = to_block - from_block;
	}
	/* The end of one relation's heap hands over to the next relation, if any. */
	if (position->finished && position->relation + 1 < list_length(relations))
	{
		position->relation++;
		ItemPointerSet(&position->next, 0, FirstOffsetNumber);
		position->finished = false;
	}
	stats_count(IDEM_COUNT_KEYS_REMOVED, removed);
	return removed;
}

/* The partitioned twin, whose owner makes and drops its partitions. */
static Oid
partitioned_table(Oid schema)
{
	Oid			relid = get_relname_relid("idempotency_keys_partitioned", schema);

	if (!OidIsValid(relid))
		elog(ERROR, "idempotency: table idempotency_keys_partitioned is missing");
	return relid;
}

/* The columns of idem_drop_expired_partitions()'s result row. */
enum
{
	DROPPED_COL_PARTITIONS = 1,
	DROPPED_COL_KEYS
};

int64
cleanup_drop_expired_partitions(Oid schema)
{
	Maintenance maintenance;
	Oid			function;
	HeapTupleHeader result;
	bool		isnull;
	int64		partitions;
	int64		keys;

	if (!key_store_partitioned(schema))
		return 0;
	function = extension_function(schema, "idem_drop_expired_partitions");
	maintenance_begin(partitioned_table(schema), &maintenance);
	result = DatumGetHeapTupleHeader(OidFunctionCall0(function));
	maintenance_end(&maintenance);
	partitions = DatumGetInt32(GetAttributeByNum(result, DROPPED_COL_PARTITIONS, &isnull));
	keys = DatumGetInt64(GetAttributeByNum(result, DROPPED_COL_KEYS, &isnull));
	stats_count(IDEM_COUNT_PARTITIONS_DROPPED, partitions);
	stats_count(IDEM_COUNT_KEYS_REMOVED, keys);
	return keys;
}

int64
cleanup_premake_partitions(Oid schema)
{
	Maintenance maintenance;
	Oid			function;
	int64		created;

	if (!key_store_partitioned(schema))
		return 0;
	function = extension_function(schema, "idem_premake_partitions");
	maintenance_begin(partitioned_table(schema), &maintenance);
	created = DatumGetInt32(OidFunctionCall0(function));
	maintenance_end(&maintenance);
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
	int64		pages;
	SweepPosition position;

	PreventCommandIfReadOnly("idem_cleanup()");
	SPI_connect();
	removed = cleanup_drop_expired_partitions(schema);
	cleanup_sweep_start(&position);
	while (!position.finished)
	{
		removed += cleanup_delete_batch(schema, idem_cleanup_batch_size, &position, &pages);
		CHECK_FOR_INTERRUPTS();
	}
	SPI_finish();
	PG_RETURN_INT64(removed);
}
