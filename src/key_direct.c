/* key_direct.c: index and heap access to idempotency_keys without SQL. */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "utils/acl.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "key_direct.h"

enum
{
	COL_EXPIRES_AT,
	COL_CREATED_AT,
	COL_HTTP_STATUS,
	COL_SCOPE,
	COL_KEY,
	COL_REQUEST_HASH,
	COL_RESPONSE_HEADERS,
	COL_RESPONSE_BODY,
	KEY_COLUMNS
};

static const char *const column_names[KEY_COLUMNS] = {
	"expires_at", "created_at", "http_status", "scope", "key", "request_hash",
	"response_headers", "response_body"
};

/* Attribute numbers of the columns, looked up once per table. */
static Oid	columns_table = InvalidOid;
static AttrNumber columns[KEY_COLUMNS];

static bool
resolve_columns(Relation table)
{
	TupleDesc	desc = RelationGetDescr(table);

	if (columns_table == RelationGetRelid(table))
		return true;
	for (int c = 0; c < KEY_COLUMNS; c++)
	{
		columns[c] = InvalidAttrNumber;
		for (int i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute attr = TupleDescAttr(desc, i);

			if (!attr->attisdropped && strcmp(NameStr(attr->attname), column_names[c]) == 0)
				columns[c] = attr->attnum;
		}
		if (columns[c] == InvalidAttrNumber)
			return false;
	}
	columns_table = RelationGetRelid(table);
	return true;
}

/* The conditions under which index and heap calls do what the SQL statements would. */
static bool
fast_path_applies(Relation table, bool writing)
{
	if (table->rd_rel->relkind != RELKIND_RELATION || !resolve_columns(table))
		return false;
	if (check_enable_rls(RelationGetRelid(table), InvalidOid, true) == RLS_ENABLED)
		return false;
	if (writing && (table->trigdesc != NULL ||
					(table->rd_att->constr != NULL && table->rd_att->constr->num_check > 0)))
		return false;
	return OidIsValid(RelationGetPrimaryKeyIndex(table));
}

/*
 * The primary key must be exactly the columns scope and key, plain and in
 * either order, for an equality probe on it to be the SQL lookup. Returns
 * each column's position in the index.
 */
static bool
key_index_order(Relation index, AttrNumber *scope_column, AttrNumber *key_column)
{
	Form_pg_index form = index->rd_index;

	if (form->indnatts != 2 || form->indnkeyatts != 2 || index->rd_rel->relam != BTREE_AM_OID ||
		!heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) ||
		!heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL))
		return false;
	*scope_column = *key_column = InvalidAttrNumber;
	for (int i = 0; i < 2; i++)
	{
		if (form->indkey.values[i] == columns[COL_SCOPE])
			*scope_column = i + 1;
		else if (form->indkey.values[i] == columns[COL_KEY])
			*key_column = i + 1;
	}
	return *scope_column != InvalidAttrNumber && *key_column != InvalidAttrNumber;
}

static void
require_privilege(Relation table, AclMode mode)
{
	AclResult	result = pg_class_aclcheck(RelationGetRelid(table), GetUserId(), mode);

	if (result != ACLCHECK_OK)
		aclcheck_error(result, OBJECT_TABLE, RelationGetRelationName(table));
}

static Datum
copy_varlena(TupleTableSlot *slot, int column, bool *isnull, MemoryContext context)
{
	Datum		value = slot_getattr(slot, columns[column], isnull);
	MemoryContext old;

	if (*isnull)
		return (Datum) 0;
	old = MemoryContextSwitchTo(context);
	value = PointerGetDatum(PG_DETOAST_DATUM_COPY(value));
	MemoryContextSwitchTo(old);
	return value;
}

static void
read_row(TupleTableSlot *slot, StoredResponse *out, MemoryContext context)
{
	bool		isnull;
	bytea	   *hash;
	Datum		value;

	out->found = true;
	out->expires_at = DatumGetTimestampTz(slot_getattr(slot, columns[COL_EXPIRES_AT], &isnull));
	hash = DatumGetByteaPP(slot_getattr(slot, columns[COL_REQUEST_HASH], &isnull));
	if (isnull || VARSIZE_ANY_EXHDR(hash) != IDEM_SHA256_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("idempotency: a stored request_hash is not 32 bytes")));
	memcpy(out->request_hash, VARDATA_ANY(hash), IDEM_SHA256_BYTES);
	value = slot_getattr(slot, columns[COL_HTTP_STATUS], &out->http_status_null);
	out->http_status = out->http_status_null ? 0 : DatumGetInt32(value);
	out->body = copy_varlena(slot, COL_RESPONSE_BODY, &out->body_null, context);
	out->headers = copy_varlena(slot, COL_RESPONSE_HEADERS, &out->headers_null, context);
}

