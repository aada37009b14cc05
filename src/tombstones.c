/*
 * tombstones.c: the claim's probe of idempotency_tombstones (1.4, issue 41).
 *
 * A claim that finds no row of its key looks here, only while idempotency.tombstone_ttl is above 0, so keys
 * cost nothing more with tombstones off. One kept plan, in the schema of the calling function (the
 * extension's), every operator from pg_catalog; made again when that schema is another or was renamed.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "executor/tuptable.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "guc.h"
#include "key_store.h"
#include "pg_compat.h"
#include "spi_plan.h"
#include "tombstones.h"

enum
{
	PROBE_PARAM_KEY,
	PROBE_PARAM_SCOPE,
	PROBE_PARAM_SINCE,
	PROBE_PARAMS
};

/* [0] table storage: the tombstones; [1] partitioned storage: also the expired rows not dropped yet */
static SPIPlanPtr probe_plans[2] = {NULL, NULL};
static Oid	probe_namespace = InvalidOid;
static bool probe_schema_changed = false;

static void
forget_probe_schema_name(Datum arg, int cacheid, uint32 hashvalue)
{
	probe_schema_changed = true;
}

static SPIPlanPtr
plan_for(Oid namespace_oid, bool partitioned)
{
	static bool callback_registered = false;
	static Oid	types[PROBE_PARAMS] = {TEXTOID, TEXTOID, TIMESTAMPTZOID};
	const char *schema;
	char	   *sql;

	if (!callback_registered)
	{
		CacheRegisterSyscacheCallback(NAMESPACEOID, forget_probe_schema_name, (Datum) 0);
		callback_registered = true;
	}
	if (probe_namespace != namespace_oid || probe_schema_changed)
	{
		probe_schema_changed = false;
		for (int i = 0; i < 2; i++)
		{
			if (probe_plans[i] != NULL)
				SPI_freeplan(probe_plans[i]);
			probe_plans[i] = NULL;
		}
		probe_namespace = namespace_oid;
	}
	if (probe_plans[partitioned] != NULL)
		return probe_plans[partitioned];
	schema = get_namespace_name(namespace_oid);
	if (schema == NULL)
		elog(ERROR, "idempotency: the extension's schema %u is gone", namespace_oid);
	schema = quote_identifier(schema);
	sql = psprintf("SELECT expired_at FROM %s.idempotency_tombstones WHERE key OPERATOR(pg_catalog.=) $1"
				   " AND scope OPERATOR(pg_catalog.=) $2 AND expired_at OPERATOR(pg_catalog.>) $3", schema);
	/*
	 * Partitioned storage's lookup sees live rows only (it skips expired partitions): an expired completed row
	 * not yet dropped or swept is looked for here (1.3's claims never read expired partitions).
	 */
	if (partitioned)
		sql = psprintf("%s UNION ALL SELECT expires_at FROM %s.idempotency_keys_partitioned"
					   " WHERE key OPERATOR(pg_catalog.=) $1 AND scope OPERATOR(pg_catalog.=) $2"
					   " AND expires_at OPERATOR(pg_catalog.>) $3"
					   " AND expires_at OPERATOR(pg_catalog.<=) pg_catalog.transaction_timestamp()"
					   " AND http_status IS NOT NULL", sql, schema);
	probe_plans[partitioned] = spi_prepare_kept(sql, PROBE_PARAMS, types, 0);
	return probe_plans[partitioned];
}

/* The columns of idempotency_tombstones as the install script makes them, and its primary key (key, scope). */
#define TOMB_COL_EXPIRED_AT 1
#define TOMB_COL_SCOPE 2
#define TOMB_COL_KEY 3

/*
 * Table storage, where the probe behaves exactly like its SQL: one probe of the primary key, no SPI. False (and
 * nothing read) where it might not: row level security active for the caller, no SELECT on the table (the SQL
 * reports that), or a table whose columns or primary key are not the install script's.
 */
