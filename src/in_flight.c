/*
 * in_flight.c: per-backend slots of the keys claimed and not yet completed,
 * and idem_keys_in_flight_claims(), which lists them as the caller may see them.
 *
 * Writing (the claiming backend, in txn_claims.c's step) takes no lock: the
 * owner bumps its slot's change counter, copies the entry, bumps it again.
 * A reader copies a slot and retries until the counter was even and the same
 * before and after, as PgBackendStatus is read for pg_stat_activity.
 *
 * Reading applies what SELECT on the active key table would: the privilege
 * (else ERROR 42501), and, when row level security is active for the caller,
 * the table's SELECT policies on a row made of the claim's scope, key and
 * since (as created_at), every other column NULL.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rls.h"
#include "utils/timestamp.h"

#include "idem_core.h"
#include "in_flight.h"
#include "key_store.h"
#include "pg_compat.h"
#include "shmem.h"

PG_FUNCTION_INFO_V1(idem_keys_in_flight_claims);

typedef struct InFlightKey
{
	TimestampTz since;
	uint16		scope_len;
	uint16		key_len;
	char		scope[IDEM_MAX_SCOPE_BYTES];
	char		key[IDEM_MAX_KEY_BYTES];
} InFlightKey;

typedef struct InFlightSlot
{
	int			changecount;	/* odd while the owner writes */
	int			pid;			/* 0: no backend uses the slot */
	Oid			database;
	int			listed;			/* keys[0 .. listed) */
	int			unlisted;		/* held claims beyond the listed ones */
	TimestampTz unlisted_since; /* when the first of them was claimed */
	InFlightKey keys[IN_FLIGHT_KEYS_PER_BACKEND];
} InFlightSlot;

typedef struct InFlightShared
{
	int			slot_count;
	InFlightSlot slots[FLEXIBLE_ARRAY_MEMBER];
} InFlightShared;

static InFlightShared *shared = NULL;

/* This backend's slot, taken at its first claim, and the identities of its listed keys. */
static InFlightSlot *my_slot = NULL;
static uint8 listed_identity[IN_FLIGHT_KEYS_PER_BACKEND][IDEM_SHA256_BYTES];

/* The owner's write bracket: no error can happen inside (a critical section, as for pgstat). */
#define BEGIN_SLOT_WRITE(slot) \
	do { \
		START_CRIT_SECTION(); \
		(slot)->changecount++; \
		pg_write_barrier(); \
	} while (0)
#define END_SLOT_WRITE(slot) \
	do { \
		pg_write_barrier(); \
		(slot)->changecount++; \
		END_CRIT_SECTION(); \
	} while (0)

static Size
in_flight_size(void)
{
	return add_size(offsetof(InFlightShared, slots), mul_size(MaxBackends, sizeof(InFlightSlot)));
}

static void
init_in_flight(void *block)
{
	InFlightShared *in_flight = block;

	memset(in_flight, 0, in_flight_size());
	in_flight->slot_count = MaxBackends;
}

void
in_flight_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	shmem_request_block_sized("idempotency keys in flight", in_flight_size, (void **) &shared,
							  init_in_flight);
}

static void
release_slot(int code, Datum arg)
{
	InFlightSlot *slot = my_slot;

	if (slot == NULL)
		return;
	BEGIN_SLOT_WRITE(slot);
	slot->pid = 0;
	slot->listed = 0;
	slot->unlisted = 0;
	END_SLOT_WRITE(slot);
	my_slot = NULL;
}

/* This backend's slot; NULL without shared memory or for a process without a backend number. */
static InFlightSlot *
own_slot(void)
{
	int			index;
	InFlightSlot *slot;

	if (my_slot != NULL || shared == NULL)
		return my_slot;
	index = idem_my_backend_index();
	if (index < 0 || index >= shared->slot_count)
		return NULL;
	slot = &shared->slots[index];
	BEGIN_SLOT_WRITE(slot);
	slot->pid = MyProcPid;
	slot->database = MyDatabaseId;
	slot->listed = 0;
	slot->unlisted = 0;
	END_SLOT_WRITE(slot);
	my_slot = slot;
	before_shmem_exit(release_slot, (Datum) 0);
	return slot;
}

