/*
 * key_store_partitioned.c: the direct path for partitioned storage (issue 39).
 *
 * What the prepared statements of key_store_spi.c do against idempotency_keys_partitioned, with index probes and
 * a heap insert instead, and with the same answers:
 *
 * - the lookup reads the key's rows with expires_at after the transaction's start (live rows; an expired row
 *   counts as absent, and partitioned storage leaves it beside the re-claimed key's new row until its partition
 *   is dropped) and returns the one with the latest expiry. Only the partitions that can hold such a row are
 *   probed (those whose upper bound is after the transaction's start, and the default partition), never
 *   locked otherwise: a claim never queues behind the drop of an expired partition. The default partition is
 *   probed first (its rows may have any expiry), then the range partitions from the latest bound down, and the
 *   first range partition with a live row ends the search (the ranges are disjoint: no later row exists
 *   below it).
 * - the insert routes the row by its expiry as the INSERT's tuple routing does (the range partition whose
 *   bounds hold it, else the default partition) and inserts it there with its index entries. No partition for
 *   it: the statement, whose ERROR is PostgreSQL's own.
 *
 * The uniqueness of (scope, key) across partitions is the claim's: it holds the key's lock (key_lock.c) while it
 * looks for a live row and stores one, as with the statements. Replacing a lapsed lease's row and every lease
 * write are UPDATEs, left to the statements.
 *
 * It applies where a probe and an insert do exactly what the statements would: the parent partitioned by range
 * on expires_at alone (timestamptz's default order), the parent's shape as key_store_direct.c requires of a
 * table (key_shape_of), no row level security and no triggers on the parent, and each partition used a heap
 * with the parent's columns (same numbers, names, types, NOT NULL; a partition attached with another column
 * order is not), no triggers or CHECK constraints, and a plain btree index on exactly (key, scope) or (scope,
 * key) with the columns' collations, which every partition idem_create_partition makes has. Anything else: the
 * statements, for the whole call. Privileges are checked on the parent, as the statements check them (a
 * partition reached through its parent needs none of its own). Citus refuses partitioned storage on a
 * distributed key table before this path is chosen (citus.c); a plain table on a Citus node takes this path.
 *
 * The partition list (each partition's OID and bounds, and once probed, its index and whether it qualifies) is
 * kept per backend and forgotten by any relcache invalidation of the parent or of a partition or index in it:
 * CREATE TABLE ... PARTITION OF, ATTACH, DETACH and DROP of a partition each send one for the parent. Such an
 * invalidation is taken in when a lock is acquired, so every call locks the parent, then each partition it
 * uses, and starts again if the list was forgotten meanwhile (a partition attached while this call waited for
 * the default partition's lock, as the attach's move of rows out of it holds, is then probed too).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "catalog/index.h"
#include "executor/executor.h"
#include "nodes/execnodes.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "key_store_internal.h"
#include "pg_compat.h"

/* One partition of the list. */
typedef struct Partition
{
	Oid			relid;
	bool		is_default;
	bool		lower_unbounded;	/* MINVALUE, or the default partition */
	bool		upper_unbounded;	/* MAXVALUE, or the default partition */
	TimestampTz lower;			/* inclusive */
	TimestampTz upper;			/* exclusive */
	/* Worked out when first used (the partition locked), until the list is forgotten */
	bool		known;
	bool		usable;			/* a heap of the parent's columns, no triggers or CHECK, the probe index */
	bool		index_only;		/* the probe index is its only index: the insert maintains it alone */
	Oid			index;
	AttrNumber	scope_column;	/* positions in the index, from 1 */
	AttrNumber	key_column;
	IndexInfo  *index_info;		/* for index_only */
} Partition;

static struct
{
	Oid			parent;			/* InvalidOid: nothing remembered */
	bool		applies;		/* the parent's shape, partitioning, RLS and triggers allow the direct path */
	bool		has_lease_columns;	/* what the shape was worked out for */
	bool		has_bytes_columns;
	KeyShape	shape;
	int			natts;
	int			nranges;		/* range partitions, ascending by bounds */
	Partition  *ranges;
	Partition	default_partition;	/* relid InvalidOid: none */
} list;

