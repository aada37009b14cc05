/* key_store.c: finds the active table once per call, chooses the path, decodes rows. */
#include "postgres.h"

#include "access/relation.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "access/xact.h"
#include "partitioning/partdesc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/rel.h"

#include "key_store.h"
#include "pg_compat.h"

const char *const key_column_names[KEY_COLUMNS] = {
	"expires_at", "created_at", "http_status", "scope", "key", "request_hash",
	"response_headers", "response_body",
	"lease_until", "lease_token", "recovery_point", "recovery_state"
};

const Oid	key_column_types[KEY_COLUMNS] = {
	TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID, TEXTOID, TEXTOID, BYTEAOID, JSONBOID, JSONBOID,
	TIMESTAMPTZOID, UUIDOID, TEXTOID, JSONBOID
};

/*
 * The OIDs of idempotency_keys and its partitioned twin in the extension's
 * schema, whether the table has the 1.1 columns, and the storage mode,
 * remembered per backend: lookups and a second lock on every call otherwise.
 * Any relcache invalidation of the table (rename, drop, ALTER TABLE ... ADD
 * COLUMN in an update) or a full reset forgets all of it; one of the twin (a
 * partition attached or dropped, as every switch does) forgets the mode.
 */
static struct
{
	Oid			namespace_oid;
	Oid			table_oid;		/* InvalidOid: nothing remembered */
	Oid			twin_oid;		/* idempotency_keys_partitioned */
	bool		has_lease_columns;
	bool		mode_known;
	bool		partitioned;
} located;

static void
forget_located_table(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == located.table_oid || relid == located.twin_oid)
		located.mode_known = false;
	if (!OidIsValid(relid) || relid == located.table_oid)
		located.table_oid = InvalidOid;
}

static void
locate_table(Oid namespace_oid)
{
	static bool callback_registered = false;
	Oid			table_oid;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(forget_located_table, (Datum) 0);
		callback_registered = true;
	}
	if (OidIsValid(located.table_oid) && located.namespace_oid == namespace_oid)
		return;
	table_oid = get_relname_relid("idempotency_keys", namespace_oid);
	if (!OidIsValid(table_oid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("idempotency: table idempotency_keys is missing from the extension's schema")));
	located.has_lease_columns = get_attnum(table_oid, "lease_until") != InvalidAttrNumber;
	located.twin_oid = get_relname_relid("idempotency_keys_partitioned", namespace_oid);
	located.mode_known = false;
	located.namespace_oid = namespace_oid;
	located.table_oid = table_oid;
}

/*
 * Whether the twin idempotency_keys_partitioned has range partitions beside its
 * default one. That is the storage mode: idem_set_storage makes them when it
 * switches to partitioned and drops them all when it switches back, the newest
 * is never dropped, and pg_dump writes them with their ATTACH, so a restored
 * database comes back in the mode it was dumped in (a marker on an extension
 * table would come back as the fresh install made it).
 */
static bool
twin_has_range_partitions(void)
{
	Relation	twin;
	bool		partitioned;

	if (!OidIsValid(located.twin_oid))
		return false;
	twin = relation_open(located.twin_oid, AccessShareLock);
	partitioned = RelationGetPartitionDesc(twin, true)->nparts > 1;
	relation_close(twin, NoLock);
	return partitioned;
}

/*
 * Opens idempotency_keys and tells which table holds the rows. Locking it
 * (first, in idem_set_storage's order) pins the mode until this transaction
 * ends: idem_set_storage needs an ACCESS EXCLUSIVE lock on it to switch. Taking
 * the lock also takes in the invalidations of a switch committed before, so a
 * remembered mode read after it is current.
 */
static void
open_key_table(Oid namespace_oid, KeyTable *table)
{
	locate_table(namespace_oid);
	table->namespace_oid = namespace_oid;
	table->has_lease_columns = located.has_lease_columns;
	table->plain = relation_open(located.table_oid, AccessShareLock);
	if (!located.mode_known)
	{
		located.partitioned = twin_has_range_partitions();
		located.mode_known = true;
	}
	table->partitioned = located.partitioned;
	table->partitioned_oid = located.twin_oid;
}

static void
close_key_table(KeyTable *table)
{
	relation_close(table->plain, NoLock);
}

bool
key_store_partitioned(Oid namespace_oid)
{
	KeyTable	table;

	open_key_table(namespace_oid, &table);
	close_key_table(&table);
	return table.partitioned;
}

static Datum
copy_varlena(Datum value, bool isnull, MemoryContext context)
{
	MemoryContext old;

	if (isnull)
		return (Datum) 0;
	old = MemoryContextSwitchTo(context);
	value = PointerGetDatum(PG_DETOAST_DATUM_COPY(value));
	MemoryContextSwitchTo(old);
	return value;
}

