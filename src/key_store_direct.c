/*
 * key_store_direct.c: the fast path for the plain idempotency_keys table.
 *
 * One index probe to read a key and one heap insert plus its index entries to
 * store it, with no SQL statement to plan and start. It is taken only where it
 * behaves exactly like the statements in key_store_spi.c: table storage, no row
 * level security, no triggers or CHECK constraints on the table; privileges are
 * checked as the statements would check them, the table's or each column's. On Citus it works on the scope's local shard, locked by
 * citus.c, with the privileges of the distributed table.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/objectaddress.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "key_store_internal.h"
#include "pg_compat.h"

/*
 * What the table's columns and its primary key allow, worked out once per table
 * and again after any relcache invalidation of the table or of its primary key
 * index: ALTER TABLE, CREATE and DROP INDEX, a constraint added or dropped send
 * one for the table, a change to pg_index one for the index.
 */
static struct
{
	Oid			table;			/* InvalidOid: not worked out */
	bool		readable;		/* the key columns exist with their types */
	bool		writable;		/* and a heap tuple of them is what INSERT would store */
	AttrNumber	attnums[KEY_COLUMNS];	/* InvalidAttrNumber: a 1.1 column of a 1.0 table */
	/* The primary key index, worked out when first opened (index_known) */
	Oid			index;
	bool		index_known;
	bool		index_probes;	/* exactly (scope, key): an equality probe on it is the SQL lookup */
	AttrNumber	scope_column;	/* positions in the index, from 1 */
	AttrNumber	key_column;
	/* The insert: the primary key is the table's only index, immediate and ready; its IndexInfo */
	bool		insert_known;
	bool		index_only;
	IndexInfo  *index_info;
} shape;

/* Holds the IndexInfo; reset when the shape is worked out again (never inside the callback). */
static MemoryContext shape_context = NULL;

static void
forget_shape(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == shape.table || (OidIsValid(shape.index) && relid == shape.index))
		shape.table = InvalidOid;
}

static int
key_column_named(const char *name)
{
	for (int c = 0; c < KEY_COLUMNS; c++)
		if (strcmp(name, key_column_names[c]) == 0)
			return c;
	return -1;
}

/*
 * Readable: each of the eight 1.0 columns exists with the type the install
 * script gave it, and the four 1.1 columns all do or (a table still at 1.0) none.
 * Writable as well: no other column but 1.4's fencing_number, plain, which the
 * INSERT leaves NULL (an INSERT of the eight would fill another with its
 * default), no default on a 1.1 column and no NOT NULL on a column that can
 * be NULL here, so the tuple formed from the eight is exactly what the INSERT
 * statement would store. Also what the partitioned path (key_store_partitioned.c) asks of the parent.
 */
void
key_shape_of(TupleDesc desc, bool has_lease_columns, bool has_bytes_columns, KeyShape *out)
{
	bool		insert_would_differ = false;

	out->readable = out->writable = false;
	for (int c = 0; c < KEY_COLUMNS; c++)
		out->attnums[c] = InvalidAttrNumber;
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute attr = TupleDescAttr(desc, i);
		int			c;

		if (attr->attisdropped)
			continue;
		c = key_column_named(NameStr(attr->attname));
		/* 1.4: the lease's fencing number, which a completed claim's row leaves NULL as the SQL insert does */
		if (c < 0 && strcmp(NameStr(attr->attname), "fencing_number") == 0 && attr->atttypid == INT8OID &&
			!attr->attnotnull && !attr->atthasdef && attr->attgenerated == '\0')
			continue;
		if (c < 0 || attr->atttypid != key_column_types[c] || attr->attgenerated != '\0')
		{
			insert_would_differ = true;
			continue;
		}
		out->attnums[c] = attr->attnum;
		if (attr->attnotnull && (c == KEY_COL_HTTP_STATUS || c == KEY_COL_RESPONSE_HEADERS ||
								 c == KEY_COL_RESPONSE_BODY || c >= KEY_COLUMNS_1_0))
			insert_would_differ = true;
		if (c >= KEY_COLUMNS_1_0 && attr->atthasdef)
			insert_would_differ = true;
	}
	out->readable = true;
	for (int c = 0; c < KEY_COLUMNS; c++)
		out->readable &= (out->attnums[c] != InvalidAttrNumber) ==
			(c < KEY_COLUMNS_1_0 || (c < KEY_COLUMNS_1_2 ? has_lease_columns : has_bytes_columns));
	out->writable = out->readable && !insert_would_differ;
}