/* Holds the list; reset when it is built again (never inside the callback). */
static MemoryContext list_context = NULL;

/* How many times the list was forgotten: a call compares it across each lock it takes. */
static uint64 list_forgotten = 0;

void
key_partitioned_forget(Oid relid)
{
	bool		forget = !OidIsValid(relid) || relid == list.parent;

	if (!OidIsValid(list.parent))
		return;
	if (!forget && list.default_partition.relid == relid)
		forget = true;
	for (int i = 0; !forget && i < list.nranges; i++)
		forget = list.ranges[i].relid == relid || (list.ranges[i].known && list.ranges[i].index == relid);
	if (!forget && list.default_partition.known && list.default_partition.index == relid)
		forget = true;
	if (forget)
	{
		list.parent = InvalidOid;
		list_forgotten++;
	}
}

/* The parent's partition key is expires_at alone, by range, in timestamptz's default btree order. */
static bool
partitioned_by_expiry(Relation parent, const KeyShape *shape)
{
	PartitionKey key = RelationGetPartitionKey(parent);

	return key != NULL && key->strategy == PARTITION_STRATEGY_RANGE && key->partnatts == 1 &&
		key->partattrs[0] == shape->attnums[KEY_COL_EXPIRES_AT] && key->parttypid[0] == TIMESTAMPTZOID &&
		key->partopcintype[0] == TIMESTAMPTZOID && key->partsupfunc[0].fn_oid == F_TIMESTAMPTZ_CMP;
}

/* A range bound's one datum: its value, or whether it is unbounded. */
static void
range_bound(PartitionBoundInfo bounds, int i, TimestampTz *value, bool *unbounded)
{
	*unbounded = bounds->kind[i][0] != PARTITION_RANGE_DATUM_VALUE;
	*value = *unbounded ? 0 : DatumGetTimestampTz(bounds->datums[i][0]);
}

/* The list, from the parent's partition descriptor (the parent locked). */
static void
build_list(const KeyTable *table)
{
	Relation	parent;
	PartitionDesc desc;
	PartitionBoundInfo bounds;
	MemoryContext old;

	if (list_context == NULL)
		list_context = AllocSetContextCreate(CacheMemoryContext, "idempotency partition list",
											 ALLOCSET_SMALL_SIZES);
	MemoryContextReset(list_context);
	memset(&list, 0, sizeof(list));
	parent = relation_open(table->partitioned_oid, NoLock);
	key_shape_of(RelationGetDescr(parent), table->has_lease_columns, table->has_bytes_columns, &list.shape);
	list.has_lease_columns = table->has_lease_columns;
	list.has_bytes_columns = table->has_bytes_columns;
	list.natts = RelationGetDescr(parent)->natts;
	list.applies = parent->rd_rel->relkind == RELKIND_PARTITIONED_TABLE && list.shape.readable &&
		partitioned_by_expiry(parent, &list.shape) && !parent->rd_rel->relrowsecurity &&
		parent->trigdesc == NULL;
	desc = RelationGetPartitionDesc(parent, true);
	bounds = desc->boundinfo;
	old = MemoryContextSwitchTo(list_context);
	list.ranges = palloc0(sizeof(Partition) * Max(desc->nparts, 1));
	if (bounds != NULL && bounds->strategy == PARTITION_STRATEGY_RANGE)
	{
		/* indexes[i] is the partition whose upper bound is datums[i] (-1: a gap); its lower bound is datums[i-1]. */
		for (int i = 0; i < bounds->ndatums; i++)
		{
			Partition  *p;

			if (bounds->indexes[i] < 0)
				continue;
			p = &list.ranges[list.nranges++];
			p->relid = desc->oids[bounds->indexes[i]];
			range_bound(bounds, i, &p->upper, &p->upper_unbounded);
			if (i == 0)
				p->lower_unbounded = true;
			else
				range_bound(bounds, i - 1, &p->lower, &p->lower_unbounded);
		}
		if (partition_bound_has_default(bounds))
		{
			list.default_partition.relid = desc->oids[bounds->default_index];
			list.default_partition.is_default = true;
			list.default_partition.lower_unbounded = list.default_partition.upper_unbounded = true;
		}
	}
	else if (bounds != NULL)
		list.applies = false;
	else if (desc->nparts > 0)
		list.applies = false;
	MemoryContextSwitchTo(old);
	relation_close(parent, NoLock);
	list.parent = table->partitioned_oid;
}

