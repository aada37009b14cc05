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
 * looks for a live row and stores one, as with the statements. The lease writes and a lapsed lease's
 * replacement are UPDATEs of the key's live row, taken here too (below, at "Lease writes"): in place while the
 * new expiry fits the row's partition, else moved as a cross-partition UPDATE moves it.
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
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

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
	AttrNumber	fencing_attnum;	/* 1.4's fencing_number, which key_shape_of allows beside the key columns */
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
	for (int i = 0; i < list.natts; i++)
	{
		Form_pg_attribute attr = TupleDescAttr(RelationGetDescr(parent), i);

		if (!attr->attisdropped && strcmp(NameStr(attr->attname), "fencing_number") == 0)
			list.fencing_attnum = attr->attnum;
	}
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

/*
 * Stores a formed tuple in partition p (locked, usable) with its index entries: the probe index alone when it
 * is the partition's only index, the executor's index maintenance otherwise.
 */
static void
store_in_partition(Partition *p, Relation rel, HeapTuple tuple, Datum scope, Datum key)
{
	if (p->index_only)
	{
		Relation	index = index_open(p->index, RowExclusiveLock);
		Datum		entry[2];
		bool		entry_nulls[2] = {false, false};

		entry[p->scope_column - 1] = scope;
		entry[p->key_column - 1] = key;
		heap_insert(rel, tuple, GetCurrentCommandId(true), 0, NULL);
		index_insert(index, entry, entry_nulls, &tuple->t_self, rel,
					 index->rd_index->indisunique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, false, p->index_info);
		index_close(index, NoLock);
	}
	else
		key_insert_with_executor(rel, tuple);
}

/* How a row to insert is formed, from the partition's descriptor (the parent's columns) and the list's shape. */
typedef HeapTuple (*FormRow) (TupleDesc desc, const KeyRef *ref, const void *arg);

/*
 * Routes a new row expiring at expires_at as the INSERT's tuple routing does, locks its partition and stores
 * the row formed there; false (nothing written) when the direct path does not apply. The privilege is checked
 * by the caller with privilege(), once the parent is locked.
 */
static bool
insert_routed(const KeyTable *table, const KeyRef *ref, TimestampTz expires_at, FormRow form, const void *arg,
			  void (*privilege) (const KeyTable *table, Oid relid))
{
	Partition  *p;
	Relation	rel;

	for (;;)
	{
		if (!lock_parent(table, RowExclusiveLock) || !list.shape.writable)
			return false;
		p = route(expires_at);
		if (p == NULL)
			return false;
		if (lock_partition(p, RowExclusiveLock, list_forgotten))
			break;
	}
	if (!p->known)
		work_out_partition(p);
	if (!p->usable)
		return false;
	privilege(table, table->partitioned_oid);
	rel = relation_open(p->relid, NoLock);
	store_in_partition(p, rel, form(RelationGetDescr(rel), ref, arg), PointerGetDatum(ref->scope),
					   PointerGetDatum(ref->key));
	relation_close(rel, NoLock);
	return true;
}

static HeapTuple
form_completed_row(TupleDesc desc, const KeyRef *ref, const void *arg)
{
	return key_form_row(desc, list.shape.attnums, ref, (const KeyWrite *) arg);
}

bool
key_partitioned_insert(const KeyTable *table, const KeyRef *ref, const KeyWrite *row)
{
	return insert_routed(table, ref, row->expires_at, form_completed_row, row, key_require_insert);
}