static void
work_out_shape(Relation table, bool has_lease_columns, bool has_bytes_columns)
{
	static bool callback_registered = false;
	KeyShape	columns;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(forget_shape, (Datum) 0);
		shape_context = AllocSetContextCreate(CacheMemoryContext, "idempotency key table shape",
											  ALLOCSET_SMALL_SIZES);
		callback_registered = true;
	}
	MemoryContextReset(shape_context);
	shape.index = InvalidOid;
	shape.index_known = shape.insert_known = false;
	shape.index_info = NULL;
	key_shape_of(RelationGetDescr(table), has_lease_columns, has_bytes_columns, &columns);
	memcpy(shape.attnums, columns.attnums, sizeof(shape.attnums));
	shape.readable = columns.readable;
	shape.writable = columns.writable;
	shape.table = RelationGetRelid(table);
}

/* The conditions under which index and heap calls do what the SQL statements would. */
static bool
fast_path_applies(const KeyTable *key_table, bool writing)
{
	Relation	table = key_table->direct;

	if (table->rd_rel->relkind != RELKIND_RELATION || table->rd_rel->relam != HEAP_TABLE_AM_OID)
		return false;
	if (shape.table != RelationGetRelid(table))
		work_out_shape(table, key_table->has_lease_columns, key_table->has_bytes_columns);
	if (!(writing ? shape.writable : shape.readable))
		return false;
	/* Without relrowsecurity (read from the relcache entry, which the lock keeps current) there is no RLS. */
	if (table->rd_rel->relrowsecurity &&
		check_enable_rls(RelationGetRelid(table), InvalidOid, true) == RLS_ENABLED)
		return false;
	if (writing && (table->trigdesc != NULL ||
					(table->rd_att->constr != NULL && table->rd_att->constr->num_check > 0)))
		return false;
	if (!OidIsValid(shape.index))
		shape.index = idem_primary_key_index(table);
	return OidIsValid(shape.index);
}

/*
 * The primary key must be exactly the columns scope and key, plain and in
 * either order, for an equality probe on it to be the SQL lookup. Worked out
 * once per shape, with each column's position in the index. Call after
 * fast_path_applies, which works out the table's column numbers and finds the
 * index, with that index open.
 */
static bool
key_index_order(Relation index)
{
	Form_pg_index form = index->rd_index;

	Assert(RelationGetRelid(index) == shape.index);
	if (shape.index_known)
		return shape.index_probes;
	shape.index_probes = false;
	shape.scope_column = shape.key_column = InvalidAttrNumber;
	if (form->indnatts == 2 && form->indnkeyatts == 2 && index->rd_rel->relam == BTREE_AM_OID &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL))
	{
		for (int i = 0; i < 2; i++)
		{
			if (form->indkey.values[i] == shape.attnums[KEY_COL_SCOPE])
				shape.scope_column = i + 1;
			else if (form->indkey.values[i] == shape.attnums[KEY_COL_KEY])
				shape.key_column = i + 1;
		}
		shape.index_probes = shape.scope_column != InvalidAttrNumber && shape.key_column != InvalidAttrNumber;
	}
	shape.index_known = true;
	return shape.index_probes;
}

#define COLUMN_BIT(column) KEY_COLUMN_BIT(column)
#define FIRST_COLUMNS(n) (COLUMN_BIT(n) - 1)

/*
 * The privilege the statement would need on the columns it names (a set of COLUMN_BITs), checked as the
 * executor checks it (ExecCheckPermissions): the table's privilege, or else the same privilege on each of
 * those columns. The columns are found by name: on Citus the table checked is the distributed one, not the
 * shard read.
 */
static void
require_privilege(Oid relid, AclMode mode, uint32 columns)
{
	key_require_columns(relid, mode, columns, false);
}

void
key_require_columns(Oid relid, AclMode mode, uint32 columns, bool fencing_number)
{
	Oid			user = GetUserId();

	if (pg_class_aclcheck(relid, user, mode) == ACLCHECK_OK)
		return;
	if (fencing_number)
	{
		AttrNumber	attnum = get_attnum(relid, "fencing_number");

		if (attnum == InvalidAttrNumber || pg_attribute_aclcheck(relid, attnum, user, mode) != ACLCHECK_OK)
			aclcheck_error(ACLCHECK_NO_PRIV, get_relkind_objtype(get_rel_relkind(relid)), get_rel_name(relid));
	}
	for (int c = 0; c < KEY_COLUMNS; c++)
	{
		AttrNumber	attnum;

		if ((columns & COLUMN_BIT(c)) == 0)
			continue;
		attnum = get_attnum(relid, key_column_names[c]);
		if (attnum == InvalidAttrNumber || pg_attribute_aclcheck(relid, attnum, user, mode) != ACLCHECK_OK)
			aclcheck_error(ACLCHECK_NO_PRIV, get_relkind_objtype(get_rel_relkind(relid)), get_rel_name(relid));
	}
}

