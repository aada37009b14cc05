/*
 * citus.c: the key store on a Citus cluster; see citus.h.
 *
 * Citus's catalogs (pg_dist_partition, pg_dist_shard, pg_dist_placement, pg_dist_local_group) and its SQL
 * function get_shard_id_for_distribution_column are used through SPI, and its lock_shard_metadata through
 * the catalog, only after the citus extension has been found, so nothing here links against Citus.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "citus.h"
#include "guc.h"
#include "pg_compat.h"
#include "spi_plan.h"

/* What Citus makes of the key table on this node. */
typedef enum KeyLayout
{
	LAYOUT_PLAIN,				/* no Citus, or Citus with no distributed table at all */
	LAYOUT_DISTRIBUTED,			/* hash-distributed (by scope, through idem_citus_distribute) */
	LAYOUT_NOT_HASH,			/* a reference table, or added to Citus's metadata some other way */
	LAYOUT_LOCAL_BESIDE_DISTRIBUTED	/* local here while business tables are distributed */
} KeyLayout;

/*
 * The layout, remembered per backend. Distributing a table, undistributing it and every change to
 * Citus's table metadata send relcache invalidations, and so do CREATE and DROP EXTENSION citus: any
 * invalidation forgets the layout (recomputing it is one query).
 */
static struct
{
	bool		valid;
	Oid			table;
	KeyLayout	layout;
} known;

/* How many times forget_layout ran: key_layout remembers what it read only if none ran meanwhile. */
static uint64 layout_forgotten = 0;

static SPIPlanPtr shard_is_local_plan = NULL;
static SPIPlanPtr shard_of_scope_plan = NULL;

/*
 * The shard of each scope met on the direct path, and this node's group: reading them is most of the cost of
 * a direct call otherwise. A shard keeps its id when it moves (the placement, read on every transaction, is
 * what changes); a split or any other change to the table's shards sends a relcache invalidation, which
 * marks all of it stale, as does any other (cleared at the next use, not inside the callback). Scopes as long
 * as the key or longer are not remembered; the unscoped scope '' is.
 */
#define SCOPE_SHARD_KEY 128
#define SCOPE_SHARD_ENTRIES 10000
typedef struct ScopeShard
{
	char		scope[SCOPE_SHARD_KEY];
	int64		shard;
} ScopeShard;

static HTAB *scope_shards = NULL;
static bool scope_shards_stale = false;
static int32 local_group = -1;	/* -1: not read yet */

/*
 * The scope found local in this transaction: its claim, lookups and completion ask once. A placement cannot
 * move away under a transaction that has read its shard (a move waits for it), and the transaction's end
 * forgets it. With shard set, this transaction also holds the shard's metadata lock (see lock_local_shard),
 * so the shard stays here until it ends; a subtransaction's abort releases a lock taken in it, so it forgets
 * the scope too.
 */
static struct
{
	bool		valid;
	Oid			table;
	char	   *scope;			/* in TopTransactionContext */
	Oid			shard;			/* the locked local shard relation, or InvalidOid */
} local_scope;

static void
forget_local_scope(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE ||
		event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT)
		local_scope.valid = false;
}

static void
forget_local_scope_in_subxact(SubXactEvent event, SubTransactionId mySubid, SubTransactionId parentSubid,
							  void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		local_scope.valid = false;
}

static void
forget_layout(Datum arg, Oid relid)
{
	known.valid = false;
	layout_forgotten++;
	scope_shards_stale = true;
}