/*
 * Lease writes (issue 39): each is an UPDATE of the key's live row in the statements (key_store_spi.c), here an
 * index probe, a row lock and a heap update, with the UPDATE's answers:
 *
 * - the row is the key's live row (expires_at after the transaction's start) that the statement's WHERE takes
 *   (the holder's token, a lapsed lease), looked for as the lookup looks, with the statement's snapshot (the
 *   transaction's under REPEATABLE READ, a new one under READ COMMITTED);
 * - it is locked as the UPDATE locks it: under READ COMMITTED the latest version of it (a change committed
 *   since the snapshot, which the key's lock makes rare), checked again against the WHERE as EvalPlanQual
 *   does (no longer matching: nothing written); under REPEATABLE READ and SERIALIZABLE a row changed or
 *   deleted since the snapshot is 40001, and under any level a row moved to another partition meanwhile, as
 *   PostgreSQL answers;
 * - the new version stays in its partition when its expiry still fits the partition's bounds (a heap update,
 *   HOT when it can be, the probe index's entry otherwise); an expiry that routes elsewhere (an extension past
 *   the partition's upper bound, a takeover with a later expiry, a row in the default partition whose range
 *   partition now exists) moves the row as a cross-partition UPDATE does: the old version deleted and marked
 *   as moved, so a concurrent writer of it gets 40001, and the new one inserted where the routing puts it.
 *
 * The privileges checked are the statement's (UPDATE on the columns set, SELECT on those read), on the parent.
 * Anything the direct path does not take (no partition for the new expiry, a partition with triggers or other
 * indexes to keep) is found before anything is written, and the whole call goes to the statements.
 */
typedef enum EditKind
{
	EDIT_TAKE_LEASE,			/* lease_replace: the live row, whatever it holds */
	EDIT_CHANGE_LEASE,			/* lease_change[]: the live row holding the token, not completed */
	EDIT_REPLACE_LAPSED			/* replace: the live row whose lease has run out, not completed */
} EditKind;

typedef struct RowEdit
{
	EditKind	kind;
	const KeyTable *table;
	const KeyRef *ref;
	TimestampTz now;			/* EDIT_REPLACE_LAPSED: clock_timestamp() */
	LeaseTake	how;			/* EDIT_TAKE_LEASE */
	LeaseGrant *grant;
	const pg_uuid_t *token;		/* EDIT_CHANGE_LEASE */
	LeaseChange change;
	const LeaseChangeValues *values;
	const KeyWrite *write;		/* EDIT_REPLACE_LAPSED */
	/* RETURNING: the row's values once written */
	TimestampTz expires_at;
	TimestampTz lease_until;	/* 0: NULL */
	int64		fencing_number;
} RowEdit;

typedef enum EditResult
{
	EDIT_DONE,					/* the row was changed */
	EDIT_NO_ROW,				/* no row matched: nothing written */
	EDIT_NOT_DIRECT,			/* the statements, for the whole call: nothing written */
	EDIT_RETRY					/* the list was forgotten meanwhile: nothing written, start again */
} EditResult;

#define ATTNUM(column) (list.shape.attnums[(column)])

/* The statement's WHERE beyond scope and key, on the row in slot. */
static bool
edit_matches(const RowEdit *edit, TupleTableSlot *slot, TimestampTz live_after)
{
	bool		isnull;
	bool		until_null;
	TimestampTz expires_at = DatumGetTimestampTz(slot_getattr(slot, ATTNUM(KEY_COL_EXPIRES_AT), &isnull));
	Datum		value;

	if (isnull || expires_at <= live_after)
		return false;
	if (edit->kind == EDIT_TAKE_LEASE)
		return true;
	(void) slot_getattr(slot, ATTNUM(KEY_COL_HTTP_STATUS), &isnull);
	if (!isnull)
		return false;
	if (edit->kind == EDIT_REPLACE_LAPSED)
	{
		value = slot_getattr(slot, ATTNUM(KEY_COL_LEASE_UNTIL), &until_null);
		return !until_null && DatumGetTimestampTz(value) <= edit->now;
	}
	value = slot_getattr(slot, ATTNUM(KEY_COL_LEASE_TOKEN), &isnull);
	return !isnull && memcmp(DatumGetUUIDP(value), edit->token, sizeof(pg_uuid_t)) == 0;
}

/* The key's expiry after an extension: as the statement's sum, in UTC, with the same functions (and errors). */
static TimestampTz
extended_expiry(TimestampTz expires_at, TimestampTz lease_until, TimestampTz until)
{
	Datum		outlives = DirectFunctionCall2(timestamp_mi, TimestampTzGetDatum(expires_at),
											   TimestampTzGetDatum(lease_until));
	TimestampTz sum = DatumGetTimestamp(DirectFunctionCall2(timestamp_pl_interval, TimestampGetDatum(until),
															outlives));

	return Max(expires_at, sum);
}