void
in_flight_publish(const uint8 identity[IDEM_SHA256_BYTES], const char *scope, int scope_len,
				  const char *key, int key_len, TimestampTz since)
{
	InFlightSlot *slot = own_slot();
	int			position;

	if (slot == NULL)
		return;
	position = slot->listed;
	BEGIN_SLOT_WRITE(slot);
	if (position < IN_FLIGHT_KEYS_PER_BACKEND)
	{
		InFlightKey *entry = &slot->keys[position];

		entry->since = since;
		entry->scope_len = Min(scope_len, IDEM_MAX_SCOPE_BYTES);
		entry->key_len = Min(key_len, IDEM_MAX_KEY_BYTES);
		memcpy(entry->scope, scope, entry->scope_len);
		memcpy(entry->key, key, entry->key_len);
		slot->listed = position + 1;
	}
	else if (slot->unlisted++ == 0)
		slot->unlisted_since = since;
	END_SLOT_WRITE(slot);
	if (position < IN_FLIGHT_KEYS_PER_BACKEND)
		memcpy(listed_identity[position], identity, IDEM_SHA256_BYTES);
}

void
in_flight_unpublish(const uint8 identity[IDEM_SHA256_BYTES])
{
	InFlightSlot *slot = my_slot;
	int			last;
	int			position;

	if (slot == NULL)
		return;
	last = slot->listed - 1;
	for (position = last; position >= 0; position--)
		if (memcmp(listed_identity[position], identity, IDEM_SHA256_BYTES) == 0)
			break;
	if (position < 0 && slot->unlisted == 0)
		return;
	BEGIN_SLOT_WRITE(slot);
	if (position < 0)
		slot->unlisted--;
	else
	{
		/* The last entry fills the gap. */
		if (position != last)
			memcpy(&slot->keys[position], &slot->keys[last], sizeof(InFlightKey));
		slot->listed = last;
	}
	END_SLOT_WRITE(slot);
	if (position >= 0 && position != last)
		memcpy(listed_identity[position], listed_identity[last], IDEM_SHA256_BYTES);
}

void
in_flight_clear(void)
{
	InFlightSlot *slot = my_slot;

	if (slot == NULL || (slot->listed == 0 && slot->unlisted == 0))
		return;
	BEGIN_SLOT_WRITE(slot);
	slot->listed = 0;
	slot->unlisted = 0;
	END_SLOT_WRITE(slot);
}

/* ---------- reading ---------- */

/* A consistent copy of a slot: its header, and its keys if it is a backend of this database. */
static void
read_slot(InFlightSlot *slot, InFlightSlot *copy)
{
	for (;;)
	{
		int			before;
		int			after;

		before = slot->changecount;
		pg_read_barrier();
		copy->pid = slot->pid;
		copy->database = slot->database;
		copy->listed = Max(0, Min(slot->listed, IN_FLIGHT_KEYS_PER_BACKEND));
		copy->unlisted = slot->unlisted;
		copy->unlisted_since = slot->unlisted_since;
		if (copy->pid != 0 && copy->database == MyDatabaseId)
			memcpy(copy->keys, slot->keys, copy->listed * sizeof(InFlightKey));
		pg_read_barrier();
		after = slot->changecount;
		if (before == after && (before & 1) == 0)
			return;
		CHECK_FOR_INTERRUPTS();
	}
}

typedef struct ClaimRow
{
	text	   *scope;			/* NULL for an unlisted claim */
	text	   *key;
	int			pid;
	TimestampTz since;
	bool		visible;
} ClaimRow;

/*
 * The query that tells which of the claims ($1 scopes, $2 keys, $3 sinces) the
 * table's policies let through for the current user, as they would a row: the
 * permissive SELECT (or ALL) policies that apply to the user ORed, the
 * restrictive ones ANDed. NULL when no permissive policy applies: nothing then.
 */
