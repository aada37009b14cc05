/* key_store.c: reads and writes of the active table: the fast path where it applies, else three prepared statements. */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "access/relation.h"
#include "utils/datum.h"
#include "utils/rel.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "key_direct.h"
#include "key_store.h"

/* The three statements against one of the two tables. */
typedef struct TablePlans
{
	SPIPlanPtr	lookup;
	SPIPlanPtr	insert;
	SPIPlanPtr	replace_expired;
} TablePlans;

typedef struct StorePlans
{
	Oid			namespace_oid;
	char		namespace_name[NAMEDATALEN];
	TablePlans	table;			/* idempotency_keys */
	TablePlans	partitioned;	/* idempotency_keys_partitioned */
} StorePlans;

static StorePlans plans;

/* Parameters of insert and replace_expired, in this order. */
#define WRITE_PARAMS 8
static Oid	write_param_types[WRITE_PARAMS] = {
	TIMESTAMPTZOID,				/* $1 expires_at */
	TIMESTAMPTZOID,				/* $2 created_at, also "now" for the expiry test */
	INT4OID,					/* $3 http_status */
	TEXTOID,					/* $4 scope */
	TEXTOID,					/* $5 key */
	BYTEAOID,					/* $6 request_hash */
	JSONBOID,					/* $7 response_headers */
	JSONBOID					/* $8 response_body */
};

static SPIPlanPtr
prepare_kept(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

	if (plan == NULL)
		elog(ERROR, "idempotency: could not prepare \"%s\": %s", sql,
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "idempotency: could not keep a prepared plan");
	return plan;
}

static void
forget_table_plans(TablePlans *table)
{
	if (table->lookup)
		SPI_freeplan(table->lookup);
	if (table->insert)
		SPI_freeplan(table->insert);
	if (table->replace_expired)
		SPI_freeplan(table->replace_expired);
	memset(table, 0, sizeof(*table));
}

/*
 * In partitioned storage an expired row and its replacement never coexist
 * (the replacement moves the row), but the lookup still prefers the live one.
 */
static void
prepare_table_plans(TablePlans *table, const char *schema, const char *relname, bool partitioned)
{
	const char *qualified = psprintf("%s.%s", schema, relname);
	Oid			lookup_types[2] = {TEXTOID, TEXTOID};

	table->lookup = prepare_kept(psprintf(
		"SELECT expires_at, request_hash, http_status, response_body, response_headers"
		" FROM %s WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2%s",
		qualified, partitioned ? " ORDER BY expires_at DESC LIMIT 1" : ""), 2, lookup_types);
	table->insert = prepare_kept(psprintf(
		"INSERT INTO %s (expires_at, created_at, http_status, scope, key, request_hash,"
		" response_headers, response_body) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
		qualified), WRITE_PARAMS, write_param_types);
	table->replace_expired = prepare_kept(psprintf(
		"UPDATE %s SET expires_at = $1, created_at = $2, http_status = $3,"
		" request_hash = $6, response_headers = $7, response_body = $8"
		" WHERE scope OPERATOR(pg_catalog.=) $4 AND key OPERATOR(pg_catalog.=) $5"
		" AND expires_at OPERATOR(pg_catalog.<=) $2",
		qualified), WRITE_PARAMS, write_param_types);
}

/* The plans for one storage mode. The table lives in the schema of the extension's functions. */
static TablePlans *
plans_for(Oid namespace_oid, bool partitioned)
{
	char	   *namespace_name = get_namespace_name(namespace_oid);
	const char *schema;

	if (namespace_name == NULL)
		elog(ERROR, "idempotency: the extension's schema %u is gone", namespace_oid);
	if (plans.table.lookup == NULL || plans.namespace_oid != namespace_oid ||
		strcmp(plans.namespace_name, namespace_name) != 0)
	{
		forget_table_plans(&plans.table);
		forget_table_plans(&plans.partitioned);
		schema = quote_identifier(namespace_name);
		prepare_table_plans(&plans.table, schema, "idempotency_keys", false);
		prepare_table_plans(&plans.partitioned, schema, "idempotency_keys_partitioned", true);
		plans.namespace_oid = namespace_oid;
		strlcpy(plans.namespace_name, namespace_name, NAMEDATALEN);
	}
	return partitioned ? &plans.partitioned : &plans.table;
}

static Oid
plain_table(Oid namespace_oid)
{
	Oid			table_oid = get_relname_relid("idempotency_keys", namespace_oid);

	if (!OidIsValid(table_oid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("idempotency: table idempotency_keys is missing from the extension's schema")));
	return table_oid;
}

/*
 * The OID of idempotency_keys in the extension's schema, remembered per backend:
 * a lookup by name on every call otherwise. Any relcache invalidation of the
 * table (rename, drop) or a full reset forgets it.
 */
static struct
{
	Oid			namespace_oid;
	Oid			table_oid;		/* InvalidOid: nothing remembered */
} located;

static void
forget_located_table(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == located.table_oid)
		located.table_oid = InvalidOid;
}

static Oid
locate_table(Oid namespace_oid)
{
	static bool callback_registered = false;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(forget_located_table, (Datum) 0);
		callback_registered = true;
	}
	if (!OidIsValid(located.table_oid) || located.namespace_oid != namespace_oid)
	{
		located.table_oid = plain_table(namespace_oid);
		located.namespace_oid = namespace_oid;
	}
	return located.table_oid;
}

/*
 * Opens idempotency_keys and tells whether it is the inactive table. Locking it
 * before reading its mode marker pins the mode until this transaction ends:
 * idem_set_storage needs an ACCESS EXCLUSIVE lock on it to switch.
 */