/* The statement's SET, on the old row's values (every column of the partition, by attribute number - 1). */
static void
edit_apply(RowEdit *edit, Datum *values, bool *nulls)
{
#define SET(column, value, isnull) \
	(values[ATTNUM(column) - 1] = (value), nulls[ATTNUM(column) - 1] = (isnull))
#define GET(column) (values[ATTNUM(column) - 1])
#define IS_NULL(column) (nulls[ATTNUM(column) - 1])
	const KeyTable *table = edit->table;

	switch (edit->kind)
	{
		case EDIT_TAKE_LEASE:
			{
				bool		take_over = edit->how == LEASE_TAKE_OVER;
				LeaseGrant *grant = edit->grant;

				if (!take_over || IS_NULL(KEY_COL_EXPIRES_AT) ||
					DatumGetTimestampTz(GET(KEY_COL_EXPIRES_AT)) < grant->expires_at)
					SET(KEY_COL_EXPIRES_AT, TimestampTzGetDatum(grant->expires_at), false);
				if (!take_over)
					SET(KEY_COL_CREATED_AT, TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()), false);
				SET(KEY_COL_REQUEST_HASH, PointerGetDatum(key_hash_bytea(grant->request_hash)), false);
				SET(KEY_COL_HTTP_STATUS, (Datum) 0, true);
				SET(KEY_COL_RESPONSE_BODY, (Datum) 0, true);
				SET(KEY_COL_RESPONSE_HEADERS, (Datum) 0, true);
				if (table->has_bytes_columns)
				{
					SET(KEY_COL_RESPONSE_CONTENT_TYPE, (Datum) 0, true);
					SET(KEY_COL_RESPONSE_BYTES, (Datum) 0, true);
				}
				if (list.fencing_attnum != InvalidAttrNumber)
				{
					/* GREATEST($9, fencing_number + 1): the sum's overflow is int8pl's error; NULL is skipped */
					int64		number = grant->fencing_number;
					AttrNumber	f = list.fencing_attnum - 1;

					if (!nulls[f])
						number = Max(number, DatumGetInt64(DirectFunctionCall2(int8pl, values[f],
																			   Int64GetDatum(1))));
					values[f] = Int64GetDatum(number);
					nulls[f] = false;
					edit->fencing_number = number;
				}
				SET(KEY_COL_LEASE_UNTIL, TimestampTzGetDatum(grant->lease_until), false);
				SET(KEY_COL_LEASE_TOKEN, UUIDPGetDatum(&grant->token), false);
				if (!take_over)
				{
					SET(KEY_COL_RECOVERY_POINT, (Datum) 0, true);
					SET(KEY_COL_RECOVERY_STATE, (Datum) 0, true);
				}
				break;
			}
		case EDIT_CHANGE_LEASE:
			{
				const LeaseChangeValues *v = edit->values;

				switch (edit->change)
				{
					case LEASE_EXTEND:
						if (!IS_NULL(KEY_COL_LEASE_UNTIL))
							SET(KEY_COL_EXPIRES_AT,
								TimestampTzGetDatum(extended_expiry(DatumGetTimestampTz(GET(KEY_COL_EXPIRES_AT)),
																	DatumGetTimestampTz(GET(KEY_COL_LEASE_UNTIL)),
																	v->until)), false);
						SET(KEY_COL_LEASE_UNTIL, TimestampTzGetDatum(v->until), false);
						break;
					case LEASE_CHECKPOINT:
						SET(KEY_COL_RECOVERY_POINT, v->recovery_point, v->recovery_point_null);
						SET(KEY_COL_RECOVERY_STATE, v->recovery_state, v->recovery_state_null);
						break;
					case LEASE_COMPLETE:
						SET(KEY_COL_HTTP_STATUS, Int32GetDatum(v->response.http_status), false);
						SET(KEY_COL_RESPONSE_BODY, v->response.body, v->response.body_null);
						SET(KEY_COL_RESPONSE_HEADERS, v->response.headers, v->response.headers_null);
						SET(KEY_COL_LEASE_UNTIL, (Datum) 0, true);
						SET(KEY_COL_LEASE_TOKEN, (Datum) 0, true);
						if (table->has_bytes_columns)
						{
							SET(KEY_COL_RESPONSE_CONTENT_TYPE, v->response.content_type,
								v->response.content_type_null);
							SET(KEY_COL_RESPONSE_BYTES, v->response.bytes, v->response.bytes_null);
						}
						break;
					case LEASE_RELEASE:
						SET(KEY_COL_LEASE_UNTIL, TimestampTzGetDatum(v->until), false);
						SET(KEY_COL_LEASE_TOKEN, (Datum) 0, true);
						break;
				}
				break;
			}
		case EDIT_REPLACE_LAPSED:
			{
				const KeyWrite *w = edit->write;

				SET(KEY_COL_EXPIRES_AT, TimestampTzGetDatum(w->expires_at), false);
				SET(KEY_COL_CREATED_AT, TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()), false);
				SET(KEY_COL_HTTP_STATUS, Int32GetDatum(w->response.http_status), false);
				SET(KEY_COL_REQUEST_HASH, PointerGetDatum(key_hash_bytea(w->request_hash)), false);
				SET(KEY_COL_RESPONSE_HEADERS, w->response.headers, w->response.headers_null);
				SET(KEY_COL_RESPONSE_BODY, w->response.body, w->response.body_null);
				if (table->has_bytes_columns)
				{
					SET(KEY_COL_RESPONSE_CONTENT_TYPE, w->response.content_type, w->response.content_type_null);
					SET(KEY_COL_RESPONSE_BYTES, w->response.bytes, w->response.bytes_null);
				}
				SET(KEY_COL_LEASE_UNTIL, (Datum) 0, true);
				SET(KEY_COL_LEASE_TOKEN, (Datum) 0, true);
				SET(KEY_COL_RECOVERY_POINT, (Datum) 0, true);
				SET(KEY_COL_RECOVERY_STATE, (Datum) 0, true);
				break;
			}
	}
	edit->expires_at = DatumGetTimestampTz(GET(KEY_COL_EXPIRES_AT));
	edit->lease_until = IS_NULL(KEY_COL_LEASE_UNTIL) ? 0 : DatumGetTimestampTz(GET(KEY_COL_LEASE_UNTIL));