/*
 * The partition's own conditions, worked out once per list with the partition locked: its columns exactly the
 * parent's, a heap, no triggers or CHECK, and a valid plain btree index on (key, scope) to probe.
 */
static void
work_out_partition(Partition *p)
{
	Relation	rel = relation_open(p->relid, NoLock);
	TupleDesc	desc = RelationGetDescr(rel);
	List	   *indexes;
	ListCell   *cell;
	int			candidates = 0;

	p->known = true;
	p->usable = false;
	p->index = InvalidOid;
	if (rel->rd_rel->relkind != RELKIND_RELATION || rel->rd_rel->relam != HEAP_TABLE_AM_OID ||
		desc->natts != list.natts || rel->trigdesc != NULL ||
		(desc->constr != NULL && desc->constr->num_check > 0))
	{
		relation_close(rel, NoLock);
		return;
	}
	/* Same columns as the parent, at the same numbers: the parent's shape reads and forms its tuples. */
	{
		Relation	parent = relation_open(list.parent, NoLock);
		TupleDesc	pdesc = RelationGetDescr(parent);
		bool		same = true;

		for (int i = 0; i < desc->natts && same; i++)
		{
			Form_pg_attribute a = TupleDescAttr(desc, i);
			Form_pg_attribute b = TupleDescAttr(pdesc, i);

			same = a->attisdropped == b->attisdropped &&
				(a->attisdropped || (a->atttypid == b->atttypid && a->attnotnull == b->attnotnull &&
									 a->attgenerated == b->attgenerated && a->attcollation == b->attcollation &&
									 strcmp(NameStr(a->attname), NameStr(b->attname)) == 0));
		}
		relation_close(parent, NoLock);
		if (!same)
		{
			relation_close(rel, NoLock);
			return;
		}
	}
	indexes = RelationGetIndexList(rel);
	foreach(cell, indexes)
	{
		Relation	index = index_open(lfirst_oid(cell), AccessShareLock);
		Form_pg_index form = index->rd_index;

		if (!OidIsValid(p->index) && form->indnatts == 2 && form->indnkeyatts == 2 &&
			index->rd_rel->relam == BTREE_AM_OID && form->indisvalid && form->indisready &&
			form->indimmediate && heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL))
		{
			AttrNumber	scope_column = InvalidAttrNumber;
			AttrNumber	key_column = InvalidAttrNumber;
			bool		collations = true;

			for (int i = 0; i < 2; i++)
			{
				AttrNumber	attnum = form->indkey.values[i];

				if (attnum == list.shape.attnums[KEY_COL_SCOPE])
					scope_column = i + 1;
				else if (attnum == list.shape.attnums[KEY_COL_KEY])
					key_column = i + 1;
				if (attnum > 0 && index->rd_indcollation[i] != TupleDescAttr(desc, attnum - 1)->attcollation)
					collations = false;
			}
			if (scope_column != InvalidAttrNumber && key_column != InvalidAttrNumber && collations)
			{
				MemoryContext old = MemoryContextSwitchTo(list_context);

				p->index = RelationGetRelid(index);
				p->scope_column = scope_column;
				p->key_column = key_column;
				p->index_info = BuildIndexInfo(index);
				MemoryContextSwitchTo(old);
			}
		}
		candidates++;
		index_close(index, NoLock);
	}
	p->index_only = OidIsValid(p->index) && candidates == 1;
	p->usable = OidIsValid(p->index);
	list_free(indexes);
	relation_close(rel, NoLock);
}

/*
 * Locks the parent and finds the list; false when the direct path does not apply. The caller locks each
 * partition it uses with lock_partition, which says when the list was forgotten meanwhile (start again).
 */