static Relation
open_plain_table(Oid table_oid, bool *inactive)
{
	Relation	table = relation_open(table_oid, AccessShareLock);
	TupleConstr *constraints = RelationGetDescr(table)->constr;

	*inactive = false;
	for (int i = 0; constraints != NULL && i < constraints->num_check; i++)
		*inactive |= strcmp(constraints->check[i].ccname, "idempotency_keys_inactive") == 0;
	return table;
}

static bool
plain_table_inactive(Oid table_oid)
{
	bool		inactive;

	relation_close(open_plain_table(table_oid, &inactive), NoLock);
	return inactive;
}

bool
key_store_partitioned(Oid namespace_oid)
{
	return plain_table_inactive(locate_table(namespace_oid));
}

static void
copy_row(StoredResponse *out, MemoryContext caller_context)
{
	TupleDesc	desc = SPI_tuptable->tupdesc;
	HeapTuple	row = SPI_tuptable->vals[0];
	bool		isnull;
	Datum		value;
	bytea	   *hash;
	MemoryContext spi_context;

	out->found = true;
	out->expires_at = DatumGetTimestampTz(SPI_getbinval(row, desc, 1, &isnull));
	hash = DatumGetByteaPP(SPI_getbinval(row, desc, 2, &isnull));
	if (isnull || VARSIZE_ANY_EXHDR(hash) != IDEM_SHA256_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("idempotency: a stored request_hash is not 32 bytes")));
	memcpy(out->request_hash, VARDATA_ANY(hash), IDEM_SHA256_BYTES);
	value = SPI_getbinval(row, desc, 3, &out->http_status_null);
	out->http_status = out->http_status_null ? 0 : DatumGetInt32(value);

	spi_context = MemoryContextSwitchTo(caller_context);
	value = SPI_getbinval(row, desc, 4, &out->body_null);
	out->body = out->body_null ? (Datum) 0 : datumCopy(value, false, -1);
	value = SPI_getbinval(row, desc, 5, &out->headers_null);
	out->headers = out->headers_null ? (Datum) 0 : datumCopy(value, false, -1);
	MemoryContextSwitchTo(spi_context);
}

void
key_store_lookup(const KeyRef *ref, LookupSnapshot snapshot, StoredResponse *out)
{
	MemoryContext caller_context = CurrentMemoryContext;
	Datum		values[2] = {PointerGetDatum(ref->scope), PointerGetDatum(ref->key)};
	Oid			namespace_oid = get_func_namespace(ref->extension_function);
	bool		partitioned;
	Relation	plain;
	bool		done;
	TablePlans *table;
	int			rc;

	plain = open_plain_table(locate_table(namespace_oid), &partitioned);
	done = !partitioned && direct_lookup(plain, ref, snapshot, out);
	relation_close(plain, NoLock);
	if (done)
		return;

	memset(out, 0, sizeof(*out));
	SPI_connect();
	table = plans_for(namespace_oid, partitioned);
	if (snapshot == LOOKUP_LATEST_SNAPSHOT)
		rc = SPI_execute_snapshot(table->lookup, values, NULL, GetLatestSnapshot(),
								  InvalidSnapshot, false, false, 1);
	else
		rc = SPI_execute_plan(table->lookup, values, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "idempotency: key lookup failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
		copy_row(out, caller_context);
	SPI_finish();
}

static bytea *
hash_as_bytea(const uint8 hash[IDEM_SHA256_BYTES])
{
	bytea	   *result = palloc(VARHDRSZ + IDEM_SHA256_BYTES);

	SET_VARSIZE(result, VARHDRSZ + IDEM_SHA256_BYTES);
	memcpy(VARDATA(result), hash, IDEM_SHA256_BYTES);
	return result;
}

void
key_store_write(const KeyRef *ref, const TxnClaim *claim, const ResponseToStore *response)
{
	Datum		values[WRITE_PARAMS];
	char		nulls[WRITE_PARAMS];
	int			rc;
	TablePlans *table;
	Oid			namespace_oid = get_func_namespace(ref->extension_function);
	bool		partitioned;
	Relation	plain;
	bool		done;

	plain = open_plain_table(locate_table(namespace_oid), &partitioned);
	done = !partitioned && !claim->replaces_expired_row &&
		direct_insert(plain, ref, claim, response);
	relation_close(plain, NoLock);
	if (done)
		return;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = TimestampTzGetDatum(claim->expires_at);
	values[1] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[2] = Int32GetDatum(response->http_status);
	values[3] = PointerGetDatum(ref->scope);
	values[4] = PointerGetDatum(ref->key);
	values[5] = PointerGetDatum(hash_as_bytea(claim->request_hash));
	values[6] = response->headers;
	nulls[6] = response->headers_null ? 'n' : ' ';
	values[7] = response->body;
	nulls[7] = response->body_null ? 'n' : ' ';

	SPI_connect();
	table = plans_for(namespace_oid, partitioned);
	if (claim->replaces_expired_row)
	{
		rc = SPI_execute_plan(table->replace_expired, values, nulls, false, 0);
		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "idempotency: replacing an expired key failed: %s",
				 SPI_result_code_string(rc));
		/* Zero rows: a cleanup removed the expired row meanwhile, so insert. */
		if (SPI_processed == 1)
		{
			SPI_finish();
			return;
		}
	}
	rc = SPI_execute_plan(table->insert, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT || SPI_processed != 1)
		elog(ERROR, "idempotency: storing the response failed: %s",
			 SPI_result_code_string(rc));
	SPI_finish();
}
