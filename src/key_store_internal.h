/*
 * key_store_internal.h: the paths' interface, below the facade (key_store.h,
 * key_store.c) and above the shared types (key_store_types.h): the columns of
 * a key row and their one decoder (key_store_row.c), the active table of one
 * call, the direct paths (key_store_direct.c, key_store_partitioned.c) and the
 * prepared statements (key_store_spi.c). Nothing outside the key store includes
 * it; key_store.c calls the paths, the paths call only the decoder and never
 * the facade.
 */
#ifndef IDEM_KEY_STORE_INTERNAL_H
#define IDEM_KEY_STORE_INTERNAL_H

#include "access/htup.h"
#include "executor/tuptable.h"
#include "utils/acl.h"
#include "utils/relcache.h"

#include "key_store_types.h"

/* The columns of a key row, in the order the decoder takes them. */
typedef enum KeyColumn
{
	KEY_COL_EXPIRES_AT,
	KEY_COL_CREATED_AT,
	KEY_COL_HTTP_STATUS,
	KEY_COL_SCOPE,
	KEY_COL_KEY,
	KEY_COL_REQUEST_HASH,
	KEY_COL_RESPONSE_HEADERS,
	KEY_COL_RESPONSE_BODY,
	/* added by the 1.1 update; a table still at 1.0 lacks them */
	KEY_COL_LEASE_UNTIL,
	KEY_COL_LEASE_TOKEN,
	KEY_COL_RECOVERY_POINT,
	KEY_COL_RECOVERY_STATE,
	/* added by the 1.3 update (issue 30): a response stored as bytes */
	KEY_COL_RESPONSE_CONTENT_TYPE,
	KEY_COL_RESPONSE_BYTES,
	KEY_COLUMNS
} KeyColumn;

#define KEY_COLUMNS_1_0 KEY_COL_LEASE_UNTIL
#define KEY_COLUMNS_1_2 KEY_COL_RESPONSE_CONTENT_TYPE

/* How many of the columns, in KeyColumn order, a table has. */
#define KEY_COLUMNS_OF(has_lease_columns, has_bytes_columns) \
	((has_bytes_columns) ? KEY_COLUMNS : (has_lease_columns) ? KEY_COLUMNS_1_2 : KEY_COLUMNS_1_0)

extern const char *const key_column_names[KEY_COLUMNS];
extern const Oid key_column_types[KEY_COLUMNS];

/* The active table of one call, found once. */
typedef struct KeyTable
{
	Oid			namespace_oid;
	Oid			keys;			/* idempotency_keys, locked: the table the statements name, whose privileges apply */
	Relation	direct;			/* open for the direct path: idempotency_keys, or on Citus the scope's local shard
								 * (citus.c); NULL: the statements only */
	bool		partitioned;	/* the rows live in idempotency_keys_partitioned */
	bool		direct_partitioned;	/* partitioned, and the direct path may try it (key_store_partitioned.c) */
	Oid			partitioned_oid;	/* idempotency_keys_partitioned, InvalidOid if missing */
	bool		has_lease_columns;	/* the table is at 1.1 or later */
	bool		has_bytes_columns;	/* the table is at 1.3 or later */
	bool		has_fencing_column;	/* 1.4: the row keeps its last fencing number */
} KeyTable;

/*
 * The one decoder (key_store_row.c): fills out from one row's values in
 * KeyColumn order (created_at, scope and key unused).
 */
void		key_row_decode(const Datum *values, const bool *nulls, bool has_lease_columns,
						   bool has_bytes_columns, KeyRow *out, MemoryContext context);

/* The request hash as the request_hash column's bytea, palloc'd in the current context (key_store_row.c). */
bytea	   *key_hash_bytea(const uint8 hash[IDEM_SHA256_BYTES]);

/* Where a relation's descriptor has the key columns, and whether the direct paths may read and write it. */
typedef struct KeyShape
{
	AttrNumber	attnums[KEY_COLUMNS];	/* InvalidAttrNumber: a 1.1 column of a 1.0 table */
	bool		readable;		/* the key columns exist with their types */
	bool		writable;		/* and a heap tuple of them is what INSERT would store */
} KeyShape;

/* A set of key columns, one bit per KeyColumn. */
#define KEY_COLUMN_BIT(column) (UINT32_C(1) << (column))

/* What both direct paths share (key_store_direct.c). */
void		key_shape_of(TupleDesc desc, bool has_lease_columns, bool has_bytes_columns, KeyShape *out);
/* The privileges the lookup and the insert statement would need on relid, checked as the executor does. */
void		key_require_select(const KeyTable *table, Oid relid);
void		key_require_insert(const KeyTable *table, Oid relid);
/*
 * The privilege mode on the columns a statement names (KEY_COLUMN_BITs, and 1.4's fencing_number if
 * fencing_number), checked as the executor does: the table's privilege, or else that of each column.
 */
void		key_require_columns(Oid relid, AclMode mode, uint32 columns, bool fencing_number);
/* The row in a scan slot, its columns at attnums, through the one decoder. */
void		key_read_row(TupleTableSlot *slot, const AttrNumber *attnums, bool has_lease_columns,
						 bool has_bytes_columns, KeyRow *out, MemoryContext context);
/* A completed claim's heap tuple for a relation whose only columns are the key columns at attnums. */
HeapTuple	key_form_row(TupleDesc desc, const AttrNumber *attnums, const KeyRef *ref, const KeyWrite *row);
/* The insert with the executor's own index maintenance, for any set of indexes. */
void		key_insert_with_executor(Relation table, HeapTuple row);

/* The direct path (key_store_direct.c); false when it does not apply to this table and nothing was done. */
bool		key_direct_lookup(const KeyTable *table, const KeyRef *ref, LookupSnapshot snapshot,
							  KeyRow *out);
bool		key_direct_insert(const KeyTable *table, const KeyRef *ref, const KeyWrite *row);

/*
 * The direct path for partitioned storage (key_store_partitioned.c); false when it does not apply and nothing
 * was done. key_partitioned_forget is called from the facade's relcache callback.
 */
bool		key_partitioned_lookup(const KeyTable *table, const KeyRef *ref, LookupSnapshot snapshot,
								   KeyRow *out);
bool		key_partitioned_insert(const KeyTable *table, const KeyRef *ref, const KeyWrite *row);
/* A completed claim's row where a lapsed lease's live row is replaced (an UPDATE), else inserted. */
bool		key_partitioned_replace(const KeyTable *table, const KeyRef *ref, const KeyWrite *row);
/* The lease writes, as key_spi_take_lease and key_spi_change_lease (*changed: the token was current). */
bool		key_partitioned_take_lease(const KeyTable *table, const KeyRef *ref, LeaseTake how,
									   LeaseGrant *grant);
bool		key_partitioned_change_lease(const KeyTable *table, const KeyRef *ref, const pg_uuid_t *token,
										 LeaseChange change, const LeaseChangeValues *values, bool *changed,
										 TimestampTz *lease_until);
void		key_partitioned_forget(Oid relid);

/* The prepared statements (key_store_spi.c). */
void		key_spi_lookup(const KeyTable *table, const KeyRef *ref, LookupSnapshot snapshot,
						   KeyRow *out);
void		key_spi_write(const KeyTable *table, const KeyRef *ref, const KeyWrite *row);
void		key_spi_take_lease(const KeyTable *table, const KeyRef *ref, LeaseTake how,
							   LeaseGrant *grant);
bool		key_spi_change_lease(const KeyTable *table, const KeyRef *ref, const pg_uuid_t *token,
								 LeaseChange change, const LeaseChangeValues *values,
								 TimestampTz *lease_until);

#endif