bool
direct_lookup(Oid table_oid, const KeyRef *ref, LookupSnapshot which, StoredResponse *out)
{
	MemoryContext context = CurrentMemoryContext;
	Relation	table = table_open(table_oid, AccessShareLock);
	Relation	index;
	ScanKeyData keys[2];
	Snapshot	snapshot;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	AttrNumber	scope_column;
	AttrNumber	key_column;

	memset(out, 0, sizeof(*out));
	if (!fast_path_applies(table, false))
	{
		table_close(table, NoLock);
		return false;
	}
	index = index_open(RelationGetPrimaryKeyIndex(table), AccessShareLock);
	if (!key_index_order(index, &scope_column, &key_column))
	{
		index_close(index, NoLock);
		table_close(table, NoLock);
		return false;
	}
	require_privilege(table, ACL_SELECT);

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
	scan = index_beginscan(table, index, snapshot, 2, 0);
	index_rescan(scan, keys, 2, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
		read_row(slot, out, context);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	index_close(index, NoLock);
	table_close(table, NoLock);
	return true;
}

bool
direct_insert(Oid table_oid, const KeyRef *ref, const TxnClaim *claim, const ResponseToStore *response)
{
	Relation	table = table_open(table_oid, RowExclusiveLock);
	TupleDesc	desc = RelationGetDescr(table);
	Datum	   *values;
	bool	   *nulls;
	bytea	   *hash;
	EState	   *estate;
	ResultRelInfo *result;
	TupleTableSlot *slot;

	if (!fast_path_applies(table, true))
	{
		table_close(table, NoLock);
		return false;
	}
	require_privilege(table, ACL_INSERT);

	values = palloc0(desc->natts * sizeof(Datum));
	nulls = palloc(desc->natts * sizeof(bool));
	memset(nulls, true, desc->natts * sizeof(bool));
	hash = palloc(VARHDRSZ + IDEM_SHA256_BYTES);
	SET_VARSIZE(hash, VARHDRSZ + IDEM_SHA256_BYTES);
	memcpy(VARDATA(hash), claim->request_hash, IDEM_SHA256_BYTES);

#define SET_COLUMN(column, value, isnull) \
	(values[columns[column] - 1] = (value), nulls[columns[column] - 1] = (isnull))
	SET_COLUMN(COL_EXPIRES_AT, TimestampTzGetDatum(claim->expires_at), false);
	SET_COLUMN(COL_CREATED_AT, TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()), false);
	SET_COLUMN(COL_HTTP_STATUS, Int32GetDatum(response->http_status), false);
	SET_COLUMN(COL_SCOPE, PointerGetDatum(ref->scope), false);
	SET_COLUMN(COL_KEY, PointerGetDatum(ref->key), false);
	SET_COLUMN(COL_REQUEST_HASH, PointerGetDatum(hash), false);
	SET_COLUMN(COL_RESPONSE_HEADERS, response->headers, response->headers_null);
	SET_COLUMN(COL_RESPONSE_BODY, response->body, response->body_null);
#undef SET_COLUMN

	/* The executor's own index maintenance, so every index on the table is kept. */
	estate = CreateExecutorState();
	result = makeNode(ResultRelInfo);
	InitResultRelInfo(result, table, 1, NULL, 0);
	CheckValidResultRel(result, CMD_INSERT);
	ExecOpenIndices(result, false);
	slot = ExecInitExtraTupleSlot(estate, desc, &TTSOpsHeapTuple);
	ExecStoreHeapTuple(heap_form_tuple(desc, values, nulls), slot, false);
	table_tuple_insert(table, slot, GetCurrentCommandId(true), 0, NULL);
	ExecInsertIndexTuples(result, slot, estate, false, false, NULL, NIL);
	ExecCloseIndices(result);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
	table_close(table, NoLock);
	return true;
}