#undef SET
#undef GET
#undef IS_NULL
}

/*
 * The key's live row that the edit's WHERE takes, with the latest expiry, probed as lookup_once probes (the
 * default partition, then the range partitions from the latest bound down to the first holding a match), each
 * partition locked as the UPDATE locks it. *holder and *tid: where it is; false: none, or *result says why not.
 */
static bool
find_row(RowEdit *edit, Snapshot snapshot, TimestampTz live_after, uint64 found_at, Partition **holder,
		 ItemPointer tid, TimestampTz *best_expiry, EditResult *result)
{
	const KeyRef *ref = edit->ref;
	bool		found = false;

	*result = EDIT_NO_ROW;
	for (int i = OidIsValid(list.default_partition.relid) ? -1 : 0; i < list.nranges; i++)
	{
		Partition  *p = i < 0 ? &list.default_partition : &list.ranges[list.nranges - 1 - i];
		Relation	rel;
		Relation	index;
		ScanKeyData keys[2];
		IndexScanDesc scan;
		TupleTableSlot *slot;
		bool		found_here = false;

		if (!p->is_default && !p->upper_unbounded && p->upper <= live_after)
			break;
		if (!lock_partition(p, RowExclusiveLock, found_at))
		{
			*result = EDIT_RETRY;
			return false;
		}
		if (!p->known)
			work_out_partition(p);
		if (!p->usable)
		{
			*result = EDIT_NOT_DIRECT;
			return false;
		}
		rel = relation_open(p->relid, NoLock);
		if (RelationGetNumberOfBlocks(rel) == 0)
		{
			relation_close(rel, NoLock);
			continue;
		}
		index = index_open(p->index, RowExclusiveLock);
		ScanKeyEntryInitialize(&keys[p->key_column - 1], 0, p->key_column, BTEqualStrategyNumber, InvalidOid,
							   index->rd_indcollation[p->key_column - 1], F_TEXTEQ, PointerGetDatum(ref->key));
		ScanKeyEntryInitialize(&keys[p->scope_column - 1], 0, p->scope_column, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[p->scope_column - 1], F_TEXTEQ,
							   PointerGetDatum(ref->scope));
		slot = table_slot_create(rel, NULL);
		scan = idem_index_beginscan(rel, index, snapshot, 2, 0);
		index_rescan(scan, keys, 2, NULL, 0);
		while (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			TimestampTz expires_at;

			if (!edit_matches(edit, slot, live_after))
				continue;
			expires_at = DatumGetTimestampTz(slot_getattr(slot, ATTNUM(KEY_COL_EXPIRES_AT), &isnull));
			if (found && expires_at <= *best_expiry)
				continue;
			found = found_here = true;
			*best_expiry = expires_at;
			*holder = p;
			*tid = slot->tts_tid;
		}
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		index_close(index, NoLock);
		relation_close(rel, NoLock);
		if (found_here && !p->is_default)
			break;
	}
	return found;
}

