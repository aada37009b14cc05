/* key_store.c: the key store's API (key_store.h); finds the active table once per call and chooses the path. */
#include "postgres.h"

#include "access/relation.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "commands/sequence.h"
#include "partitioning/partdesc.h"
#include "storage/lmgr.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "citus.h"
#include "key_store.h"
#include "key_store_internal.h"
#include "maintenance.h"
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
	bool		has_fencing_column;
	bool		mode_known;
	bool		partitioned;
} located;

/*
 * The fencing sequence found (fencing_number_floor), remembered per backend: its
 * lookup reads pg_extension and pg_depend. Any relcache invalidation of it (DROP,
 * as DROP EXTENSION does; a rename or a move to another schema) forgets it, in
 * forget_located_table, which is the one relcache callback of this file
 * (PostgreSQL has room for few). A database still at 1.1 is looked at again
 * on every grant, until its update makes the sequence.
 */
static struct
{
	Oid			namespace_oid;
	Oid			sequence;		/* InvalidOid: not known */
} fencing;

/*
 * How many times forget_located_table forgot the table: lock_key_table compares it across its lock, which
 * takes in the invalidations committed before it (an update's ALTER TABLE among them).
 */
static uint64 located_forgotten = 0;

static void
forget_located_table(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == fencing.sequence)
		fencing.sequence = InvalidOid;
	if (!OidIsValid(relid) || relid == located.table_oid || relid == located.twin_oid)
		located.mode_known = false;
	key_partitioned_forget(relid);
	if (!OidIsValid(relid) || relid == located.table_oid)
	{
		located.table_oid = InvalidOid;
		located_forgotten++;
	}
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
	located.has_fencing_column = get_attnum(table_oid, "fencing_number") != InvalidAttrNumber;
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
 * Locks idempotency_keys and tells which table holds the rows. Locking it
 * (first, in idem_set_storage's order) pins the mode until this transaction
 * ends: idem_set_storage needs an ACCESS EXCLUSIVE lock on it to switch. Taking
 * the lock also takes in the invalidations of a switch committed before, so a
 * remembered mode read after it is current.
 *
 * The same lock takes in those of an ALTER EXTENSION ... UPDATE (or a rename,
 * a drop) committed since this backend found the table, which forget it: as
 * RangeVarGetRelidExtended does, the table is found, locked, and found again
 * if it was forgotten meanwhile, so what the call uses (the columns above all)
 * is the table as it is under the lock.
 */
static void
lock_key_table(Oid namespace_oid, KeyTable *table)
{
	for (;;)
	{
		uint64		forgotten;
		Oid			table_oid;

		locate_table(namespace_oid);
		forgotten = located_forgotten;
		table_oid = located.table_oid;
		LockRelationOid(table_oid, AccessShareLock);
		if (located_forgotten == forgotten)
			break;
		UnlockRelationOid(table_oid, AccessShareLock);
	}
	table->namespace_oid = namespace_oid;
	table->keys = located.table_oid;
	table->direct = NULL;
	table->has_lease_columns = located.has_lease_columns;
	table->has_bytes_columns = located.has_bytes_columns;
	table->has_fencing_column = located.has_fencing_column;
	if (!located.mode_known)
	{
		located.partitioned = twin_has_range_partitions();
		located.mode_known = true;
	}
	table->partitioned = located.partitioned;
	table->partitioned_oid = located.twin_oid;
}

/*
 * The schema of each extension function met, remembered per backend (a catalog
 * lookup on every call otherwise). ALTER FUNCTION ... SET SCHEMA and DROP
 * FUNCTION change pg_proc, whose invalidation forgets all of them; a function
 * made again (DROP and CREATE EXTENSION) has a new OID.
 */
#define FUNCTION_SCHEMAS 8
static struct
{
	Oid			function;
	Oid			namespace_oid;
} function_schemas[FUNCTION_SCHEMAS];
static int	function_schemas_next = 0;

static void
forget_function_schemas(Datum arg, int cacheid, uint32 hashvalue)
{
	memset(function_schemas, 0, sizeof(function_schemas));
}

static Oid
function_schema(Oid function)
{
	static bool callback_registered = false;
	Oid			namespace_oid;

	if (!callback_registered)
	{
		CacheRegisterSyscacheCallback(PROCOID, forget_function_schemas, (Datum) 0);
		callback_registered = true;
	}
	for (int i = 0; i < FUNCTION_SCHEMAS; i++)
		if (function_schemas[i].function == function && OidIsValid(function))
			return function_schemas[i].namespace_oid;
	namespace_oid = get_func_namespace(function);
	if (!OidIsValid(namespace_oid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("idempotency: function %u was dropped while it ran", function)));
	function_schemas[function_schemas_next].function = function;
	function_schemas[function_schemas_next].namespace_oid = namespace_oid;
	function_schemas_next = (function_schemas_next + 1) % FUNCTION_SCHEMAS;
	return namespace_oid;
}

/* What a call does with its key. */
typedef enum KeyAccess
{
	KEY_STATEMENTS,				/* the statements only */
	KEY_READ,					/* a lookup, on the direct path where it applies */
	KEY_INSERT,					/* an insert, on the direct path where it applies */
	KEY_UPDATE					/* an update: the direct path of partitioned storage where it applies */
} KeyAccess;

/*
 * The table of one call, and for the direct path the relation that holds the scope's keys here, opened once:
 * idempotency_keys itself, or on Citus the scope's local shard (citus.c, which also refuses a call made on a
 * node without the scope's shard). Partitioned storage takes its own direct path (key_store_partitioned.c),
 * which locks the partitions it uses; citus.c refuses it on a distributed key table.
 */
static void
open_key_table(const KeyRef *ref, KeyAccess access, KeyTable *table)
{
	Oid			rows;
	bool		direct;

	lock_key_table(function_schema(ref->extension_function), table);
	/* Updates take the direct path in partitioned storage only (table storage's are statements). */
	direct = access == KEY_READ || access == KEY_INSERT || (access == KEY_UPDATE && table->partitioned);
	rows = citus_key_relation(table->keys, table->partitioned, ref->scope, direct);
	table->direct_partitioned = direct && table->partitioned && rows == table->keys;
	/* A read of idempotency_keys itself needs no lock beyond the one lock_key_table took. */
	if ((access == KEY_READ || access == KEY_INSERT) && OidIsValid(rows) && !table->partitioned)
		table->direct = relation_open(rows, access == KEY_INSERT ? RowExclusiveLock
									  : rows == table->keys ? NoLock : AccessShareLock);
}

static void
close_key_table(KeyTable *table)
{
	if (table->direct != NULL)
		relation_close(table->direct, NoLock);
}

bool
key_store_partitioned(Oid namespace_oid)
{
	KeyTable	table;

	lock_key_table(namespace_oid, &table);
	return table.partitioned;
}

void
key_store_lookup(const KeyRef *ref, LookupSnapshot snapshot, KeyRow *out)
{
	KeyTable	table;

	open_key_table(ref, KEY_READ, &table);
	if (table.direct_partitioned ? !key_partitioned_lookup(&table, ref, snapshot, out)
		: table.direct == NULL || !key_direct_lookup(&table, ref, snapshot, out))
		key_spi_lookup(&table, ref, snapshot, out);
	close_key_table(&table);
}

void
key_store_write(const KeyRef *ref, const KeyWrite *row)
{
	KeyTable	table;

	/*
	 * Replacing an expired row or a lapsed lease's is an UPDATE: the statements in table storage; partitioned
	 * storage's direct path updates a lapsed lease's live row and inserts beside an expired one.
	 */
	open_key_table(ref, !row->replaces_expired_row ? KEY_INSERT : KEY_UPDATE, &table);
	if (table.direct_partitioned
		? !(row->replaces_expired_row ? key_partitioned_replace(&table, ref, row)
			: key_partitioned_insert(&table, ref, row))
		: table.direct == NULL || !key_direct_insert(&table, ref, row))
		key_spi_write(&table, ref, row);
	close_key_table(&table);
}

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
 * The floor of the next fencing number: the next value of the extension's own
 * sequence (1.2), found in the extension's schema and taken only if the
 * extension owns it (pg_depend): in a database still at 1.1 a sequence of that
 * name is someone else's. The caller needs no privilege on it: the number comes
 * with a grant, which the key's lock makes exclusive. 0 when the database is
 * still at 1.1.
 *
 * 1.4 (issue 38): never below the clock either, in microseconds since
 * 2000-01-01 UTC (about 8.5e14 in 2027, 2^53 in the year 2285), because the
 * sequence does not travel with logical replication and goes back with a
 * point-in-time recovery or an older dump: a grant made later on any server
 * whose clock is not behind the earlier one's gets a higher number. The
 * statement that writes the row then raises it above the number the key's row
 * last carried (key_spi_take_lease), for a key granted again sooner than the
 * clock tells apart or with the clock stepped back.
 */
static int64
fencing_number_floor(Oid namespace_oid)
{
	Oid			sequence;

	locate_table(namespace_oid);	/* registers forget_located_table */
	if (!OidIsValid(fencing.sequence) || fencing.namespace_oid != namespace_oid)
	{
		sequence = maintenance_member_relation(namespace_oid, "idempotency_fencing_numbers");
		if (!OidIsValid(sequence) || get_rel_relkind(sequence) != RELKIND_SEQUENCE)
			return 0;
		fencing.namespace_oid = namespace_oid;
		fencing.sequence = sequence;
	}
	return Max(nextval_internal(fencing.sequence, false), (int64) GetCurrentTimestamp());
}

/*
 * Lease writes are UPDATEs: the statements in table storage, partitioned storage's direct path where it
 * applies (key_store_partitioned.c: an extension or takeover can move the row to another partition).
 */
void
key_store_take_lease(const KeyRef *ref, LeaseTake how, LeaseGrant *grant)
{
	KeyTable	table;

	open_key_table(ref, KEY_UPDATE, &table);
	require_lease_columns(&table);
	grant->fencing_number = fencing_number_floor(table.namespace_oid);
	if (!table.direct_partitioned || !key_partitioned_take_lease(&table, ref, how, grant))
		key_spi_take_lease(&table, ref, how, grant);
	close_key_table(&table);
}

bool
key_store_change_lease(const KeyRef *ref, const pg_uuid_t *token, LeaseChange change,
					   const LeaseChangeValues *values, TimestampTz *lease_until)
{
	KeyTable	table;
	bool		changed;

	open_key_table(ref, KEY_UPDATE, &table);
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

		if (!table.direct_partitioned || !key_partitioned_lookup(&table, ref, LOOKUP_LATEST_SNAPSHOT, &current))
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
	if (!table.direct_partitioned ||
		!key_partitioned_change_lease(&table, ref, token, change, values, &changed, lease_until))
		changed = key_spi_change_lease(&table, ref, token, change, values, lease_until);
	close_key_table(&table);
	return changed;
}