/* The lookup statement selects every key column, the scope and key among them. */
void
key_require_select(const KeyTable *key_table, Oid relid)
{
	require_privilege(relid, ACL_SELECT,
					  FIRST_COLUMNS(KEY_COLUMNS_OF(key_table->has_lease_columns, key_table->has_bytes_columns)));
}

/* The insert statement names the eight 1.0 columns, and the response's bytes in a table with them. */
void
key_require_insert(const KeyTable *key_table, Oid relid)
{
	require_privilege(relid, ACL_INSERT, FIRST_COLUMNS(KEY_COLUMNS_1_0) |
					  (key_table->has_bytes_columns ? COLUMN_BIT(KEY_COL_RESPONSE_CONTENT_TYPE) |
					   COLUMN_BIT(KEY_COL_RESPONSE_BYTES) : 0));
}

/* The row in the scan slot, deformed once, through the key store's one decoder. */
void
key_read_row(TupleTableSlot *slot, const AttrNumber *attnums, bool has_lease_columns, bool has_bytes_columns,
			 KeyRow *out, MemoryContext context)
{
	Datum		values[KEY_COLUMNS];
	bool		nulls[KEY_COLUMNS];
	AttrNumber	last = 0;

	for (int c = 0; c < KEY_COLUMNS; c++)
		last = Max(last, attnums[c]);
	slot_getsomeattrs(slot, last);
	for (int c = 0; c < KEY_COLUMNS; c++)
	{
		AttrNumber	attnum = attnums[c];

		values[c] = attnum == InvalidAttrNumber ? (Datum) 0 : slot->tts_values[attnum - 1];
		nulls[c] = attnum == InvalidAttrNumber || slot->tts_isnull[attnum - 1];
	}
	key_row_decode(values, nulls, has_lease_columns, has_bytes_columns, out, context);
}

bool
key_direct_lookup(const KeyTable *key_table, const KeyRef *ref, LookupSnapshot which, KeyRow *out)
{
	MemoryContext context = CurrentMemoryContext;
	Relation	table = key_table->direct;
	Relation	index;
	ScanKeyData keys[2];
	Snapshot	snapshot;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	AttrNumber	scope_column;
	AttrNumber	key_column;

	memset(out, 0, sizeof(*out));
	if (!fast_path_applies(key_table, false))
		return false;
	index = index_open(shape.index, AccessShareLock);
	if (!key_index_order(index))
	{
		index_close(index, NoLock);
		return false;
	}
	key_require_select(key_table, key_table->keys);

	scope_column = shape.scope_column;
	key_column = shape.key_column;

	/* As a new SQL statement would: see this transaction's own earlier writes. */
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(which == LOOKUP_LATEST_SNAPSHOT ? GetLatestSnapshot()
								: GetTransactionSnapshot());
	/* Scan keys in index column order. */
	ScanKeyEntryInitialize(&keys[key_column - 1], 0, key_column, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[key_column - 1], F_TEXTEQ,
						   PointerGetDatum(ref->key));
	ScanKeyEntryInitialize(&keys[scope_column - 1], 0, scope_column, BTEqualStrategyNumber,
						   InvalidOid, index->rd_indcollation[scope_column - 1], F_TEXTEQ,
						   PointerGetDatum(ref->scope));
	slot = table_slot_create(table, NULL);
	scan = idem_index_beginscan(table, index, snapshot, 2, 0);
	index_rescan(scan, keys, 2, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
		key_read_row(slot, shape.attnums, key_table->has_lease_columns, key_table->has_bytes_columns, out, context);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	index_close(index, NoLock);
	return true;
}

/* The key row's heap tuple: fast_path_applies made sure no column but the key columns exists. */
HeapTuple
key_form_row(TupleDesc desc, const AttrNumber *attnums, const KeyRef *ref, const KeyWrite *row)
{
	Datum	   *values = palloc0(desc->natts * sizeof(Datum));
	bool	   *nulls = palloc(desc->natts * sizeof(bool));
	bytea	   *hash = key_hash_bytea(row->request_hash);

	memset(nulls, true, desc->natts * sizeof(bool));

#define SET_COLUMN(column, value, isnull) \
	(values[attnums[column] - 1] = (value), nulls[attnums[column] - 1] = (isnull))
	SET_COLUMN(KEY_COL_EXPIRES_AT, TimestampTzGetDatum(row->expires_at), false);
	SET_COLUMN(KEY_COL_CREATED_AT, TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()), false);
	SET_COLUMN(KEY_COL_HTTP_STATUS, Int32GetDatum(row->response.http_status), false);
	SET_COLUMN(KEY_COL_SCOPE, PointerGetDatum(ref->scope), false);
	SET_COLUMN(KEY_COL_KEY, PointerGetDatum(ref->key), false);
	SET_COLUMN(KEY_COL_REQUEST_HASH, PointerGetDatum(hash), false);
	SET_COLUMN(KEY_COL_RESPONSE_HEADERS, row->response.headers, row->response.headers_null);
	SET_COLUMN(KEY_COL_RESPONSE_BODY, row->response.body, row->response.body_null);
	if (attnums[KEY_COL_RESPONSE_BYTES] != InvalidAttrNumber)
	{
		SET_COLUMN(KEY_COL_RESPONSE_CONTENT_TYPE, row->response.content_type, row->response.content_type_null);
		SET_COLUMN(KEY_COL_RESPONSE_BYTES, row->response.bytes, row->response.bytes_null);
	}
#undef SET_COLUMN
	return heap_form_tuple(desc, values, nulls);
}