/* One attempt at the edit, the parent locked and the list found. */
static EditResult
edit_once(RowEdit *edit, TimestampTz live_after)
{
	uint64		found_at = list_forgotten;
	Snapshot	snapshot;
	Partition  *holder = NULL;
	Partition  *target;
	ItemPointerData tid;
	TimestampTz best_expiry = 0;
	EditResult	result;
	Relation	rel;
	TupleTableSlot *slot;
	TM_FailureData tmfd;
	TM_Result	locked;
	CommandId	cid;
	int			natts;
	Datum	   *values;
	bool	   *nulls;

	/* As a new SQL statement would: see this transaction's own earlier writes. */
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	if (!find_row(edit, snapshot, live_after, found_at, &holder, &tid, &best_expiry, &result))
	{
		UnregisterSnapshot(snapshot);
		return result;
	}
	cid = GetCurrentCommandId(true);
	rel = relation_open(holder->relid, NoLock);
	slot = table_slot_create(rel, NULL);
	locked = table_tuple_lock(rel, &tid, snapshot, slot, cid, LockTupleExclusive, LockWaitBlock,
							  IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd);
	UnregisterSnapshot(snapshot);
	switch (locked)
	{
		case TM_Ok:
			break;
		case TM_Updated:
			/* READ COMMITTED follows an update to the latest version; it stops only at a moved row. */
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("tuple to be locked was already moved to another partition due to concurrent update")));
			break;
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent delete")));
			if (ItemPointerIndicatesMovedPartitions(&tmfd.ctid))
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("tuple to be locked was already moved to another partition due to concurrent update")));
			/* Deleted (a sweep) since the snapshot: the UPDATE skips it. */
			ExecDropSingleTupleTableSlot(slot);
			relation_close(rel, NoLock);
			return EDIT_NO_ROW;
		case TM_SelfModified:
			/* This call's own command wrote it: not possible for one row of one key; the executor skips it. */
			ExecDropSingleTupleTableSlot(slot);
			relation_close(rel, NoLock);
			return EDIT_NO_ROW;
		default:
			elog(ERROR, "idempotency: unexpected result %d locking a key row", (int) locked);
	}
	/* The version locked, checked again as EvalPlanQual checks it (it may be a later one). */
	if (tmfd.traversed && !edit_matches(edit, slot, live_after))
	{
		ExecDropSingleTupleTableSlot(slot);
		relation_close(rel, NoLock);
		return EDIT_NO_ROW;
	}
	tid = slot->tts_tid;
	natts = RelationGetDescr(rel)->natts;
	slot_getallattrs(slot);
	values = palloc(natts * sizeof(Datum));
	nulls = palloc(natts * sizeof(bool));
	memcpy(values, slot->tts_values, natts * sizeof(Datum));
	memcpy(nulls, slot->tts_isnull, natts * sizeof(bool));
	edit_apply(edit, values, nulls);

	/* Where the new version belongs, found and locked before anything is written. */
	target = route(edit->expires_at);
	if (target == NULL || (target == holder && !holder->index_only))
	{
		ExecDropSingleTupleTableSlot(slot);
		relation_close(rel, NoLock);
		return EDIT_NOT_DIRECT;
	}
	if (target != holder)
	{
		if (!lock_partition(target, RowExclusiveLock, found_at))
		{
			ExecDropSingleTupleTableSlot(slot);
			relation_close(rel, NoLock);
			return EDIT_RETRY;
		}
		if (!target->known)
			work_out_partition(target);
		if (!target->usable)
		{
			ExecDropSingleTupleTableSlot(slot);
			relation_close(rel, NoLock);
			return EDIT_NOT_DIRECT;
		}
	}
	/* The index entries are the stored scope and key (equal to the call's, not always byte for byte). */
	if (target == holder)
	{
		HeapTuple	tuple = heap_form_tuple(RelationGetDescr(rel), values, nulls);

		if (idem_simple_heap_update(rel, &tid, tuple))
		{
			Relation	index = index_open(holder->index, RowExclusiveLock);
			Datum		entry[2];
			bool		entry_nulls[2] = {false, false};

			entry[holder->scope_column - 1] = values[ATTNUM(KEY_COL_SCOPE) - 1];
			entry[holder->key_column - 1] = values[ATTNUM(KEY_COL_KEY) - 1];
			index_insert(index, entry, entry_nulls, &tuple->t_self, rel,
						 index->rd_index->indisunique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, true,
						 holder->index_info);
			index_close(index, NoLock);
		}
	}
	else
	{
		Relation	into;
		TM_Result	deleted;

		/* A cross-partition UPDATE: the old version deleted as moved, the new one stored where it routes. */
		deleted = heap_delete(rel, &tid, cid, InvalidSnapshot, true, &tmfd, true);
		if (deleted != TM_Ok)
			elog(ERROR, "idempotency: unexpected result %d moving a locked key row", (int) deleted);
		into = relation_open(target->relid, NoLock);
		store_in_partition(target, into, heap_form_tuple(RelationGetDescr(into), values, nulls),
						   values[ATTNUM(KEY_COL_SCOPE) - 1], values[ATTNUM(KEY_COL_KEY) - 1]);
		relation_close(into, NoLock);
	}
	ExecDropSingleTupleTableSlot(slot);
	relation_close(rel, NoLock);
	return EDIT_DONE;
}