static const char *const policy_query_sql =
"SELECT CASE WHEN pg_catalog.bool_or(p.polpermissive) THEN pg_catalog.format("
"  'SELECT e.n FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) WITH ORDINALITY AS e(scope, key, since, n)"
"   WHERE EXISTS (SELECT FROM (SELECT %s) AS %I WHERE (%s)%s)',"
"  (SELECT pg_catalog.string_agg("
"       CASE a.attname WHEN 'scope' THEN 'e.scope' WHEN 'key' THEN 'e.key'"
"                      WHEN 'created_at' THEN 'e.since' ELSE 'NULL' END"
"       OPERATOR(pg_catalog.||) '::' OPERATOR(pg_catalog.||) pg_catalog.format_type(a.atttypid, a.atttypmod)"
"       OPERATOR(pg_catalog.||) COALESCE((SELECT pg_catalog.format(' COLLATE %I.%I', cn.nspname, c.collname)"
"            FROM pg_catalog.pg_collation c JOIN pg_catalog.pg_namespace cn"
"                 ON cn.oid OPERATOR(pg_catalog.=) c.collnamespace"
"            WHERE c.oid OPERATOR(pg_catalog.=) a.attcollation), '')"
"       OPERATOR(pg_catalog.||) ' AS ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(a.attname),"
"       ', ' ORDER BY a.attnum)"
"   FROM pg_catalog.pg_attribute a"
"   WHERE a.attrelid OPERATOR(pg_catalog.=) $1 AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped),"
"  (SELECT c.relname FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) $1),"
"  pg_catalog.string_agg('(' OPERATOR(pg_catalog.||) pg_catalog.pg_get_expr(p.polqual, p.polrelid)"
"                        OPERATOR(pg_catalog.||) ')', ' OR ') FILTER (WHERE p.polpermissive),"
"  COALESCE(pg_catalog.string_agg(' AND (' OPERATOR(pg_catalog.||)"
"                        pg_catalog.pg_get_expr(p.polqual, p.polrelid) OPERATOR(pg_catalog.||) ')', '')"
"                      FILTER (WHERE NOT p.polpermissive), ''))"
" END"
" FROM pg_catalog.pg_policy p"
" WHERE p.polrelid OPERATOR(pg_catalog.=) $1 AND p.polqual IS NOT NULL"
"   AND p.polcmd OPERATOR(pg_catalog.=) ANY ('{r,*}'::\"char\"[])"
"   AND EXISTS (SELECT FROM pg_catalog.unnest(p.polroles) AS r(role)"
"               WHERE CASE WHEN r.role OPERATOR(pg_catalog.=) 0 THEN true"
"                          ELSE pg_catalog.pg_has_role(r.role, 'USAGE') END)";