static KeyLayout
key_layout(Oid table)
{
	static bool callback_registered = false;
	Oid			types[1] = {OIDOID};
	Datum		values[1];
	bool		isnull;
	char	   *method;
	bool		distributed_tables;
	int			rc;
	uint64		forgotten = layout_forgotten;
	KeyLayout	layout = LAYOUT_PLAIN;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(forget_layout, (Datum) 0);
		callback_registered = true;
	}
	if (!OidIsValid(table))
		elog(ERROR, "idempotency: no key table to find the Citus layout of");
	if (known.valid && known.table == table)
		return known.layout;

	if (OidIsValid(get_extension_oid("citus", true)))
	{
		values[0] = ObjectIdGetDatum(table);
		SPI_connect();
		rc = SPI_execute_with_args(
			"SELECT (SELECT p.partmethod::pg_catalog.text FROM pg_catalog.pg_dist_partition p"
			"        WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1),"
			"       EXISTS (SELECT FROM pg_catalog.pg_dist_partition p"
			"               WHERE p.logicalrelid OPERATOR(pg_catalog.<>) $1"
			"                 AND p.partmethod OPERATOR(pg_catalog.=) 'h')",
			1, types, values, NULL, true, 1);
		if (rc != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "idempotency: reading Citus's pg_dist_partition failed: %s",
				 SPI_result_code_string(rc));
		method = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		distributed_tables = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
														&isnull));
		if (method != NULL)
			layout = strcmp(method, "h") == 0 ? LAYOUT_DISTRIBUTED : LAYOUT_NOT_HASH;
		else if (distributed_tables)
			layout = LAYOUT_LOCAL_BESIDE_DISTRIBUTED;
		SPI_finish();
	}
	/*
	 * An invalidation taken in while reading (by the locks of the query) may be for a change the query's
	 * snapshot did not see: then the layout read serves this call only, and the next call reads it again.
	 */
	if (layout_forgotten == forgotten)
	{
		known.table = table;
		known.layout = layout;
		known.valid = true;
	}
	return layout;
}

/* Where the shard of one scope is placed, for the error of a call that ran elsewhere. */
static char *
shard_placements(Oid table, text *scope, int64 *shard)
{
	Oid			types[2] = {REGCLASSOID, TEXTOID};
	Datum		values[2] = {ObjectIdGetDatum(table), PointerGetDatum(scope)};
	bool		isnull;
	char	   *nodes;
	int			rc;
	MemoryContext caller = CurrentMemoryContext;

	SPI_connect();
	rc = SPI_execute_with_args(
		"SELECT s.id, (SELECT pg_catalog.string_agg(n.nodename OPERATOR(pg_catalog.||) ':'"
		"                  OPERATOR(pg_catalog.||) n.nodeport::pg_catalog.text, ', ')"
		"              FROM pg_catalog.pg_dist_placement p"
		"              JOIN pg_catalog.pg_dist_node n ON n.groupid OPERATOR(pg_catalog.=) p.groupid"
		"              WHERE p.shardid OPERATOR(pg_catalog.=) s.id)"
		" FROM (SELECT pg_catalog.get_shard_id_for_distribution_column($1, $2) AS id) s",
		2, types, values, NULL, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idempotency: reading Citus's shard placements failed: %s", SPI_result_code_string(rc));
	*shard = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	nodes = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	nodes = MemoryContextStrdup(caller, nodes ? nodes : "no node");
	SPI_finish();
	return nodes;
}

static bool
local_scope_known(Oid table, text *scope)
{
	static bool callback_registered = false;

	if (!callback_registered)
	{
		RegisterXactCallback(forget_local_scope, NULL);
		RegisterSubXactCallback(forget_local_scope_in_subxact, NULL);
		callback_registered = true;
	}
	return local_scope.valid && local_scope.table == table &&
		strlen(local_scope.scope) == VARSIZE_ANY_EXHDR(scope) &&
		memcmp(local_scope.scope, VARDATA_ANY(scope), VARSIZE_ANY_EXHDR(scope)) == 0;
}

/*
 * Whether this node holds a placement of the scope's shard. Citus keeps its placement metadata on every
 * node (metadata sync), so a worker answers as well as the coordinator, whose own group holds no shard of
 * the key table unless it was added as a node with shards.
 */
static bool
shard_is_local(Oid table, text *scope)
{
	Oid			types[2] = {REGCLASSOID, TEXTOID};
	Datum		values[2] = {ObjectIdGetDatum(table), PointerGetDatum(scope)};
	bool		isnull;
	bool		local;
	int			rc;

	if (local_scope_known(table, scope))
		return true;

	SPI_connect();
	if (shard_is_local_plan == NULL)
		shard_is_local_plan = spi_prepare_kept(
			"SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_placement p, pg_catalog.pg_dist_local_group g"
			" WHERE p.shardid OPERATOR(pg_catalog.=) pg_catalog.get_shard_id_for_distribution_column($1, $2)"
			"   AND p.groupid OPERATOR(pg_catalog.=) g.groupid)", 2, types, 0);
	rc = SPI_execute_plan(shard_is_local_plan, values, NULL, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idempotency: reading Citus's shard placements failed: %s", SPI_result_code_string(rc));
	local = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	if (local)
	{
		local_scope.scope = MemoryContextStrdup(TopTransactionContext, text_to_cstring(scope));
		local_scope.table = table;
		local_scope.shard = InvalidOid;
		local_scope.valid = true;
	}
	return local;
}

/* The call runs on a node without the scope's shard: not delegated, or the shard has just moved away. */
static void
report_not_local(Oid table, text *scope)
{
	int64		shard;
	char	   *nodes = shard_placements(table, scope, &shard);

	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("idempotency: the key's shard is not on this node; the call was not delegated to it"),
			 errdetail("Scope \"%s\" lives in shard %lld of idempotency_keys, on %s. A claim holds its key "
					   "only on the node that stores its row.",
					   text_to_cstring(scope), (long long) shard, nodes),
			 errhint("Call it so that Citus delegates it: as a statement of its own "
					 "(SELECT * FROM idem_claim(...)) with the scope a constant or a bound parameter, or "
					 "from a procedure distributed by its scope argument with force_delegation. A call made "
					 "while its shard moved away: retry it, Citus delegates it to the new node.")));
}