/* The privileges of the edit's statement, on the parent. */
static void
edit_privileges(const RowEdit *edit)
{
	const KeyTable *table = edit->table;
	Oid			parent = table->partitioned_oid;
	uint32		bytes = table->has_bytes_columns
		? KEY_COLUMN_BIT(KEY_COL_RESPONSE_CONTENT_TYPE) | KEY_COLUMN_BIT(KEY_COL_RESPONSE_BYTES) : 0;
	uint32		lease = KEY_COLUMN_BIT(KEY_COL_LEASE_UNTIL) | KEY_COLUMN_BIT(KEY_COL_LEASE_TOKEN);
	uint32		recovery = KEY_COLUMN_BIT(KEY_COL_RECOVERY_POINT) | KEY_COLUMN_BIT(KEY_COL_RECOVERY_STATE);
	uint32		response = KEY_COLUMN_BIT(KEY_COL_HTTP_STATUS) | KEY_COLUMN_BIT(KEY_COL_RESPONSE_BODY) |
		KEY_COLUMN_BIT(KEY_COL_RESPONSE_HEADERS) | bytes;
	uint32		named = KEY_COLUMN_BIT(KEY_COL_SCOPE) | KEY_COLUMN_BIT(KEY_COL_KEY) |
		KEY_COLUMN_BIT(KEY_COL_EXPIRES_AT);
	bool		fencing = list.fencing_attnum != InvalidAttrNumber;
	static const uint32 change_sets[LEASE_CHANGES] = {
		[LEASE_EXTEND] = KEY_COLUMN_BIT(KEY_COL_LEASE_UNTIL) | KEY_COLUMN_BIT(KEY_COL_EXPIRES_AT),
		[LEASE_CHECKPOINT] = KEY_COLUMN_BIT(KEY_COL_RECOVERY_POINT) | KEY_COLUMN_BIT(KEY_COL_RECOVERY_STATE),
		[LEASE_COMPLETE] = KEY_COLUMN_BIT(KEY_COL_HTTP_STATUS) | KEY_COLUMN_BIT(KEY_COL_RESPONSE_BODY) |
		KEY_COLUMN_BIT(KEY_COL_RESPONSE_HEADERS) | KEY_COLUMN_BIT(KEY_COL_LEASE_UNTIL) |
		KEY_COLUMN_BIT(KEY_COL_LEASE_TOKEN),
		[LEASE_RELEASE] = KEY_COLUMN_BIT(KEY_COL_LEASE_UNTIL) | KEY_COLUMN_BIT(KEY_COL_LEASE_TOKEN)
	};

	switch (edit->kind)
	{
		case EDIT_TAKE_LEASE:
			key_require_columns(parent, ACL_UPDATE, KEY_COLUMN_BIT(KEY_COL_EXPIRES_AT) |
								KEY_COLUMN_BIT(KEY_COL_CREATED_AT) | KEY_COLUMN_BIT(KEY_COL_REQUEST_HASH) |
								response | lease | recovery, fencing);
			key_require_columns(parent, ACL_SELECT, named | KEY_COLUMN_BIT(KEY_COL_CREATED_AT) | recovery,
								fencing);
			break;
		case EDIT_CHANGE_LEASE:
			key_require_columns(parent, ACL_UPDATE, change_sets[edit->change] |
								(edit->change == LEASE_COMPLETE ? bytes : 0), false);
			key_require_columns(parent, ACL_SELECT, named | lease | KEY_COLUMN_BIT(KEY_COL_HTTP_STATUS), false);
			break;
		case EDIT_REPLACE_LAPSED:
			key_require_columns(parent, ACL_UPDATE, KEY_COLUMN_BIT(KEY_COL_EXPIRES_AT) |
								KEY_COLUMN_BIT(KEY_COL_CREATED_AT) | KEY_COLUMN_BIT(KEY_COL_REQUEST_HASH) |
								response | lease | recovery, false);
			key_require_columns(parent, ACL_SELECT, named | KEY_COLUMN_BIT(KEY_COL_HTTP_STATUS) |
								KEY_COLUMN_BIT(KEY_COL_LEASE_UNTIL), false);
			break;
	}
}