/* Marks the listed claims that the table's policies let the current user see. */
static void
apply_policies(Oid relid, ClaimRow *rows, int count)
{
	Datum	   *scopes = palloc(sizeof(Datum) * count);
	Datum	   *keys = palloc(sizeof(Datum) * count);
	Datum	   *sinces = palloc(sizeof(Datum) * count);
	int		   *positions = palloc(sizeof(int) * count);
	int			listed = 0;
	Oid			policy_arg_types[1] = {OIDOID};
	Datum		policy_args[1];
	Oid			filter_arg_types[3] = {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID};
	Datum		filter_args[3];
	char	   *filter;
	bool		isnull;

	for (int i = 0; i < count; i++)
	{
		rows[i].visible = false;
		if (rows[i].scope == NULL)
			continue;
		scopes[listed] = PointerGetDatum(rows[i].scope);
		keys[listed] = PointerGetDatum(rows[i].key);
		sinces[listed] = TimestampTzGetDatum(rows[i].since);
		positions[listed++] = i;
	}
	if (listed == 0)
		return;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "idempotency: SPI_connect failed");
	policy_args[0] = ObjectIdGetDatum(relid);
	if (SPI_execute_with_args(policy_query_sql, 1, policy_arg_types, policy_args, NULL,
							  true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idempotency: could not read the policies of the key table");
	filter = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	if (filter != NULL)
	{
		filter_args[0] = PointerGetDatum(construct_array(scopes, listed, TEXTOID, -1, false, TYPALIGN_INT));
		filter_args[1] = PointerGetDatum(construct_array(keys, listed, TEXTOID, -1, false, TYPALIGN_INT));
		filter_args[2] = PointerGetDatum(construct_array(sinces, listed, TIMESTAMPTZOID, sizeof(TimestampTz),
														 FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		if (SPI_execute_with_args(filter, 3, filter_arg_types, filter_args, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "idempotency: could not apply the policies of the key table");
		for (uint64 row = 0; row < SPI_processed; row++)
		{
			int64		n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[row],
														SPI_tuptable->tupdesc, 1, &isnull));

			if (!isnull && n >= 1 && n <= listed)
				rows[positions[n - 1]].visible = true;
		}
	}
	SPI_finish();
}

/*
 * idem_keys_in_flight_claims(): the transactional claims held in this database
 * (scope, key, pid, since), as the caller may see them. A claim beyond the
 * IN_FLIGHT_KEYS_PER_BACKEND listed ones of its transaction is a row with NULL
 * scope and key, shown only to callers row level security does not restrict.
 */
Datum
idem_keys_in_flight_claims(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			namespace_oid = get_func_namespace(fcinfo->flinfo->fn_oid);
	Oid			relid;
	const char *relname;
	AclResult	acl;
	bool		restricted;
	InFlightSlot *copy;
	ClaimRow   *rows = NULL;
	int			count = 0;
	int			capacity = 0;

	InitMaterializedSRF(fcinfo, 0);

	relname = key_store_partitioned(namespace_oid) ? "idempotency_keys_partitioned" : "idempotency_keys";
	relid = get_relname_relid(relname, namespace_oid);
	if (!OidIsValid(relid))
		elog(ERROR, "idempotency: table %s not found", relname);
	acl = pg_class_aclcheck(relid, GetUserId(), ACL_SELECT);
	if (acl != ACLCHECK_OK)
		aclcheck_error(acl, OBJECT_TABLE, relname);
	/* ERROR 42501 as for a SELECT when row_security is off and policies would apply. */
	restricted = check_enable_rls(relid, InvalidOid, false) == RLS_ENABLED;

	if (shared == NULL)
	{
		ereport(NOTICE,
				(errmsg("idempotency: transactional claims are not listed"),
				 errdetail("idempotency is not in shared_preload_libraries; only leases are seen.")));
		return (Datum) 0;
	}

	copy = palloc(sizeof(InFlightSlot));
	for (int i = 0; i < shared->slot_count; i++)
	{
		read_slot(&shared->slots[i], copy);
		if (copy->pid == 0 || copy->database != MyDatabaseId)
			continue;
		if (count + copy->listed + copy->unlisted > capacity)
		{
			capacity = Max(2 * capacity, count + copy->listed + copy->unlisted + 16);
			rows = rows ? repalloc(rows, sizeof(ClaimRow) * capacity)
				: palloc(sizeof(ClaimRow) * capacity);
		}
		for (int k = 0; k < copy->listed; k++)
		{
			rows[count].scope = cstring_to_text_with_len(copy->keys[k].scope, copy->keys[k].scope_len);
			rows[count].key = cstring_to_text_with_len(copy->keys[k].key, copy->keys[k].key_len);
			rows[count].pid = copy->pid;
			rows[count].since = copy->keys[k].since;
			rows[count++].visible = true;
		}
		for (int k = 0; k < copy->unlisted; k++)
		{
			rows[count].scope = NULL;
			rows[count].key = NULL;
			rows[count].pid = copy->pid;
			rows[count].since = copy->unlisted_since;
			rows[count++].visible = true;
		}
	}

	if (restricted && count > 0)
		apply_policies(relid, rows, count);

	for (int i = 0; i < count; i++)
	{
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};

		if (!rows[i].visible)
			continue;
		nulls[0] = nulls[1] = rows[i].scope == NULL;
		values[0] = PointerGetDatum(rows[i].scope);
		values[1] = PointerGetDatum(rows[i].key);
		values[2] = Int32GetDatum(rows[i].pid);
		values[3] = TimestampTzGetDatum(rows[i].since);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