/*
 * The direct path on the local shard. A Citus router modification locks its shard's metadata (ShareLock on
 * the tag of the shard's co-location group and index, AcquireMetadataLocks in Citus's executor) and only then
 * reads where the shard is placed; a shard move blocks writes by taking that lock in ExclusiveLock on every
 * node with metadata (BlockWritesToShardList), from before its last copy until its metadata commits. This
 * takes the same lock, then reads the placement with a snapshot taken after it: either the move waits for
 * this transaction, or it has committed and the placement read shows the shard elsewhere.
 */

/* The scope's shard, remembered per scope; also reads this node's group. */
static int64
shard_of_scope(Oid table, text *scope)
{
	Oid			types[2] = {REGCLASSOID, TEXTOID};
	Datum		values[2] = {ObjectIdGetDatum(table), PointerGetDatum(scope)};
	int			length = VARSIZE_ANY_EXHDR(scope);
	bool		remembered = length < SCOPE_SHARD_KEY && memchr(VARDATA_ANY(scope), '\0', length) == NULL;
	char		name[SCOPE_SHARD_KEY] = {0};
	bool		isnull;
	bool		found;
	int			rc;
	int64		shard;
	ScopeShard *entry;

	if (scope_shards == NULL || scope_shards_stale ||
		hash_get_num_entries(scope_shards) >= SCOPE_SHARD_ENTRIES)
	{
		HASHCTL		ctl;

		if (scope_shards != NULL)
			hash_destroy(scope_shards);
		ctl.keysize = SCOPE_SHARD_KEY;
		ctl.entrysize = sizeof(ScopeShard);
		scope_shards = hash_create("idempotency scope shards", 256, &ctl, HASH_ELEM | HASH_STRINGS);
		scope_shards_stale = false;
	}
	if (remembered)
	{
		memcpy(name, VARDATA_ANY(scope), length);
		entry = hash_search(scope_shards, name, HASH_FIND, &found);
		if (entry != NULL && local_group >= 0)
			return entry->shard;
	}

	SPI_connect();
	if (shard_of_scope_plan == NULL)
		shard_of_scope_plan = spi_prepare_kept(
			"SELECT pg_catalog.get_shard_id_for_distribution_column($1, $2),"
			"       (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g)",
			2, types, 0);
	rc = SPI_execute_plan(shard_of_scope_plan, values, NULL, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idempotency: reading Citus's shard of a scope failed: %s", SPI_result_code_string(rc));
	shard = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	local_group = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	if (isnull)
		local_group = -1;
	SPI_finish();
	/* The invalidations SPI took in may have marked the cache stale: then it is rebuilt on the next call. */
	if (remembered && !scope_shards_stale)
	{
		entry = hash_search(scope_shards, name, HASH_ENTER, &found);
		entry->shard = shard;
	}
	return shard;
}

/*
 * Whether this node's group holds a placement of the shard, read from pg_dist_placement by its shardid
 * index with the latest snapshot: taken after the lock, it shows a move that committed before it.
 */
static bool
placement_is_local(int64 shard)
{
	Oid			placements = get_relname_relid("pg_dist_placement", PG_CATALOG_NAMESPACE);
	Oid			by_shard = get_relname_relid("pg_dist_placement_shardid_index", PG_CATALOG_NAMESPACE);
	Relation	relation;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	AttrNumber	shardid_column;
	AttrNumber	groupid_column;
	Snapshot	snapshot;
	bool		local = false;

	if (!OidIsValid(placements) || !OidIsValid(by_shard) || local_group < 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency: Citus's pg_dist_placement or this node's group is missing"),
				 errhint("Set idempotency.citus_direct = off to send the key store's statements through Citus.")));
	relation = table_open(placements, AccessShareLock);
	shardid_column = get_attnum(placements, "shardid");
	groupid_column = get_attnum(placements, "groupid");
	if (shardid_column == InvalidAttrNumber || groupid_column == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idempotency: Citus's pg_dist_placement has no shardid or groupid column"),
				 errhint("Set idempotency.citus_direct = off to send the key store's statements through Citus.")));
	/* In heap column numbers: systable_beginscan maps them to the index. */
	ScanKeyInit(&key, shardid_column, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(shard));
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	scan = systable_beginscan(relation, by_shard, true, snapshot, 1, &key);
	while (!local && HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		group = heap_getattr(tuple, groupid_column, RelationGetDescr(relation), &isnull);

		local = !isnull && DatumGetInt32(group) == local_group;
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(relation, AccessShareLock);
	return local;
}