static bool
probe_direct(Oid relid, const KeyRef *ref, TimestampTz since, TimestampTz *expired_at, bool *found)
{
	Relation	table;
	Relation	index;
	Oid			index_oid;
	TupleDesc	desc;
	ScanKeyData keys[2];
	Snapshot	snapshot;
	IndexScanDesc scan;
	TupleTableSlot *slot;

	if (pg_class_aclcheck(relid, GetUserId(), ACL_SELECT) != ACLCHECK_OK ||
		check_enable_rls(relid, InvalidOid, true) == RLS_ENABLED)
		return false;
	table = table_open(relid, AccessShareLock);
	desc = RelationGetDescr(table);
	index_oid = idem_primary_key_index(table);
	if (desc->natts != 4 || TupleDescAttr(desc, TOMB_COL_EXPIRED_AT - 1)->atttypid != TIMESTAMPTZOID ||
		TupleDescAttr(desc, TOMB_COL_EXPIRED_AT - 1)->attisdropped ||
		TupleDescAttr(desc, TOMB_COL_SCOPE - 1)->atttypid != TEXTOID ||
		TupleDescAttr(desc, TOMB_COL_KEY - 1)->atttypid != TEXTOID || !OidIsValid(index_oid))
	{
		table_close(table, NoLock);
		return false;
	}
	index = index_open(index_oid, AccessShareLock);
	if (index->rd_index->indnatts != 2 || index->rd_index->indkey.values[0] != TOMB_COL_KEY ||
		index->rd_index->indkey.values[1] != TOMB_COL_SCOPE || index->rd_rel->relam != BTREE_AM_OID)
	{
		index_close(index, NoLock);
		table_close(table, NoLock);
		return false;
	}
	/* As a new SQL statement would, with the latest snapshot (see tombstone_probe). */
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid, index->rd_indcollation[0],
						   F_TEXTEQ, PointerGetDatum(ref->key));
	ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid, index->rd_indcollation[1],
						   F_TEXTEQ, PointerGetDatum(ref->scope));
	slot = table_slot_create(table, NULL);
	scan = idem_index_beginscan(table, index, snapshot, 2, 0);
	index_rescan(scan, keys, 2, NULL, 0);
	*found = false;
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		TimestampTz at = DatumGetTimestampTz(slot_getattr(slot, TOMB_COL_EXPIRED_AT, &isnull));

		if (!isnull && at > since)
		{
			*expired_at = at;
			*found = true;
		}
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	index_close(index, NoLock);
	table_close(table, NoLock);
	return true;
}

bool
tombstone_probe(const KeyRef *ref, TimestampTz since, TimestampTz *expired_at)
{
	Oid			namespace_oid = get_func_namespace(ref->extension_function);
	Datum		params[PROBE_PARAMS] = {
		[PROBE_PARAM_KEY] = PointerGetDatum(ref->key),
		[PROBE_PARAM_SCOPE] = PointerGetDatum(ref->scope),
		[PROBE_PARAM_SINCE] = TimestampTzGetDatum(since)
	};
	bool		found = false;
	int			rc;
	Oid			relid = get_relname_relid("idempotency_tombstones", namespace_oid);
	bool		partitioned;

	/* The SQL of 1.3 (a library updated before ALTER EXTENSION UPDATE) has no tombstones. */
	if (!OidIsValid(relid))
		return false;
	partitioned = key_store_partitioned(namespace_oid);
	if (!partitioned && probe_direct(relid, ref, since, expired_at, &found))
		return found;
	SPI_connect();
	/*
	 * The latest snapshot, whatever the isolation level: a tombstone written after the caller's snapshot was
	 * taken still means the response expired, and answering expired never runs the request.
	 */
	rc = SPI_execute_snapshot(plan_for(namespace_oid, partitioned), params, NULL, GetLatestSnapshot(), InvalidSnapshot,
							  false, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "idempotency: tombstone lookup failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
	{
		bool		isnull;

		*expired_at = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
														&isnull));
		found = true;
	}
	SPI_finish();
	return found;
}

void
tombstones_bury_partition(Oid partition, TimestampTz since)
{
	Oid			namespace_oid = get_rel_namespace(partition);
	const char *schema;
	char	   *sql;
	Relation	relation;
	BlockNumber blocks;
	BlockNumber step = (BlockNumber) Max(idem_cleanup_batch_size, 1);
	Oid			types[3] = {TIDOID, TIDOID, TIMESTAMPTZOID};

	if (!OidIsValid(get_relname_relid("idempotency_tombstones", namespace_oid)))
		return;
	schema = quote_identifier(get_namespace_name(namespace_oid));
	/* A completed row has a status; a lease that ran out has none and is taken over, not remembered. */
	sql = psprintf("INSERT INTO %s.idempotency_tombstones (expired_at, scope, key, request_hash)"
				   " SELECT expires_at, scope, key, request_hash FROM %s.%s"
				   " WHERE ctid OPERATOR(pg_catalog.>=) $1 AND ctid OPERATOR(pg_catalog.<) $2"
				   " AND http_status IS NOT NULL AND expires_at OPERATOR(pg_catalog.>) $3"
				   " ON CONFLICT DO NOTHING",
				   schema, schema, quote_identifier(get_rel_name(partition)));
	relation = table_open(partition, AccessShareLock);
	blocks = RelationGetNumberOfBlocks(relation);
	table_close(relation, NoLock);
	for (BlockNumber from_block = 0; from_block < blocks; from_block += Min(step, MaxBlockNumber - from_block))
	{
		ItemPointerData from;
		ItemPointerData to;
		Datum		values[3];
		int			rc;

		ItemPointerSet(&from, from_block, FirstOffsetNumber);
		ItemPointerSet(&to, from_block + Min(step, MaxBlockNumber - from_block), FirstOffsetNumber);
		values[0] = PointerGetDatum(&from);
		values[1] = PointerGetDatum(&to);
		values[2] = TimestampTzGetDatum(since);
		rc = SPI_execute_with_args(sql, 3, types, values, NULL, false, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "idempotency: writing the tombstones of partition %u failed: %s", partition,
				 SPI_result_code_string(rc));
		CHECK_FOR_INTERRUPTS();
	}
}