void
key_row_decode(const Datum *values, const bool *nulls, bool has_lease_columns, KeyRow *out,
			   MemoryContext context)
{
	bytea	   *hash;

	memset(out, 0, sizeof(*out));
	out->found = true;
	out->expires_at = DatumGetTimestampTz(values[KEY_COL_EXPIRES_AT]);
	hash = nulls[KEY_COL_REQUEST_HASH] ? NULL : DatumGetByteaPP(values[KEY_COL_REQUEST_HASH]);
	if (hash == NULL || VARSIZE_ANY_EXHDR(hash) != IDEM_SHA256_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("idempotency: a stored request_hash is not 32 bytes")));
	memcpy(out->request_hash, VARDATA_ANY(hash), IDEM_SHA256_BYTES);
	out->http_status_null = nulls[KEY_COL_HTTP_STATUS];
	out->http_status = out->http_status_null ? 0 : DatumGetInt32(values[KEY_COL_HTTP_STATUS]);
	out->body_null = nulls[KEY_COL_RESPONSE_BODY];
	out->body = copy_varlena(values[KEY_COL_RESPONSE_BODY], out->body_null, context);
	out->headers_null = nulls[KEY_COL_RESPONSE_HEADERS];
	out->headers = copy_varlena(values[KEY_COL_RESPONSE_HEADERS], out->headers_null, context);

	out->recovery_point_null = out->recovery_state_null = true;
	if (!has_lease_columns)
		return;
	out->leased = out->http_status_null && !nulls[KEY_COL_LEASE_UNTIL];
	if (!nulls[KEY_COL_LEASE_UNTIL])
		out->lease_until = DatumGetTimestampTz(values[KEY_COL_LEASE_UNTIL]);
	if (!nulls[KEY_COL_LEASE_TOKEN])
		out->lease_token = *DatumGetUUIDP(values[KEY_COL_LEASE_TOKEN]);
	out->recovery_point_null = nulls[KEY_COL_RECOVERY_POINT];
	out->recovery_point = copy_varlena(values[KEY_COL_RECOVERY_POINT], out->recovery_point_null,
									   context);
	out->recovery_state_null = nulls[KEY_COL_RECOVERY_STATE];
	out->recovery_state = copy_varlena(values[KEY_COL_RECOVERY_STATE], out->recovery_state_null,
									   context);
}

void
key_store_lookup(const KeyRef *ref, LookupSnapshot snapshot, KeyRow *out)
{
	KeyTable	table;
	bool		done;

	open_key_table(get_func_namespace(ref->extension_function), &table);
	done = !table.partitioned && key_direct_lookup(&table, ref, snapshot, out);
	if (!done)
		key_spi_lookup(&table, ref, snapshot, out);
	close_key_table(&table);
}

void
key_store_write(const KeyRef *ref, const TxnClaim *claim, const ResponseToStore *response)
{
	KeyTable	table;
	bool		done;

	open_key_table(get_func_namespace(ref->extension_function), &table);
	done = !table.partitioned && !claim->replaces_expired_row &&
		key_direct_insert(&table, ref, claim, response);
	if (!done)
		key_spi_write(&table, ref, claim, response);
	close_key_table(&table);
}

/* Lease writes always take the statements: they are rare next to lookups, and UPDATEs. */
static void
require_lease_columns(const KeyTable *table)
{
	if (!table->has_lease_columns)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency lease mode needs the extension at version 1.1"),
				 errhint("Run ALTER EXTENSION idempotency UPDATE.")));
}

/*
 * The next fencing number, from the extension's own sequence (1.2), found by
 * the OID of the extension's schema. The caller needs no privilege on it: the
 * number comes with a grant, which the key's lock makes exclusive. 0 when the
 * database is still at 1.1 (no sequence yet).
 */
static int64
next_fencing_number(Oid namespace_oid)
{
	Oid			sequence = get_relname_relid("idempotency_fencing_numbers", namespace_oid);

	if (!OidIsValid(sequence) || get_rel_relkind(sequence) != RELKIND_SEQUENCE)
		return 0;
	return nextval_internal(sequence, false);
}

void
key_store_take_lease(const KeyRef *ref, LeaseTake how, LeaseGrant *grant)
{
	KeyTable	table;

	open_key_table(get_func_namespace(ref->extension_function), &table);
	require_lease_columns(&table);
	key_spi_take_lease(&table, ref, how, grant);
	grant->fencing_number = next_fencing_number(table.namespace_oid);
	close_key_table(&table);
}

bool
key_store_change_lease(const KeyRef *ref, const pg_uuid_t *token, LeaseChange change,
					   const LeaseChangeValues *values, TimestampTz *lease_until)
{
	KeyTable	table;
	bool		changed;

	open_key_table(get_func_namespace(ref->extension_function), &table);
	require_lease_columns(&table);
	/*
	 * Under REPEATABLE READ and SERIALIZABLE an UPDATE of a row changed since the
	 * snapshot fails with 40001. Whether the token is still current is read from
	 * the latest committed state first, so a stale holder gets 55000 there too;
	 * 40001 remains only when the same holder changed the row in another
	 * transaction after this one's snapshot (a heartbeat's extend, say).
	 */
	if (IsolationUsesXactSnapshot())
	{
		KeyRow		current;

		key_spi_lookup(&table, ref, LOOKUP_LATEST_SNAPSHOT, &current);
		if (!current.found || !current.http_status_null || !current.leased ||
			current.expires_at <= GetCurrentTransactionStartTimestamp() ||
			memcmp(&current.lease_token, token, sizeof(pg_uuid_t)) != 0)
		{
			close_key_table(&table);
			*lease_until = 0;
			return false;
		}
	}
	changed = key_spi_change_lease(&table, ref, token, change, values, lease_until);
	close_key_table(&table);
	return changed;
}