/*
 * The shard's metadata lock in ShareLock, taken by Citus's own lock_shard_metadata(lock_mode, shard_id[]),
 * which computes the tag (class, co-location group, shard index) as Citus's router writes do: nothing of
 * Citus's private lock layout is copied here. lock_shard_metadata requires the shard's owner, so it runs as
 * the key table's owner in a security-restricted operation; it takes the one lock a write of the caller's
 * would take anyway, and runs no user code. A Citus without it cannot take the direct path: the ERROR says
 * to turn it off.
 */
static void
lock_shard_metadata(Oid table, int64 shard)
{
	Oid			argtypes[2] = {INT4OID, INT8ARRAYOID};
	Oid			function = GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid,
										   CStringGetDatum("lock_shard_metadata"),
										   PointerGetDatum(buildoidvector(argtypes, 2)),
										   ObjectIdGetDatum(PG_CATALOG_NAMESPACE));
	Datum		shard_datum = Int64GetDatum(shard);
	ArrayType  *shards;
	HeapTuple	tuple;
	Oid			owner;
	Oid			saved_user;
	int			saved_context;

	if (!OidIsValid(function))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idempotency: this Citus has no pg_catalog.lock_shard_metadata(integer, bigint[])"),
				 errdetail("The direct path takes the shard metadata lock a Citus write takes through it."),
				 errhint("Set idempotency.citus_direct = off to send the key store's statements through Citus.")));
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(table));
	if (!HeapTupleIsValid(tuple))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("idempotency: relation with OID %u was dropped during the call", table)));
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	shards = construct_array(&shard_datum, 1, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);

	GetUserIdAndSecContext(&saved_user, &saved_context);
	SetUserIdAndSecContext(owner, saved_context | SECURITY_RESTRICTED_OPERATION);
	(void) OidFunctionCall2(function, Int32GetDatum(ShareLock), PointerGetDatum(shards));
	SetUserIdAndSecContext(saved_user, saved_context);
}

static Oid
lock_local_shard(Oid table, text *scope)
{
	int64		shard;
	Oid			relation;

	if (local_scope_known(table, scope) && OidIsValid(local_scope.shard))
		return local_scope.shard;

	shard = shard_of_scope(table, scope);
	lock_shard_metadata(table, shard);
	if (!placement_is_local(shard))
	{
		/* The shard moved away, or the remembered one is gone (a split): the retry reads it again. */
		scope_shards_stale = true;
		report_not_local(table, scope);
	}
	relation = get_relname_relid(psprintf("%s_%lld", get_rel_name(table), (long long) shard),
								 get_rel_namespace(table));
	local_scope.scope = MemoryContextStrdup(TopTransactionContext, text_to_cstring(scope));
	local_scope.table = table;
	local_scope.shard = relation;
	local_scope.valid = OidIsValid(relation);
	return relation;
}

/*
 * 1.4: tombstones are not supported on a distributed key table (the tombstones table is a plain table on each
 * node, not co-located with the keys' shards, and the sweep of a worker's shards does not write them): with
 * idempotency.tombstone_ttl above 0 every call of the key store and every sweep refuses, so no claim answers as
 * if tombstones were kept when they are not.
 */