/* The edit on the direct path: EDIT_DONE, EDIT_NO_ROW or EDIT_NOT_DIRECT (nothing written). */
static EditResult
edit_row(RowEdit *edit)
{
	TimestampTz live_after = GetCurrentTransactionStartTimestamp();
	bool		privilege_checked = false;

	for (;;)
	{
		EditResult	result;

		if (!lock_parent(edit->table, RowExclusiveLock) || !list.shape.writable)
			return EDIT_NOT_DIRECT;
		if (!privilege_checked)
		{
			edit_privileges(edit);
			privilege_checked = true;
		}
		result = edit_once(edit, live_after);
		if (result != EDIT_RETRY)
			return result;
	}
}

/* A new lease's row: the lease insert's columns, the others NULL. */
static HeapTuple
form_lease_row(TupleDesc desc, const KeyRef *ref, const void *arg)
{
	const LeaseGrant *grant = (const LeaseGrant *) arg;
	Datum	   *values = palloc0(desc->natts * sizeof(Datum));
	bool	   *nulls = palloc(desc->natts * sizeof(bool));

	memset(nulls, true, desc->natts * sizeof(bool));
#define SET(column, value) (values[ATTNUM(column) - 1] = (value), nulls[ATTNUM(column) - 1] = false)
	SET(KEY_COL_EXPIRES_AT, TimestampTzGetDatum(grant->expires_at));
	SET(KEY_COL_CREATED_AT, TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()));
	SET(KEY_COL_SCOPE, PointerGetDatum(ref->scope));
	SET(KEY_COL_KEY, PointerGetDatum(ref->key));
	SET(KEY_COL_REQUEST_HASH, PointerGetDatum(key_hash_bytea(grant->request_hash)));
	SET(KEY_COL_LEASE_UNTIL, TimestampTzGetDatum(grant->lease_until));
	SET(KEY_COL_LEASE_TOKEN, UUIDPGetDatum(&grant->token));
