/*
 * partitions.c: partitioned storage's upkeep in C. The bounds are the values in pg_class.relpartbound (a
 * PartitionBoundSpec whose range datums are timestamptz constants), never their text: pg_get_expr prints a
 * bound under the session's DateStyle and TimeZone, and reading that text back under another zone, or with a
 * zone abbreviation that names another offset ('IST+3' prints "IST", which reads as India), moves the bound by
 * hours. Widths and horizons are microsecond arithmetic, the same in every time zone. The one function called,
 * idem_create_partition(timestamptz, timestamptz), is called by OID, found through the extension's membership
 * with its exact argument types: an overload or a renamed schema changes nothing.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/readfuncs.h"
#include "partitioning/partdesc.h"
#include "catalog/partition.h"
#include "tcop/utility.h"
#include "nodes/parsenodes.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/elog.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "catalog/pg_proc.h"
#include "utils/acl.h"
#include "guc.h"
#include "pg_compat.h"
#include "key_store.h"
#include "maintenance.h"
#include "partitions.h"
#include "stats.h"

Oid
partitions_parent(Oid schema)
{
	Oid			relid = maintenance_member_relation(schema, "idempotency_keys_partitioned");

	if (!OidIsValid(relid))
		elog(ERROR, "idempotency: table idempotency_keys_partitioned is missing from the extension");
	return relid;
}

/* The timestamptz of a range bound datum; false for MINVALUE/MAXVALUE or anything not a timestamptz constant. */
static bool
bound_value(Node *node, TimestampTz *value)
{
	PartitionRangeDatum *datum = (PartitionRangeDatum *) node;
	Const	   *constant;

	if (!IsA(node, PartitionRangeDatum) || datum->kind != PARTITION_RANGE_DATUM_VALUE ||
		datum->value == NULL || !IsA(datum->value, Const))
		return false;
	constant = (Const *) datum->value;
	if (constant->constisnull || constant->consttype != TIMESTAMPTZOID)
		return false;
	*value = DatumGetTimestampTz(constant->constvalue);
	return true;
}

static int
compare_lower(const ListCell *a, const ListCell *b)
{
	const RangePartition *x = lfirst(a);
	const RangePartition *y = lfirst(b);

	if (x->lower != y->lower)
		return x->lower < y->lower ? -1 : 1;
	return x->relid < y->relid ? -1 : (x->relid > y->relid ? 1 : 0);
}

List *
partitions_read(Oid parent)
{
	List	   *children = find_inheritance_children(parent, NoLock);
	List	   *partitions = NIL;
	ListCell   *cell;

	foreach(cell, children)
	{
		Oid			child = lfirst_oid(cell);
		HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(child));
		Datum		bound;
		bool		isnull;
		PartitionBoundSpec *spec;
		RangePartition partition;

		if (!HeapTupleIsValid(tuple))
			continue;			/* dropped meanwhile */
		bound = SysCacheGetAttr(RELOID, tuple, Anum_pg_class_relpartbound, &isnull);
		if (isnull)
		{
			ReleaseSysCache(tuple);
			continue;
		}
		spec = (PartitionBoundSpec *) stringToNode(TextDatumGetCString(bound));
		ReleaseSysCache(tuple);
		if (!IsA(spec, PartitionBoundSpec) || spec->is_default || spec->strategy != PARTITION_STRATEGY_RANGE ||
			list_length(spec->lowerdatums) != 1 || list_length(spec->upperdatums) != 1 ||
			!bound_value(linitial(spec->lowerdatums), &partition.lower) ||
			!bound_value(linitial(spec->upperdatums), &partition.upper))
			continue;			/* the default partition, or one this extension never makes */
		partition.relid = child;
		partitions = lappend(partitions, memcpy(palloc(sizeof(partition)), &partition, sizeof(partition)));
	}
	list_sort(partitions, compare_lower);
	return partitions;
}

/* date_bin(width, t, timestamptz '2000-01-01 00:00:00+00'): the PostgreSQL epoch is that origin. */
static TimestampTz
bin_start(TimestampTz t, int64 width)
{
	int64		offset = t % width;

	if (offset < 0)
		offset += width;
	return t - offset;
}

/* Runs fn in a subtransaction; on an ERROR, logs it with what and returns the SQLSTATE (0 when it ran). */
typedef void (*PartitionStep) (void *arg);