static bool
lock_parent(const KeyTable *table, LOCKMODE mode)
{
	if (!OidIsValid(table->partitioned_oid))
		return false;
	LockRelationOid(table->partitioned_oid, mode);
	if (list.parent != table->partitioned_oid || list.has_lease_columns != table->has_lease_columns ||
		list.has_bytes_columns != table->has_bytes_columns)
		build_list(table);
	return list.applies;
}

/*
 * Locks a partition of the list; false when the list was forgotten since the call's attempt found it (any lock
 * taken since, this one or an index's, takes in invalidations): the caller starts again.
 */
static bool
lock_partition(const Partition *p, LOCKMODE mode, uint64 found_at)
{
	LockRelationOid(p->relid, mode);
	return list_forgotten == found_at;
}

/*
 * The live row of the key in one partition with the latest expiry after live_after, if any, and later than
 * the one in best. A partition without a single block (one made ahead of time, or the default partition, most
 * of the time) holds no row the snapshot, taken before, can see: it is not probed, and its index not opened.
 * The slot is the call's, made for the first partition probed (every usable partition has the parent's
 * columns).
 */
static bool
probe(const KeyTable *table, Partition *p, const KeyRef *ref, Snapshot snapshot, TimestampTz live_after,
	  KeyRow *best, TupleTableSlot **slot, MemoryContext context)
{
	Relation	rel = relation_open(p->relid, NoLock);
	Relation	index;
	ScanKeyData keys[2];
	IndexScanDesc scan;
	AttrNumber	expires_attnum = list.shape.attnums[KEY_COL_EXPIRES_AT];
	bool		found = false;

	if (RelationGetNumberOfBlocks(rel) == 0)
	{
		relation_close(rel, NoLock);
		return false;
	}
	index = index_open(p->index, AccessShareLock);
	ScanKeyEntryInitialize(&keys[p->key_column - 1], 0, p->key_column, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[p->key_column - 1], F_TEXTEQ, PointerGetDatum(ref->key));
	ScanKeyEntryInitialize(&keys[p->scope_column - 1], 0, p->scope_column, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[p->scope_column - 1], F_TEXTEQ, PointerGetDatum(ref->scope));
	if (*slot == NULL)
		*slot = table_slot_create(rel, NULL);
	scan = idem_index_beginscan(rel, index, snapshot, 2, 0);
	index_rescan(scan, keys, 2, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, *slot))
	{
		bool		isnull;
		TimestampTz expires_at = DatumGetTimestampTz(slot_getattr(*slot, expires_attnum, &isnull));

		if (isnull || expires_at <= live_after || (best->found && expires_at <= best->expires_at))
			continue;
		found = true;
		key_read_row(*slot, list.shape.attnums, table->has_lease_columns, table->has_bytes_columns, best,
					 context);
	}
	ExecClearTuple(*slot);
	index_endscan(scan);
	index_close(index, NoLock);
	relation_close(rel, NoLock);
	return found;
}

/*
 * One attempt at the lookup: the default partition, then the range partitions from the latest bound down to the
 * first with a live row, each locked just before it is probed, so a replay locks the few partitions above its
 * row's, not every live one. LOOKUP_RETRY: the list was forgotten while a lock was taken (start again).
 */
typedef enum LookupResult
{
	LOOKUP_DONE,
	LOOKUP_NOT_DIRECT,
	LOOKUP_RETRY
} LookupResult;