#undef SET
	if (list.fencing_attnum != InvalidAttrNumber)
	{
		values[list.fencing_attnum - 1] = Int64GetDatum(grant->fencing_number);
		nulls[list.fencing_attnum - 1] = false;
	}
	return heap_form_tuple(desc, values, nulls);
}

static void
require_lease_insert(const KeyTable *table, Oid relid)
{
	key_require_columns(relid, ACL_INSERT, KEY_COLUMN_BIT(KEY_COL_EXPIRES_AT) |
						KEY_COLUMN_BIT(KEY_COL_CREATED_AT) | KEY_COLUMN_BIT(KEY_COL_SCOPE) |
						KEY_COLUMN_BIT(KEY_COL_KEY) | KEY_COLUMN_BIT(KEY_COL_REQUEST_HASH) |
						KEY_COLUMN_BIT(KEY_COL_LEASE_UNTIL) | KEY_COLUMN_BIT(KEY_COL_LEASE_TOKEN),
						list.fencing_attnum != InvalidAttrNumber);
}

/*
 * The fencing column is the statement's only if the key table has it (table->has_fencing_column, which the
 * statements' text follows) and the parent has it where the shape allows it.
 */
static bool
fencing_as_statements(const KeyTable *table)
{
	return table->has_fencing_column == (list.fencing_attnum != InvalidAttrNumber);
}

bool
key_partitioned_take_lease(const KeyTable *table, const KeyRef *ref, LeaseTake how, LeaseGrant *grant)
{
	RowEdit		edit;

	if (!table->has_lease_columns)
		return false;
	if (how != LEASE_NEW_ROW)
	{
		memset(&edit, 0, sizeof(edit));
		edit.kind = EDIT_TAKE_LEASE;
		edit.table = table;
		edit.ref = ref;
		edit.how = how;
		edit.grant = grant;
		if (!lock_parent(table, RowExclusiveLock) || !fencing_as_statements(table))
			return false;
		switch (edit_row(&edit))
		{
			case EDIT_DONE:
				grant->expires_at = edit.expires_at;
				if (table->has_fencing_column)
					grant->fencing_number = edit.fencing_number;
				return true;
			case EDIT_NOT_DIRECT:
				return false;
			default:
				/* A cleanup removed the row meanwhile, or it expired: a new row. */
				break;
		}
	}
	if (!lock_parent(table, RowExclusiveLock) || !fencing_as_statements(table))
		return false;
	return insert_routed(table, ref, grant->expires_at, form_lease_row, grant, require_lease_insert);
}

bool
key_partitioned_change_lease(const KeyTable *table, const KeyRef *ref, const pg_uuid_t *token,
							 LeaseChange change, const LeaseChangeValues *values, bool *changed,
							 TimestampTz *lease_until)
{
	RowEdit		edit;
	EditResult	result;

	if (!table->has_lease_columns)
		return false;
	memset(&edit, 0, sizeof(edit));
	edit.kind = EDIT_CHANGE_LEASE;
	edit.table = table;
	edit.ref = ref;
	edit.token = token;
	edit.change = change;
	edit.values = values;
	result = edit_row(&edit);
	if (result == EDIT_NOT_DIRECT)
		return false;
	*changed = result == EDIT_DONE;
	*lease_until = *changed ? edit.lease_until : 0;
	return true;
}

bool
key_partitioned_replace(const KeyTable *table, const KeyRef *ref, const KeyWrite *row)
{
	RowEdit		edit;

	if (table->has_lease_columns)
	{
		memset(&edit, 0, sizeof(edit));
		edit.kind = EDIT_REPLACE_LAPSED;
		edit.table = table;
		edit.ref = ref;
		edit.write = row;
		edit.now = GetCurrentTimestamp();
		switch (edit_row(&edit))
		{
			case EDIT_DONE:
				return true;
			case EDIT_NOT_DIRECT:
				return false;
			default:
				break;
		}
	}
	/* No live row to replace (an expired one stays beside the new row until its partition goes): insert. */
	return key_partitioned_insert(table, ref, row);
}