/*
 * The common case: the primary key is the table's only index, immediate and on
 * the plain columns. Its one entry is inserted with the unique check a
 * constraint does, without an executor state. Whether that is the case, and
 * the index's IndexInfo, are worked out once per shape.
 */
static bool
insert_with_primary_key_only(Relation table, const KeyRef *ref, HeapTuple row)
{
	Relation	index;
	Datum		entry[2];
	bool		entry_nulls[2] = {false, false};

	if (shape.insert_known && !shape.index_only)
		return false;
	if (!shape.insert_known)
	{
		List	   *indexes = RelationGetIndexList(table);

		shape.index_only = list_length(indexes) == 1 && linitial_oid(indexes) == shape.index;
		list_free(indexes);
		if (!shape.index_only)
		{
			shape.insert_known = true;
			return false;
		}
	}
	index = index_open(shape.index, RowExclusiveLock);
	if (!shape.insert_known)
	{
		MemoryContext old = MemoryContextSwitchTo(shape_context);

		shape.index_only = index->rd_index->indimmediate && index->rd_index->indisready && key_index_order(index);
		shape.index_info = shape.index_only ? BuildIndexInfo(index) : NULL;
		MemoryContextSwitchTo(old);
		shape.insert_known = true;
	}
	if (!shape.index_only)
	{
		index_close(index, NoLock);
		return false;
	}
	entry[shape.scope_column - 1] = PointerGetDatum(ref->scope);
	entry[shape.key_column - 1] = PointerGetDatum(ref->key);
	heap_insert(table, row, GetCurrentCommandId(true), 0, NULL);
	index_insert(index, entry, entry_nulls, &row->t_self, table, UNIQUE_CHECK_YES, false, shape.index_info);
	index_close(index, NoLock);
	return true;
}

/* Any other set of indexes: the executor's own index maintenance keeps every one. */
void
key_insert_with_executor(Relation table, HeapTuple row)
{
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *result = makeNode(ResultRelInfo);
	TupleTableSlot *slot;

	InitResultRelInfo(result, table, 1, NULL, 0);
	idem_check_valid_insert_rel(result);
	ExecOpenIndices(result, false);
	slot = ExecInitExtraTupleSlot(estate, RelationGetDescr(table), &TTSOpsHeapTuple);
	ExecStoreHeapTuple(row, slot, false);
	table_tuple_insert(table, slot, GetCurrentCommandId(true), 0, NULL);
	idem_insert_index_tuples(result, slot, estate);
	ExecCloseIndices(result);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
}

bool
key_direct_insert(const KeyTable *key_table, const KeyRef *ref, const KeyWrite *row)
{
	Relation	table = key_table->direct;
	HeapTuple	tuple;

	if (!fast_path_applies(key_table, true))
		return false;
	key_require_insert(key_table, key_table->keys);
	tuple = key_form_row(RelationGetDescr(table), shape.attnums, ref, row);
	if (!insert_with_primary_key_only(table, ref, tuple))
		key_insert_with_executor(table, tuple);
	return true;
}
