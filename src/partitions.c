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
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "executor/tuptable.h"
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
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "utils/wait_event.h"
#include "utils/builtins.h"
#include "utils/elog.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "catalog/pg_proc.h"
#include "commands/extension.h"
#include "utils/acl.h"
#include "guc.h"
#include "pg_compat.h"
#include "key_store.h"
#include "maintenance.h"
#include "partitions.h"
#include "subtransaction.h"
#include "tombstones.h"
#include "stats.h"

Oid
partitions_parent(Oid schema)
{
	Oid			relid = maintenance_member_relation(schema, "idempotency_keys_partitioned");

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("idempotency: table idempotency_keys_partitioned is missing from the extension")));
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

/* Runs fn in a subtransaction; on an ERROR, returns its SQLSTATE and sets *message (0 when it ran). */
static int
run_partition_step(SubtransactionStep fn, void *arg, char **message)
{
	ErrorData  *error = run_in_subtransaction(fn, arg);
	int			sqlstate;

	if (error == NULL)
		return 0;
	sqlstate = error->sqlerrcode;
	*message = pstrdup(error->message);
	FreeErrorData(error);
	return sqlstate;
}

/*
 * Taking a partition step's locks under continuous claims. A step asks for its lock within
 * idempotency.partition_lock_timeout; claims that arrive while it waits queue behind its request, so each try
 * delays them by that much at most. A try that times out is rolled back (the claims behind it go on) and made
 * again after a short pause, up to PARTITION_LOCK_TRIES times within the sweep. PostgreSQL's lock queue is fair:
 * once the request is queued, it is granted as soon as the claims already holding the table end, so short claims
 * never starve it; only a transaction that holds a claim open past the timeout at every try sends the step to
 * the next sweep.
 */
#define PARTITION_LOCK_TRIES 10
#define PARTITION_LOCK_PAUSE_MS 20

/* Waits try * PARTITION_LOCK_PAUSE_MS before the next try, answering interrupts (a worker's SIGTERM). */
static void
pause_before_try(int try)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, (long) try * PARTITION_LOCK_PAUSE_MS,
					 PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}

/* idempotency.partition_lock_timeout as this (sub)transaction's lock_timeout. */
static void
set_partition_lock_timeout(void)
{
	char		timeout[32];

	snprintf(timeout, sizeof(timeout), "%dms", idem_partition_lock_timeout_ms);
	(void) set_config_option("lock_timeout", timeout, PGC_SUSET, PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
}

/*
 * Runs fn in a subtransaction, again after a pause while it fails for want of a lock (55P03), at most
 * PARTITION_LOCK_TRIES times; returns the last SQLSTATE (0 when it ran) and counts the tries.
 */
static int
run_partition_step_retrying(SubtransactionStep fn, void *arg, char **message, int *tries)
{
	int			sqlstate = 0;

	for (*tries = 1;; (*tries)++)
	{
		sqlstate = run_partition_step(fn, arg, message);
		if (sqlstate != ERRCODE_LOCK_NOT_AVAILABLE || *tries >= PARTITION_LOCK_TRIES)
			return sqlstate;
		pause_before_try(*tries);
	}
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
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("idempotency: function idem_create_partition(timestamptz, timestamptz) is missing from the extension")));
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
		int			tries;

		step.upper = step.lower + width;
		sqlstate = run_partition_step_retrying(create_step, &step, &message, &tries);
		if (sqlstate == ERRCODE_LOCK_NOT_AVAILABLE)
		{
			/* Claims in flight held the default partition at every try: try again at the next sweep. */
			ereport(LOG, (errmsg("idempotency: the default partition was busy at each of %d tries; making partitions at the next sweep",
								 tries)));
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
	bool		counted;		/* keys is known */
	bool		gone;			/* dropped by someone else meanwhile */
	int64		keys;
} DropStep;

/* The partition's qualified name of now, once it is locked; NULL when it is no longer a partition of parent. */
static char *
locked_partition_name(DropStep *step)
{
	char	   *name = get_rel_name(step->partition);

	if (name == NULL || !get_rel_relispartition(step->partition) ||
		get_partition_parent(step->partition, true) != step->parent)
		return NULL;
	return quote_qualified_identifier(get_namespace_name(get_rel_namespace(step->partition)), name);
}

