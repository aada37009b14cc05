/* key_store.c: the key store's API (key_store.h); finds the active table once per call and chooses the path. */
#include "postgres.h"

#include "access/relation.h"
#include "utils/acl.h"
#include "catalog/pg_class.h"
#include "commands/sequence.h"
#include "access/xact.h"
#include "partitioning/partdesc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/rel.h"

#include "citus.h"
#include "key_store.h"
#include "key_store_internal.h"
#include "pg_compat.h"

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
	bool		has_bytes_columns;
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
	located.has_bytes_columns = get_attnum(table_oid, "response_bytes") != InvalidAttrNumber;
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
	table->has_bytes_columns = located.has_bytes_columns;
	table->plain = relation_open(located.table_oid, AccessShareLock);
	table->shell = NULL;
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
	if (table->shell != NULL)
		relation_close(table->shell, NoLock);
}

bool
key_store_partitioned(Oid namespace_oid)
{
	KeyTable	table;

	open_key_table(namespace_oid, &table);
	close_key_table(&table);
	return table.partitioned;
}

/*
 * The table the direct path works on: idempotency_keys itself, or on Citus the scope's local shard (locked
 * by citus.c; the direct path checks the distributed table's privileges, as a statement on it would). False:
 * take the statements.
 */
static bool
direct_table(KeyTable *table, const KeyRef *ref, AclMode mode)
{
	Oid			shard = InvalidOid;

	if (!citus_route_key_call(table->plain, table->partitioned, ref->scope, &shard))
		return !table->partitioned;
	if (!OidIsValid(shard))
		return false;
	table->shell = table->plain;
	table->plain = relation_open(shard, mode == ACL_SELECT ? AccessShareLock : RowExclusiveLock);
	return true;
}

/* The direct path did not apply on the shard after all: the statements run on the distributed table. */
static void
back_to_shell(KeyTable *table)
{
	if (table->shell == NULL)
		return;
	relation_close(table->plain, NoLock);
	table->plain = table->shell;
	table->shell = NULL;
}

void
key_store_lookup(const KeyRef *ref, LookupSnapshot snapshot, KeyRow *out)
{
	KeyTable	table;
	bool		done;

	open_key_table(get_func_namespace(ref->extension_function), &table);
	done = direct_table(&table, ref, ACL_SELECT) && key_direct_lookup(&table, ref, snapshot, out);
	if (!done)
	{
		back_to_shell(&table);
		key_spi_lookup(&table, ref, snapshot, out);
	}
	close_key_table(&table);
}

void
key_store_write(const KeyRef *ref, const KeyWrite *row)
{
	KeyTable	table;
	bool		done;

	open_key_table(get_func_namespace(ref->extension_function), &table);
	done = !row->replaces_expired_row && direct_table(&table, ref, ACL_INSERT) &&
		key_direct_insert(&table, ref, row);
	if (!done)
	{
		back_to_shell(&table);
		key_spi_write(&table, ref, row);
	}
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
	(void) citus_route_key_call(table.plain, table.partitioned, ref->scope, NULL);
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
	(void) citus_route_key_call(table.plain, table.partitioned, ref->scope, NULL);
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