static void
refuse_tombstones(void)
{
	if (idem_tombstone_ttl_seconds <= 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("idempotency: tombstones are not supported on a Citus-distributed key table"),
			 errdetail("idempotency.tombstone_ttl is %d s in this session; Citus distributes idempotency_keys, and "
					   "idempotency_tombstones is not kept in the keys' shards.", idem_tombstone_ttl_seconds),
			 errhint("Leave idempotency.tombstone_ttl at 0 in a Citus cluster: "
					 "ALTER DATABASE ... RESET idempotency.tombstone_ttl.")));
}

bool
citus_keys_distributed_here(void)
{
	int			rc;
	bool		distributed,
				isnull;

	if (!OidIsValid(get_extension_oid("citus", true)) || !OidIsValid(get_extension_oid("idempotency", true)))
		return false;
	SPI_connect();
	rc = SPI_execute("SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p"
					 " JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.logicalrelid"
					 " JOIN pg_catalog.pg_extension e ON e.extnamespace OPERATOR(pg_catalog.=) c.relnamespace"
					 " WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'"
					 "   AND c.relname OPERATOR(pg_catalog.=) 'idempotency_keys'"
					 "   AND p.partmethod OPERATOR(pg_catalog.=) 'h')", true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idempotency: reading Citus's pg_dist_partition failed: %s", SPI_result_code_string(rc));
	distributed = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return distributed;
}

Oid
citus_key_relation(Oid table, bool partitioned, text *scope, bool direct)
{
	switch (key_layout(table))
	{
		case LAYOUT_PLAIN:
			return table;
		case LAYOUT_LOCAL_BESIDE_DISTRIBUTED:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idempotency: idempotency_keys is local on this node while Citus distributes other tables"),
					 errdetail("Citus commits a worker's part of a transaction before this node commits its own: "
							   "a local commit that fails after that would keep the business write and lose the key."),
					 errhint("Run SELECT idem_citus_distribute('<a table distributed by tenant>') on the coordinator "
							 "to keep each key in the shard of its tenant's data.")));
			break;
		case LAYOUT_NOT_HASH:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idempotency: idempotency_keys is in Citus's metadata but not distributed by scope"),
					 errdetail("A reference table or a Citus local table has no single node where a key is claimed."),
					 errhint("Only the layout made by idem_citus_distribute(colocate_with) is supported.")));
			break;
		case LAYOUT_DISTRIBUTED:
			refuse_tombstones();
			break;
	}
	if (partitioned)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idempotency: partitioned storage is not supported on a Citus-distributed key table"),
				 errhint("Switch back with SELECT idem_set_storage('table') on the coordinator.")));
	/*
	 * The direct path only where the statements would read and write the shard with no more checks than the
	 * direct path makes on it: no row level security on the distributed table either.
	 */
	if (direct && idem_citus_direct && check_enable_rls(table, InvalidOid, true) != RLS_ENABLED)
		return lock_local_shard(table, scope);
	if (!shard_is_local(table, scope))
		report_not_local(table, scope);
	return InvalidOid;
}

List *
citus_sweep_relations(Oid table)
{
	Oid			types[1] = {OIDOID};
	Datum		values[1] = {ObjectIdGetDatum(table)};
	List	   *shards = NIL;
	int			rc;

	switch (key_layout(table))
	{
		case LAYOUT_PLAIN:
		case LAYOUT_LOCAL_BESIDE_DISTRIBUTED:
			return list_make1_oid(table);
		case LAYOUT_NOT_HASH:
			/* Unsupported (claims refuse it): a reference table's copies must change together. */
			return NIL;
		case LAYOUT_DISTRIBUTED:
			refuse_tombstones();	/* on the coordinator too, which has no shard: the same setting everywhere */
			break;
	}

	/* The local shards in shard order; the coordinator has none. */
	rc = SPI_execute_with_args(
		"SELECT s.shardid FROM pg_catalog.pg_dist_shard s"
		" JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid"
		" JOIN pg_catalog.pg_dist_local_group g ON g.groupid OPERATOR(pg_catalog.=) p.groupid"
		" WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1 ORDER BY s.shardid",
		1, types, values, NULL, true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "idempotency: listing the local shards failed: %s", SPI_result_code_string(rc));
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		int64		shard = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
		Oid			relation = get_relname_relid(psprintf("%s_%lld", get_rel_name(table), (long long) shard),
												 get_rel_namespace(table));

		/* A shard moved away meanwhile is left out: the next sweep lists the shards again. */
		if (OidIsValid(relation))
			shards = lappend_oid(shards, relation);
	}
	/* Citus refuses changes made to a shard by name: maintenance_begin allows them, in its own settings. */
	return shards;
}