static LookupResult
lookup_once(const KeyTable *table, const KeyRef *ref, LookupSnapshot which, TimestampTz live_after,
			KeyRow *out, MemoryContext context)
{
	uint64		found_at = list_forgotten;
	Snapshot	snapshot = NULL;
	TupleTableSlot *slot = NULL;
	LookupResult result = LOOKUP_DONE;

	memset(out, 0, sizeof(*out));
	for (int i = OidIsValid(list.default_partition.relid) ? -1 : 0; i < list.nranges; i++)
	{
		Partition  *p = i < 0 ? &list.default_partition : &list.ranges[list.nranges - 1 - i];

		/* The ranges are ascending: below the first that ends before live_after, no live row can be. */
		if (!p->is_default && !p->upper_unbounded && p->upper <= live_after)
			break;
		if (!lock_partition(p, AccessShareLock, found_at))
		{
			result = LOOKUP_RETRY;
			break;
		}
		if (!p->known)
			work_out_partition(p);
		if (!p->usable)
		{
			result = LOOKUP_NOT_DIRECT;
			break;
		}
		if (snapshot == NULL)
		{
			/* As a new SQL statement would: see this transaction's own earlier writes. */
			CommandCounterIncrement();
			snapshot = RegisterSnapshot(which == LOOKUP_LATEST_SNAPSHOT ? GetLatestSnapshot()
										: GetTransactionSnapshot());
		}
		if (probe(table, p, ref, snapshot, live_after, out, &slot, context) && !p->is_default)
			break;
	}
	if (slot != NULL)
		ExecDropSingleTupleTableSlot(slot);
	if (snapshot != NULL)
		UnregisterSnapshot(snapshot);
	return result;
}

bool
key_partitioned_lookup(const KeyTable *table, const KeyRef *ref, LookupSnapshot which, KeyRow *out)
{
	MemoryContext context = CurrentMemoryContext;
	TimestampTz live_after = GetCurrentTransactionStartTimestamp();
	bool		privilege_checked = false;

	for (;;)
	{
		LookupResult result;

		if (!lock_parent(table, AccessShareLock))
			return false;
		if (!privilege_checked)
		{
			key_require_select(table, table->partitioned_oid);
			privilege_checked = true;
		}
		result = lookup_once(table, ref, which, live_after, out, context);
		if (result != LOOKUP_RETRY)
		{
			if (result == LOOKUP_NOT_DIRECT)
				memset(out, 0, sizeof(*out));
			return result == LOOKUP_DONE;
		}
	}
}

/* The partition the INSERT's tuple routing would choose for a row expiring at expires_at; NULL: none. */
static Partition *
route(TimestampTz expires_at)
{
	int			low = 0;
	int			high = list.nranges - 1;

	/* The ranges are disjoint and ascending: a binary search on their bounds. */
	while (low <= high)
	{
		int			mid = (low + high) / 2;
		Partition  *p = &list.ranges[mid];

		if (!p->upper_unbounded && expires_at >= p->upper)
			low = mid + 1;
		else if (!p->lower_unbounded && expires_at < p->lower)
			high = mid - 1;
		else
			return p;
	}
	return OidIsValid(list.default_partition.relid) ? &list.default_partition : NULL;
}

bool
key_partitioned_insert(const KeyTable *table, const KeyRef *ref, const KeyWrite *row)
{
	Partition  *p;
	Relation	rel;
	HeapTuple	tuple;

	for (;;)
	{
		if (!lock_parent(table, RowExclusiveLock) || !list.shape.writable)
			return false;
		p = route(row->expires_at);
		if (p == NULL)
			return false;
		if (lock_partition(p, RowExclusiveLock, list_forgotten))
			break;
	}
	if (!p->known)
		work_out_partition(p);
	if (!p->usable)
		return false;
	key_require_insert(table, table->partitioned_oid);
	rel = relation_open(p->relid, NoLock);
	tuple = key_form_row(RelationGetDescr(rel), list.shape.attnums, ref, row);
	if (p->index_only)
	{
		Relation	index = index_open(p->index, RowExclusiveLock);
		Datum		entry[2];
		bool		entry_nulls[2] = {false, false};

		entry[p->scope_column - 1] = PointerGetDatum(ref->scope);
		entry[p->key_column - 1] = PointerGetDatum(ref->key);
		heap_insert(rel, tuple, GetCurrentCommandId(true), 0, NULL);
		index_insert(index, entry, entry_nulls, &tuple->t_self, rel,
					 index->rd_index->indisunique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, false, p->index_info);
		index_close(index, NoLock);
	}
	else
		key_insert_with_executor(rel, tuple);
	relation_close(rel, NoLock);
	return true;
}