/*
 * Counts the partition's rows, for idem_stats and the caller's answer, before any lock on the parent: a heap scan
 * under ACCESS SHARE on the partition alone, which no claim waits for, released when the scan ends (a lock kept
 * would hold up an idem_set_storage that has the parent and drops this partition). Its rows expired before the
 * transaction began and no claim writes an expired row, so the count stays true until the drop.
 */
static void
count_step(void *arg)
{
	DropStep   *step = arg;
	Relation	relation;
	TupleTableSlot *slot;
	TableScanDesc scan;
	int64		keys = 0;

	set_partition_lock_timeout();
	relation = try_relation_open(step->partition, AccessShareLock);
	if (relation == NULL || locked_partition_name(step) == NULL ||
		relation->rd_rel->relkind != RELKIND_RELATION)
	{
		if (relation != NULL)
			relation_close(relation, AccessShareLock);
		step->gone = true;
		return;
	}
	slot = table_slot_create(relation, NULL);
	scan = table_beginscan(relation, GetActiveSnapshot(), 0, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		if (++keys % 65536 == 0)
			CHECK_FOR_INTERRUPTS();
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	table_close(relation, AccessShareLock);
	step->keys = keys;
	step->counted = true;
}

/*
 * Locks in DROP TABLE's order (the parent, then the partition) within idempotency.partition_lock_timeout and
 * drops the partition by its name of now, in the extension's schema. Nothing but the drop itself runs under the
 * parent's lock, which every claim in partitioned storage needs.
 */
static void
drop_step(void *arg)
{
	DropStep   *step = arg;
	char	   *name;
	int			rc;

	set_partition_lock_timeout();
	LockRelationOid(step->parent, AccessExclusiveLock);
	LockRelationOid(step->partition, AccessExclusiveLock);
	name = locked_partition_name(step);
	if (name == NULL)
	{
		step->gone = true;
		return;
	}
	rc = SPI_execute(psprintf("DROP TABLE %s", name), false, 0);
	if (rc != SPI_OK_UTILITY)
		elog(ERROR, "idempotency: dropping %s failed: %s", name, SPI_result_code_string(rc));
}

/* 1.4: the partition's expired completed keys become tombstones, before drop_step takes the parent's lock. */
static void
bury_step(void *arg)
{
	DropStep   *step = arg;

	tombstones_bury_partition(step->partition, GetCurrentTransactionStartTimestamp() -
							  (TimestampTz) idem_tombstone_ttl_seconds * USECS_PER_SEC);
}

/*
 * Counts a partition's keys (count_step) and, with tombstones on, writes its tombstones (bury_step); false,
 * logged, when it could not: the partition is not dropped then.
 */
static bool
count_partition(DropStep *step)
{
	char	   *message = NULL;
	int			tries;
	int			sqlstate = run_partition_step_retrying(count_step, step, &message, &tries);
	char	   *name = get_rel_name(step->partition);

	if (sqlstate == 0 && step->counted && !step->gone && idem_tombstone_ttl_seconds > 0)
	{
		sqlstate = run_partition_step(bury_step, step, &message);
		if (sqlstate != 0)
		{
			step->counted = false;
			ereport(LOG, (errmsg("idempotency: could not write the tombstones of partition %s: %s (SQLSTATE %s); dropping it at the next sweep",
								 name ? name : "?", message, unpack_sql_state(sqlstate))));
			return false;
		}
	}

	if (sqlstate == ERRCODE_LOCK_NOT_AVAILABLE)
		ereport(LOG, (errmsg("idempotency: partition %s was locked at each of %d tries; dropping it at the next sweep",
							 name ? name : "?", tries)));
	else if (sqlstate != 0)
		ereport(LOG, (errmsg("idempotency: could not count the keys of partition %s: %s (SQLSTATE %s); dropping it at the next sweep",
							 name ? name : "?", message, unpack_sql_state(sqlstate))));
	return sqlstate == 0;
}

void
partitions_drop_expired(Oid schema, int limit, int *partitions_dropped, int64 *keys_removed, bool *more)
{
	Oid			parent = partitions_parent(schema);
	List	   *partitions = partitions_read(parent);
	List	   *expired = NIL;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz newest_upper = PG_INT64_MIN;
	ListCell   *cell;

	*partitions_dropped = 0;
	*keys_removed = 0;
	*more = false;
	foreach(cell, partitions)
		newest_upper = Max(newest_upper, ((RangePartition *) lfirst(cell))->upper);
	/* The newest partition stays even when expired: it carries the width for the next ones. */
	foreach(cell, partitions)
	{
		RangePartition *partition = lfirst(cell);
		DropStep   *step;

		if (partition->upper > now || partition->upper >= newest_upper)
			continue;
		step = palloc0(sizeof(DropStep));
		step->parent = parent;
		step->partition = partition->relid;
		expired = lappend(expired, step);
	}

	/*
	 * Every count before the first drop: a drop's locks are the transaction's until it ends, and the parent's
	 * holds every claim. Where a transaction drops one partition (the worker), the one to drop is counted just
	 * before it; a drop that fails releases its locks with its subtransaction.
	 */
	if (limit <= 0)
		foreach(cell, expired)
			(void) count_partition(lfirst(cell));
	foreach(cell, expired)
	{
		DropStep   *step = lfirst(cell);
		char	   *message = NULL;
		char	   *name;
		int			sqlstate;
		int			tries;

		if (limit > 0 && *partitions_dropped >= limit)
		{
			*more = true;
			break;
		}
		if (limit > 0 && !step->counted && !step->gone)
			(void) count_partition(step);
		if (!step->counted || step->gone)
			continue;
		name = get_rel_name(step->partition);
		sqlstate = run_partition_step_retrying(drop_step, step, &message, &tries);
		if (sqlstate == ERRCODE_LOCK_NOT_AVAILABLE)
			ereport(LOG, (errmsg("idempotency: partition %s was busy at each of %d tries; dropping it at the next sweep",
								 name ? name : "?", tries)));
		else if (sqlstate != 0)
			ereport(LOG, (errmsg("idempotency: could not drop partition %s: %s (SQLSTATE %s); trying again at the next sweep",
								 name ? name : "?", message, unpack_sql_state(sqlstate))));
		else if (!step->gone)
		{
			if (tries > 1)
				ereport(DEBUG1, (errmsg("idempotency: dropped partition %s at try %d", name ? name : "?", tries)));
			(*partitions_dropped)++;
			*keys_removed += step->keys;
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
	bool		more;
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
		partitions_drop_expired(schema, 0, &dropped, &keys, &more);
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

PG_FUNCTION_INFO_V1(idem_set_storage);

static char *
interval_text(Interval *value)
{
	return DatumGetCString(DirectFunctionCall1(interval_out, IntervalPGetDatum(value)));
}

/* Runs one statement through SPI; ERROR unless it answered as expected. */
static void
set_storage_execute(const char *sql, int expected)
{
	int			rc = SPI_execute(sql, false, 0);

	if (rc != expected)
		elog(ERROR, "idem_set_storage: %s failed: %s", sql, SPI_result_code_string(rc));
}

/*
 * idem_set_storage(mode text, partition_interval interval DEFAULT '1 day'): switches the storage mode, moving every
 * live key (see extension/functions.sql). In C (1.3), so that it calls no function by name: the partitions are read
 * as values (partitions_read) and idem_create_partition(timestamptz, timestamptz) is called by OID. Its SET clause
 * pins DateStyle and TimeZone (UTC's date arithmetic); its messages print intervals under the caller's
 * IntervalStyle.
 */
Datum
idem_set_storage(PG_FUNCTION_ARGS)
{
	static const Oid argtypes[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
	Oid			schema = get_func_namespace(fcinfo->flinfo->fn_oid);
	const char *ttl_setting = GetConfigOptionByName("idempotency.ttl", NULL, true);
	Interval   *ttl;
	Interval   *width;
	Interval	minute = {0};
	char	   *mode;
	bool		partitioned;
	const char *s;
	Oid			parent;
	List	   *partitions;
	ListCell   *cell;
	uint64		moved = 0;
	bool		already = false;

	if (ttl_setting == NULL)
		ttl_setting = "1d";
	ttl = DatumGetIntervalP(DirectFunctionCall3(interval_in, CStringGetDatum(ttl_setting),
												ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1)));
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("idem_set_storage: mode and partition_interval must not be NULL")));
	mode = text_to_cstring(PG_GETARG_TEXT_PP(0));
	width = PG_GETARG_INTERVAL_P(1);
	if (strcmp(mode, "table") != 0 && strcmp(mode, "partitioned") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem_set_storage: unknown storage mode \"%s\"", mode),
				 errhint("Use 'table' or 'partitioned'.")));
	partitioned = strcmp(mode, "partitioned") == 0;
	minute.time = USECS_PER_MINUTE;
	if (DatumGetBool(DirectFunctionCall2(interval_lt, IntervalPGetDatum(width), IntervalPGetDatum(&minute))) ||
		width->month != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem_set_storage: partition_interval must be at least 1 minute and have no months or years")));

	/*
	 * The move reads with a snapshot taken after the locks are granted; a transaction snapshot taken before them
	 * would miss keys completed while waiting, and TRUNCATE would lose them.
	 */
	if (XactIsoLevel != XACT_READ_COMMITTED)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("idem_set_storage must run in a READ COMMITTED transaction")));
	/* Every claim reads every partition (the key does not tell which): keep them few. */
	if (partitioned)
	{
		Datum		span = DirectFunctionCall2(interval_pl, IntervalPGetDatum(ttl),
											   DirectFunctionCall2(interval_mul, IntervalPGetDatum(width),
																   Float8GetDatum(2.0)));
		Datum		each = DirectFunctionCall2(interval_div, span, Float8GetDatum(64.0));

		if (DatumGetBool(DirectFunctionCall2(interval_gt, each, IntervalPGetDatum(width))))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("idem_set_storage: partition_interval %s is too small for idempotency.ttl %s",
							interval_text(width), ttl_setting),
					 errhint("At most 64 partitions may cover idempotency.ttl plus two partitions.")));
	}

	s = quote_identifier(get_namespace_name(schema));
	SPI_connect();
	/* A distributed key table (idem_citus_distribute) has one layout: hash shards by scope. */
	if (partitioned && OidIsValid(get_extension_oid("citus", true)))
	{
		Datum		keys = CStringGetTextDatum(psprintf("%s.idempotency_keys", s));
		Oid			keys_type = TEXTOID;
		bool		isnull;
		int			rc;

		rc = SPI_execute_with_args("SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p"
								   " WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1::pg_catalog.regclass)",
								   1, &keys_type, &keys, NULL, false, 1);
		if (rc != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "idem_set_storage: reading Citus's metadata failed: %s", SPI_result_code_string(rc));
		if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("idem_set_storage: partitioned storage is not supported for keys distributed by Citus"),
					 errhint("Citus shards idempotency_keys by scope; expired keys are swept shard by shard.")));
	}

	set_storage_execute(psprintf("LOCK TABLE %s.idempotency_keys IN ACCESS EXCLUSIVE MODE", s), SPI_OK_UTILITY);
	set_storage_execute(psprintf("LOCK TABLE %s.idempotency_keys_partitioned IN ACCESS EXCLUSIVE MODE", s),
						SPI_OK_UTILITY);
	parent = partitions_parent(schema);
	partitions = partitions_read(parent);

	/* Tenants separated by row level security on one table must stay separated on the other. */
	{
		Datum		mode_datum = CStringGetTextDatum(mode);
		Oid			mode_type = TEXTOID;
		int			rc;

		rc = SPI_execute_with_args(
			"SELECT FROM pg_catalog.pg_class source, pg_catalog.pg_class target"
			" WHERE source.relnamespace OPERATOR(pg_catalog.=) target.relnamespace"
			"   AND source.relnamespace OPERATOR(pg_catalog.=) (SELECT e.extnamespace FROM pg_catalog.pg_extension e"
			"                                    WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')"
			"   AND source.relname OPERATOR(pg_catalog.=) (CASE WHEN $1 OPERATOR(pg_catalog.=) 'partitioned'"
			"           THEN 'idempotency_keys' ELSE 'idempotency_keys_partitioned' END)"
			"   AND target.relname OPERATOR(pg_catalog.=) (CASE WHEN $1 OPERATOR(pg_catalog.=) 'partitioned'"
			"           THEN 'idempotency_keys_partitioned' ELSE 'idempotency_keys' END)"
			"   AND ((source.relrowsecurity AND NOT target.relrowsecurity)"
			"        OR (source.relforcerowsecurity AND NOT target.relforcerowsecurity)"
			"        OR (SELECT pg_catalog.count(*) FROM pg_catalog.pg_policy p"
			"            WHERE p.polrelid OPERATOR(pg_catalog.=) source.oid)"
			"           OPERATOR(pg_catalog.>)"
			"           (SELECT pg_catalog.count(*) FROM pg_catalog.pg_policy p"
			"            WHERE p.polrelid OPERATOR(pg_catalog.=) target.oid))",
			1, &mode_type, &mode_datum, NULL, false, 1);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "idem_set_storage: reading row level security failed: %s", SPI_result_code_string(rc));
		if (SPI_processed > 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idem_set_storage: row level security on the current table is missing on the other one"),
					 errhint("Enable (and force) row level security and create the same policies on both "
							 "idempotency_keys and idempotency_keys_partitioned, then switch.")));
	}

	if (partitioned)
	{
		TimestampTz now = GetCurrentTransactionStartTimestamp();
		TimestampTz lower;
		TimestampTz horizon;
		Oid			create = maintenance_member_function(schema, "idem_create_partition", 2, argtypes);
		bool		have_last = false;
		TimestampTz last_upper = 0;

		if (!OidIsValid(create))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_FUNCTION),
					 errmsg("idempotency: function idem_create_partition(timestamptz, timestamptz) is missing from the extension")));
		/* Called by OID, past fmgr's privilege check: the caller needs EXECUTE on it, as in a call by name. */
		if (idem_function_aclcheck(create, GetUserId(), ACL_EXECUTE) != ACLCHECK_OK)
			aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_FUNCTION, "idem_create_partition");
		foreach(cell, partitions)
		{
			RangePartition *partition = lfirst(cell);

			if (!have_last || partition->upper > last_upper)
				last_upper = partition->upper;
			have_last = true;
		}
		/* Partitions of the new width from the current one (or after the last existing one) onwards. */
		lower = have_last ? last_upper
			: DatumGetTimestampTz(DirectFunctionCall3(timestamptz_bin, IntervalPGetDatum(width),
													  TimestampTzGetDatum(now), TimestampTzGetDatum(0)));
		horizon = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now),
														  IntervalPGetDatum(ttl)));
		horizon = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(horizon),
														  DirectFunctionCall2(interval_mul, IntervalPGetDatum(width),
																			  Float8GetDatum(2.0))));
		for (;;)
		{
			TimestampTz upper = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
																		TimestampTzGetDatum(lower),
																		IntervalPGetDatum(width)));

			(void) OidFunctionCall2(create, TimestampTzGetDatum(lower), TimestampTzGetDatum(upper));
			lower = upper;
			if (lower >= horizon)
				break;
		}
		if (partitions != NIL)
			already = true;
		else
		{
			set_storage_execute(psprintf("INSERT INTO %s.idempotency_keys_partitioned SELECT * FROM %s.idempotency_keys"
										 " WHERE expires_at OPERATOR(pg_catalog.>) pg_catalog.now()", s, s),
								SPI_OK_INSERT);
			moved = SPI_processed;
			set_storage_execute(psprintf("TRUNCATE %s.idempotency_keys", s), SPI_OK_UTILITY);
		}
	}
	else if (partitions == NIL)
		already = true;
	else
	{
		set_storage_execute(psprintf("INSERT INTO %s.idempotency_keys SELECT * FROM %s.idempotency_keys_partitioned"
									 " WHERE expires_at OPERATOR(pg_catalog.>) pg_catalog.now()", s, s),
							SPI_OK_INSERT);
		moved = SPI_processed;
		foreach(cell, partitions_read(parent))
		{
			char	   *name = get_rel_name(((RangePartition *) lfirst(cell))->relid);

			if (name != NULL)
				set_storage_execute(psprintf("DROP TABLE %s.%s", s, quote_identifier(name)), SPI_OK_UTILITY);
		}
		set_storage_execute(psprintf("TRUNCATE %s.idempotency_keys_partitioned_default", s), SPI_OK_UTILITY);
	}
	SPI_finish();

	if (partitioned && already)
		PG_RETURN_TEXT_P(cstring_to_text(psprintf("partitioned: new partitions of %s", interval_text(width))));
	if (partitioned)
		PG_RETURN_TEXT_P(cstring_to_text(psprintf("partitioned: " UINT64_FORMAT " live keys moved, partitions of %s",
												  moved, interval_text(width))));
	if (already)
		PG_RETURN_TEXT_P(cstring_to_text("table: already"));
	PG_RETURN_TEXT_P(cstring_to_text(psprintf("table: " UINT64_FORMAT " live keys moved", moved)));
}