static int
run_partition_step(PartitionStep fn, void *arg, char **message)
{
	MemoryContext context = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	int			sqlstate = 0;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(context);
	PG_TRY();
	{
		fn(arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		ErrorData  *error;

		MemoryContextSwitchTo(context);
		error = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		sqlstate = error->sqlerrcode;
		*message = pstrdup(error->message);
		FreeErrorData(error);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(context);
	CurrentResourceOwner = owner;
	return sqlstate;
}

typedef struct CreateStep
{
	Oid			function;
	TimestampTz lower;
	TimestampTz upper;
} CreateStep;

static void
create_step(void *arg)
{
	CreateStep *step = arg;

	(void) OidFunctionCall2(step->function, TimestampTzGetDatum(step->lower), TimestampTzGetDatum(step->upper));
}

int
partitions_premake(Oid schema)
{
	static const Oid argtypes[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
	List	   *partitions = partitions_read(partitions_parent(schema));
	RangePartition *newest = NULL;
	ListCell   *cell;
	CreateStep	step;
	int64		width;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz horizon;
	int			created = 0;

	/* The newest partition is never dropped, so its width is always known; none: table storage. */
	foreach(cell, partitions)
	{
		RangePartition *partition = lfirst(cell);

		if (newest == NULL || partition->upper > newest->upper)
			newest = partition;
	}
	if (newest == NULL)
		return 0;
	width = newest->upper - newest->lower;
	if (width <= 0)
		return 0;
	step.function = maintenance_member_function(schema, "idem_create_partition", 2, argtypes);
	if (!OidIsValid(step.function))
		elog(ERROR, "idempotency: function idem_create_partition(timestamptz, timestamptz) is missing from the extension");
	/* Called by OID, past fmgr's privilege check: the table's owner needs EXECUTE on it, as in a call by name. */
	if (idem_function_aclcheck(step.function, GetUserId(), ACL_EXECUTE) != ACLCHECK_OK)
		aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_FUNCTION, "idem_create_partition");
	/* No claim can expire in the past: after a long pause, start again at the current partition. */
	step.lower = Max(newest->upper, bin_start(now, width));
	horizon = now + (int64) idem_ttl_seconds * USECS_PER_SEC + 2 * width;
	while (step.lower < horizon)
	{
		char	   *message = NULL;
		int			sqlstate;

		step.upper = step.lower + width;
		sqlstate = run_partition_step(create_step, &step, &message);
		if (sqlstate == ERRCODE_LOCK_NOT_AVAILABLE)
		{
			/* Claims in flight hold the default partition: try again at the next sweep. */
			ereport(LOG, (errmsg("idempotency: the default partition is busy; making partitions at the next sweep")));
			break;
		}
		if (sqlstate != 0)
		{
			ereport(LOG,
					(errmsg("idempotency: could not make the partition from %s: %s (SQLSTATE %s); trying again at the next sweep",
							timestamptz_to_str(step.lower), message, unpack_sql_state(sqlstate))));
			break;
		}
		step.lower = step.upper;
		created++;
	}
	return created;
}

typedef struct DropStep
{
	Oid			parent;
	Oid			partition;
	int64		keys;
} DropStep;

/*
 * Locks in DROP TABLE's order (the parent, then the partition) within idempotency.partition_lock_timeout, counts
 * the rows and drops the partition by its name of now, in the extension's schema, under the lock.
 */
static void
drop_step(void *arg)
{
	DropStep   *step = arg;
	char		timeout[32];
	char	   *name;
	char	   *sql;
	bool		isnull;
	int			rc;

	snprintf(timeout, sizeof(timeout), "%dms", idem_partition_lock_timeout_ms);
	(void) set_config_option("lock_timeout", timeout, PGC_SUSET, PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	LockRelationOid(step->parent, AccessExclusiveLock);
	LockRelationOid(step->partition, AccessExclusiveLock);
	name = get_rel_name(step->partition);
	if (name == NULL || get_partition_parent(step->partition, false) != step->parent)
		elog(ERROR, "idempotency: partition %u is gone", step->partition);
	name = quote_qualified_identifier(get_namespace_name(get_rel_namespace(step->partition)), name);
	sql = psprintf("SELECT pg_catalog.count(*) FROM %s", name);
	rc = SPI_execute(sql, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idempotency: counting the rows of %s failed: %s", name, SPI_result_code_string(rc));
	step->keys = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	rc = SPI_execute(psprintf("DROP TABLE %s", name), false, 0);
	if (rc != SPI_OK_UTILITY)
		elog(ERROR, "idempotency: dropping %s failed: %s", name, SPI_result_code_string(rc));
}

void
partitions_drop_expired(Oid schema, int *partitions_dropped, int64 *keys_removed)
{
	Oid			parent = partitions_parent(schema);
	List	   *partitions = partitions_read(parent);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz newest_upper = PG_INT64_MIN;
	ListCell   *cell;

	*partitions_dropped = 0;
	*keys_removed = 0;
	foreach(cell, partitions)
		newest_upper = Max(newest_upper, ((RangePartition *) lfirst(cell))->upper);
	/* The newest partition stays even when expired: it carries the width for the next ones. */
	foreach(cell, partitions)
	{
		RangePartition *partition = lfirst(cell);
		DropStep	step = {parent, partition->relid, 0};
		char	   *message = NULL;
		char	   *name;
		int			sqlstate;

		if (partition->upper > now || partition->upper >= newest_upper)
			continue;
		name = get_rel_name(partition->relid);
		sqlstate = run_partition_step(drop_step, &step, &message);
		if (sqlstate == ERRCODE_LOCK_NOT_AVAILABLE)
			ereport(LOG, (errmsg("idempotency: partition %s is busy; dropping it at the next sweep",
								 name ? name : "?")));
		else if (sqlstate != 0)
			ereport(LOG, (errmsg("idempotency: could not drop partition %s: %s (SQLSTATE %s); trying again at the next sweep",
								 name ? name : "?", message, unpack_sql_state(sqlstate))));
		else
		{
			(*partitions_dropped)++;
			*keys_removed += step.keys;
		}
	}
}

/* ---------- SQL ---------- */

PG_FUNCTION_INFO_V1(idem_partitions);

/*
 * idem_partitions(OUT partition_name name, OUT lower_bound timestamptz, OUT upper_bound timestamptz): the range
 * partitions, lowest first, with their bounds as values: the same under every DateStyle and TimeZone.
 */
Datum
idem_partitions(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			schema = get_func_namespace(fcinfo->flinfo->fn_oid);
	ListCell   *cell;

	InitMaterializedSRF(fcinfo, 0);
	foreach(cell, partitions_read(partitions_parent(schema)))
	{
		RangePartition *partition = lfirst(cell);
		char	   *name = get_rel_name(partition->relid);
		NameData	relname;
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		if (name == NULL)
			continue;
		namestrcpy(&relname, name);
		values[0] = NameGetDatum(&relname);
		values[1] = TimestampTzGetDatum(partition->lower);
		values[2] = TimestampTzGetDatum(partition->upper);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

PG_FUNCTION_INFO_V1(idem_premake_partitions);

/* idem_premake_partitions(): the worker's first step, from SQL (as the table's owner, see maintenance.c). */
Datum
idem_premake_partitions(PG_FUNCTION_ARGS)
{
	Oid			schema = get_func_namespace(fcinfo->flinfo->fn_oid);
	int			created = 0;

	PreventCommandIfReadOnly("idem_premake_partitions()");
	SPI_connect();
	if (key_store_partitioned(schema))
	{
		Maintenance maintenance;

		maintenance_begin(partitions_parent(schema), &maintenance);
		created = partitions_premake(schema);
		maintenance_end(&maintenance);
		stats_count(IDEM_COUNT_PARTITIONS_CREATED, created);
	}
	SPI_finish();
	PG_RETURN_INT32(created);
}

PG_FUNCTION_INFO_V1(idem_drop_expired_partitions);

/* idem_drop_expired_partitions(OUT partitions_dropped integer, OUT keys_removed bigint) */
Datum
idem_drop_expired_partitions(PG_FUNCTION_ARGS)
{
	Oid			schema = get_func_namespace(fcinfo->flinfo->fn_oid);
	int			dropped = 0;
	int64		keys = 0;
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "idempotency: idem_drop_expired_partitions must return a row");
	PreventCommandIfReadOnly("idem_drop_expired_partitions()");
	SPI_connect();
	if (key_store_partitioned(schema))
	{
		Maintenance maintenance;

		maintenance_begin(partitions_parent(schema), &maintenance);
		partitions_drop_expired(schema, &dropped, &keys);
		maintenance_end(&maintenance);
		stats_count(IDEM_COUNT_PARTITIONS_DROPPED, dropped);
		stats_count(IDEM_COUNT_KEYS_REMOVED, keys);
	}
	SPI_finish();
	values[0] = Int32GetDatum(dropped);
	values[1] = Int64GetDatum(keys);
	desc = BlessTupleDesc(desc);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
