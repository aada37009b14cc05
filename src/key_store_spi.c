/*
 * key_store_spi.c: the key store's prepared statements, for whatever the direct paths do not take (table
 * storage's lease writes among them; partitioned storage's where its direct path does not apply).
 */
#include "postgres.h"

#include "access/relation.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/inval.h"

#include "key_store_internal.h"
#include "spi_plan.h"

/* The statements against one of the two tables. */
typedef struct TablePlans
{
	SPIPlanPtr	lookup;
	SPIPlanPtr	insert;
	SPIPlanPtr	replace;
	/* lease mode, only for a table with the 1.1 columns */
	SPIPlanPtr	lease_insert;
	SPIPlanPtr	lease_replace;
	SPIPlanPtr	lease_change[LEASE_CHANGES];	/* by LeaseChange */
} TablePlans;

static struct
{
	Oid			namespace_oid;
	char		namespace_name[NAMEDATALEN];
	bool		has_lease_columns;
	bool		has_bytes_columns;
	bool		has_fencing_column;
	TablePlans	table;			/* idempotency_keys */
	TablePlans	partitioned;	/* idempotency_keys_partitioned, generic plans */
	TablePlans	partitioned_pruned; /* the same, planned per call: see plans_for() */
} plans;

/* Parameters of the lookup: $1 scope, $2 key, and in partitioned storage $3, live rows' lower bound. */
enum
{
	LOOKUP_PARAM_SCOPE,
	LOOKUP_PARAM_KEY,
	LOOKUP_PARAM_LIVE_AFTER,
	LOOKUP_PARAMS
};

/* Parameters of insert and replace, in this order ($1 .. $8). */
enum
{
	WRITE_PARAM_EXPIRES_AT,
	WRITE_PARAM_CREATED_AT,		/* also "now" for the expiry test */
	WRITE_PARAM_HTTP_STATUS,
	WRITE_PARAM_SCOPE,
	WRITE_PARAM_KEY,
	WRITE_PARAM_REQUEST_HASH,
	WRITE_PARAM_RESPONSE_HEADERS,
	WRITE_PARAM_RESPONSE_BODY,
	/* 1.3, only for a table with its columns */
	WRITE_PARAM_RESPONSE_CONTENT_TYPE,
	WRITE_PARAM_RESPONSE_BYTES,
	WRITE_PARAMS
};

#define WRITE_PARAMS_1_2 WRITE_PARAM_RESPONSE_CONTENT_TYPE

static Oid	write_param_types[WRITE_PARAMS] = {
	[WRITE_PARAM_EXPIRES_AT] = TIMESTAMPTZOID,
	[WRITE_PARAM_CREATED_AT] = TIMESTAMPTZOID,
	[WRITE_PARAM_HTTP_STATUS] = INT4OID,
	[WRITE_PARAM_SCOPE] = TEXTOID,
	[WRITE_PARAM_KEY] = TEXTOID,
	[WRITE_PARAM_REQUEST_HASH] = BYTEAOID,
	[WRITE_PARAM_RESPONSE_HEADERS] = JSONBOID,
	[WRITE_PARAM_RESPONSE_BODY] = JSONBOID,
	[WRITE_PARAM_RESPONSE_CONTENT_TYPE] = TEXTOID,
	[WRITE_PARAM_RESPONSE_BYTES] = BYTEAOID
};

static void
forget_table_plans(TablePlans *table)
{
	if (table->lookup)
		SPI_freeplan(table->lookup);
	if (table->insert)
		SPI_freeplan(table->insert);
	if (table->replace)
		SPI_freeplan(table->replace);
	if (table->lease_insert)
		SPI_freeplan(table->lease_insert);
	if (table->lease_replace)
		SPI_freeplan(table->lease_replace);
	for (int i = 0; i < lengthof(table->lease_change); i++)
		if (table->lease_change[i])
			SPI_freeplan(table->lease_change[i]);
	memset(table, 0, sizeof(*table));
}

/*
 * Parameters of lease_insert and lease_replace, in this order ($1 .. $9); the insert takes the first seven and,
 * in a table with the 1.4 column, the fencing number.
 */
enum
{
	LEASE_PARAM_EXPIRES_AT,
	LEASE_PARAM_CREATED_AT,		/* also "now" */
	LEASE_PARAM_SCOPE,
	LEASE_PARAM_KEY,
	LEASE_PARAM_REQUEST_HASH,
	LEASE_PARAM_LEASE_UNTIL,
	LEASE_PARAM_LEASE_TOKEN,
	LEASE_PARAM_TAKE_OVER,		/* keep expiry and recovery point */
	LEASE_PARAM_FENCING_NUMBER, /* 1.4, only for a table with its column: the number's floor */
	LEASE_PARAMS
};

#define LEASE_PARAMS_1_3 LEASE_PARAM_FENCING_NUMBER

static Oid	lease_param_types[LEASE_PARAMS] = {
	[LEASE_PARAM_EXPIRES_AT] = TIMESTAMPTZOID,
	[LEASE_PARAM_CREATED_AT] = TIMESTAMPTZOID,
	[LEASE_PARAM_SCOPE] = TEXTOID,
	[LEASE_PARAM_KEY] = TEXTOID,
	[LEASE_PARAM_REQUEST_HASH] = BYTEAOID,
	[LEASE_PARAM_LEASE_UNTIL] = TIMESTAMPTZOID,
	[LEASE_PARAM_LEASE_TOKEN] = UUIDOID,
	[LEASE_PARAM_TAKE_OVER] = BOOLOID,
	[LEASE_PARAM_FENCING_NUMBER] = INT8OID
};

/*
 * Parameters of each holder's change: $1 scope, $2 key, $3 token, then its own
 * values from $4 on; RETURNING lease_until.
 */
enum
{
	CHANGE_PARAM_SCOPE,
	CHANGE_PARAM_KEY,
	CHANGE_PARAM_TOKEN,
	CHANGE_PARAM_OWN					/* the first of the change's own values */
};

/* The change's own values: $4 and on. */
enum
{
	CHANGE_PARAM_UNTIL = CHANGE_PARAM_OWN,	/* EXTEND, RELEASE */
	CHANGE_PARAM_RECOVERY_POINT = CHANGE_PARAM_OWN, /* CHECKPOINT */
	CHANGE_PARAM_RECOVERY_STATE,
	CHANGE_PARAM_HTTP_STATUS = CHANGE_PARAM_OWN,	/* COMPLETE */
	CHANGE_PARAM_RESPONSE_BODY,
	CHANGE_PARAM_RESPONSE_HEADERS,
	CHANGE_PARAM_RESPONSE_CONTENT_TYPE, /* 1.3, only for a table with its columns */
	CHANGE_PARAM_RESPONSE_BYTES,
	CHANGE_PARAMS_MAX
};

/*
 * An extension keeps the key outliving its lease by as much as before, to the microsecond: the sum is taken
 * in UTC (timestamp + interval), so no TimeZone and no daylight saving change moves it, and every function
 * in it is IMMUTABLE, which Citus requires of a function given columns in an UPDATE of a distributed table
 * (timestamptz + interval is STABLE, and Citus refuses it there with 0A000).
 */
static const char *const lease_change_sets[LEASE_CHANGES] = {
	[LEASE_EXTEND] = "lease_until = $4, expires_at = GREATEST(expires_at,"
	" pg_catalog.timezone('UTC', pg_catalog.timezone('UTC', $4) OPERATOR(pg_catalog.+)"
	" (expires_at OPERATOR(pg_catalog.-) lease_until)))",
	[LEASE_CHECKPOINT] = "recovery_point = $4, recovery_state = $5",
	[LEASE_COMPLETE] = "http_status = $4, response_body = $5, response_headers = $6,"
	" lease_until = NULL, lease_token = NULL",	/* and in a 1.3 table lease_complete_bytes */
	[LEASE_RELEASE] = "lease_until = $4, lease_token = NULL"
};

/* A completion stores the response's bytes and content type too where the table has them (1.3). */
static const char *const lease_complete_bytes = ", response_content_type = $7, response_bytes = $8";

static void
prepare_lease_plans(TablePlans *table, const char *qualified, const char *live_only, int plan_options,
					bool has_bytes_columns, bool has_fencing_column)
{
	/* Every change's first parameters name the key and the holder. */
#define HOLDER_PARAM_TYPES \
		[CHANGE_PARAM_SCOPE] = TEXTOID, [CHANGE_PARAM_KEY] = TEXTOID, [CHANGE_PARAM_TOKEN] = UUIDOID
	Oid			change_types[LEASE_CHANGES][CHANGE_PARAMS_MAX] = {
		[LEASE_EXTEND] = {HOLDER_PARAM_TYPES, [CHANGE_PARAM_UNTIL] = TIMESTAMPTZOID},
		[LEASE_CHECKPOINT] = {HOLDER_PARAM_TYPES, [CHANGE_PARAM_RECOVERY_POINT] = TEXTOID,
		[CHANGE_PARAM_RECOVERY_STATE] = JSONBOID},
		[LEASE_COMPLETE] = {HOLDER_PARAM_TYPES, [CHANGE_PARAM_HTTP_STATUS] = INT4OID,
		[CHANGE_PARAM_RESPONSE_BODY] = JSONBOID, [CHANGE_PARAM_RESPONSE_HEADERS] = JSONBOID,
		[CHANGE_PARAM_RESPONSE_CONTENT_TYPE] = TEXTOID, [CHANGE_PARAM_RESPONSE_BYTES] = BYTEAOID},
		[LEASE_RELEASE] = {HOLDER_PARAM_TYPES, [CHANGE_PARAM_UNTIL] = TIMESTAMPTZOID}
	};
#undef HOLDER_PARAM_TYPES
	int			change_nargs[LEASE_CHANGES] = {
		[LEASE_EXTEND] = CHANGE_PARAM_UNTIL + 1,
		[LEASE_CHECKPOINT] = CHANGE_PARAM_RECOVERY_STATE + 1,
		[LEASE_COMPLETE] = (has_bytes_columns ? CHANGE_PARAM_RESPONSE_BYTES : CHANGE_PARAM_RESPONSE_HEADERS) + 1,
		[LEASE_RELEASE] = CHANGE_PARAM_UNTIL + 1
	};

	/* The insert names $9 but not $8: a parameter whose type is given need not be used. */
	table->lease_insert = spi_prepare_kept(psprintf(
		"INSERT INTO %s (expires_at, created_at, scope, key, request_hash, lease_until, lease_token%s)"
		" VALUES ($1, $2, $3, $4, $5, $6, $7%s)", qualified,
		has_fencing_column ? ", fencing_number" : "", has_fencing_column ? ", $9" : ""),
		has_fencing_column ? LEASE_PARAMS : LEASE_PARAM_TAKE_OVER, lease_param_types, 0);
	/*
	 * An expired row or a lapsed lease; a takeover keeps the key's expiry and recovery point. The fencing
	 * number is above the one the row last carried, wherever the row was written (GREATEST skips a NULL).
	 */
	table->lease_replace = spi_prepare_kept(psprintf(
		"UPDATE %s SET"
		" expires_at = CASE WHEN $8 THEN GREATEST(expires_at, $1) ELSE $1 END,"
		" created_at = CASE WHEN $8 THEN created_at ELSE $2 END,"
		" request_hash = $5, http_status = NULL, response_body = NULL, response_headers = NULL,%s%s"
		" lease_until = $6, lease_token = $7,"
		" recovery_point = CASE WHEN $8 THEN recovery_point END,"
		" recovery_state = CASE WHEN $8 THEN recovery_state END"
		" WHERE scope OPERATOR(pg_catalog.=) $3 AND key OPERATOR(pg_catalog.=) $4%s RETURNING expires_at%s",
		qualified, has_bytes_columns ? " response_content_type = NULL, response_bytes = NULL," : "",
		has_fencing_column ? " fencing_number = GREATEST($9, fencing_number OPERATOR(pg_catalog.+) 1)," : "",
		live_only, has_fencing_column ? ", fencing_number" : ""),
		has_fencing_column ? LEASE_PARAMS : LEASE_PARAMS_1_3, lease_param_types, plan_options);
	/*
	 * Only the key's live row can be changed: in partitioned storage an expired
	 * row stays beside the re-claimed key's new one until the sweep, and its
	 * token must not work there either. Expiry is judged at the transaction's
	 * start, as a claim judges it.
	 */
	for (int change = 0; change < LEASE_CHANGES; change++)
		table->lease_change[change] = spi_prepare_kept(psprintf(
			"UPDATE %s SET %s%s WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
			" AND lease_token OPERATOR(pg_catalog.=) $3 AND http_status IS NULL"
			" AND expires_at OPERATOR(pg_catalog.>) pg_catalog.transaction_timestamp() RETURNING lease_until",
			qualified, lease_change_sets[change],
			change == LEASE_COMPLETE && has_bytes_columns ? lease_complete_bytes : ""),
			change_nargs[change], change_types[change], 0);
}

/*
 * The lookup selects the columns in KeyColumn order, for the shared decoder.
 * The replacement overwrites an expired row or a lapsed lease, and clears the
 * lease.
 *
 * In partitioned storage the statements of a claim see only live rows
 * (expires_at after the transaction's start, $3 of the lookup): an expired row
 * counts as absent anyway, and with the bound the planner prunes every fully
 * expired partition, so a claim never probes or locks one and never queues
 * behind its drop. A key reclaimed after expiry gets a new row beside the
 * expired one, which leaves with its partition (or the sweep, in the default
 * partition); the lookup prefers the newest row.
 */
static void
prepare_table_plans(TablePlans *table, const char *schema, const char *relname, bool partitioned,
					bool custom_plan, bool has_lease_columns, bool has_bytes_columns, bool has_fencing_column)
{
	const char *qualified = psprintf("%s.%s", schema, relname);
	Oid			lookup_types[LOOKUP_PARAMS] = {
		[LOOKUP_PARAM_SCOPE] = TEXTOID,
		[LOOKUP_PARAM_KEY] = TEXTOID,
		[LOOKUP_PARAM_LIVE_AFTER] = TIMESTAMPTZOID
	};
	const char *live_only = partitioned ? " AND expires_at OPERATOR(pg_catalog.>) $2" : "";
	/*
	 * CURSOR_OPT_CUSTOM_PLAN plans each call for its values, so that partition pruning on them happens in the
	 * planner and the pruned partitions are never locked; a generic plan (CURSOR_OPT_GENERIC_PLAN) locks every
	 * partition before it prunes at executor start. 0 lets the plan cache choose.
	 */
	int			plan_options = !partitioned ? 0
		: custom_plan ? CURSOR_OPT_CUSTOM_PLAN : CURSOR_OPT_GENERIC_PLAN;
	StringInfoData columns;

	initStringInfo(&columns);
	for (int c = 0; c < KEY_COLUMNS_OF(has_lease_columns, has_bytes_columns); c++)
		appendStringInfo(&columns, "%s%s", c > 0 ? ", " : "", key_column_names[c]);

	table->lookup = spi_prepare_kept(psprintf(
		"SELECT %s FROM %s WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2%s",
		columns.data, qualified, partitioned
		? " AND expires_at OPERATOR(pg_catalog.>) $3 ORDER BY expires_at DESC LIMIT 1" : ""),
		partitioned ? LOOKUP_PARAMS : LOOKUP_PARAM_LIVE_AFTER, lookup_types, plan_options);
	table->insert = spi_prepare_kept(psprintf(
		"INSERT INTO %s (expires_at, created_at, http_status, scope, key, request_hash,"
		" response_headers, response_body%s) VALUES ($1, $2, $3, $4, $5, $6, $7, $8%s)",
		qualified, has_bytes_columns ? ", response_content_type, response_bytes" : "",
		has_bytes_columns ? ", $9, $10" : ""),
		has_bytes_columns ? WRITE_PARAMS : WRITE_PARAMS_1_2, write_param_types, 0);
	table->replace = spi_prepare_kept(psprintf(
		"UPDATE %s SET expires_at = $1, created_at = $2, http_status = $3,"
		" request_hash = $6, response_headers = $7, response_body = $8%s%s"
		" WHERE scope OPERATOR(pg_catalog.=) $4 AND key OPERATOR(pg_catalog.=) $5"
		" AND (expires_at OPERATOR(pg_catalog.<=) $2%s)%s",
		qualified,
		has_bytes_columns ? ", response_content_type = $9, response_bytes = $10" : "",
		has_lease_columns ? ", lease_until = NULL, lease_token = NULL, recovery_point = NULL,"
		" recovery_state = NULL" : "",
		has_lease_columns ? " OR (http_status IS NULL AND lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())" : "",
		live_only),
		has_bytes_columns ? WRITE_PARAMS : WRITE_PARAMS_1_2, write_param_types, plan_options);
	if (has_lease_columns)
		prepare_lease_plans(table, qualified, live_only, plan_options, has_bytes_columns, has_fencing_column);
}

/*
 * Whether a partition whose rows had all expired when the transaction started
 * is still attached (the sweep drops it within a cleanup interval). Range
 * bounds are sorted, and indexes[i] names the partition whose upper bound is
 * datums[i] (-1 for a gap), so the first one found is the earliest to expire.
 */
static bool
expired_partition_attached(Oid relid)
{
	Relation	parent;
	PartitionBoundInfo bounds;
	bool		expired = false;

	if (!OidIsValid(relid))
		return false;
	/* The claim's statement takes this lock next. */
	parent = relation_open(relid, AccessShareLock);
	bounds = RelationGetPartitionDesc(parent, true)->boundinfo;
	if (bounds != NULL && bounds->strategy == PARTITION_STRATEGY_RANGE)
		for (int i = 0; i < bounds->ndatums; i++)
			if (bounds->indexes[i] >= 0)
			{
				expired = bounds->kind[i][0] == PARTITION_RANGE_DATUM_VALUE &&
					DatumGetTimestampTz(bounds->datums[i][0]) <= GetCurrentTransactionStartTimestamp();
				break;
			}
	relation_close(parent, NoLock);
	return expired;
}

/*
 * The plans for one table; both live in the schema of the extension's functions.
 *
 * Partitioned storage plans its claims per call only while a fully expired
 * partition is attached, so that the claims neither probe nor lock it (see
 * prepare_table_plans). Otherwise every partition is live and a generic plan, which
 * locks them all and prunes nothing, costs a fifth of planning each call.
 */
static bool plans_schema_renamed = false;

/*
 * Any change to pg_namespace (ALTER SCHEMA ... RENAME among them) makes the
 * next call compare the schema's name with the one the plans' text names; no
 * catalog lookup otherwise.
 */
static void
forget_plans_schema_name(Datum arg, int cacheid, uint32 hashvalue)
{
	plans_schema_renamed = true;
}

static TablePlans *
plans_for(const KeyTable *table)
{
	static bool callback_registered = false;
	bool		stale;
	char	   *namespace_name = NULL;
	const char *schema;

	if (!callback_registered)
	{
		CacheRegisterSyscacheCallback(NAMESPACEOID, forget_plans_schema_name, (Datum) 0);
		callback_registered = true;
	}
	stale = plans.table.lookup == NULL || plans.namespace_oid != table->namespace_oid ||
		plans.has_lease_columns != table->has_lease_columns || plans.has_bytes_columns != table->has_bytes_columns ||
		plans.has_fencing_column != table->has_fencing_column;
	if (stale || plans_schema_renamed)
	{
		/* Cleared before the look-up: a change taken in during it or the plans' making is seen next call. */
		plans_schema_renamed = false;
		namespace_name = get_namespace_name(table->namespace_oid);
		if (namespace_name == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_SCHEMA),
					 errmsg("idempotency: the extension's schema (OID %u) was dropped", table->namespace_oid)));
		stale = stale || strcmp(plans.namespace_name, namespace_name) != 0;
	}
	if (stale)
	{
		/* Made again whole: a failure half way leaves them to be made again by the next call. */
		plans.namespace_oid = InvalidOid;
		forget_table_plans(&plans.table);
		forget_table_plans(&plans.partitioned);
		forget_table_plans(&plans.partitioned_pruned);
		schema = quote_identifier(namespace_name);
		prepare_table_plans(&plans.table, schema, "idempotency_keys", false, false,
							table->has_lease_columns, table->has_bytes_columns, table->has_fencing_column);
		prepare_table_plans(&plans.partitioned, schema, "idempotency_keys_partitioned", true, false,
							table->has_lease_columns, table->has_bytes_columns, table->has_fencing_column);
		prepare_table_plans(&plans.partitioned_pruned, schema, "idempotency_keys_partitioned", true, true,
							table->has_lease_columns, table->has_bytes_columns, table->has_fencing_column);
		plans.namespace_oid = table->namespace_oid;
		plans.has_lease_columns = table->has_lease_columns;
		plans.has_bytes_columns = table->has_bytes_columns;
		plans.has_fencing_column = table->has_fencing_column;
		strlcpy(plans.namespace_name, namespace_name, NAMEDATALEN);
	}
	if (!table->partitioned)
		return &plans.table;
	return expired_partition_attached(table->partitioned_oid) ? &plans.partitioned_pruned : &plans.partitioned;
}

void
key_spi_lookup(const KeyTable *table, const KeyRef *ref, LookupSnapshot snapshot, KeyRow *out)
{
	MemoryContext caller_context = CurrentMemoryContext;
	/* $3 bounds the partitioned lookup to live rows; the table's lookup takes two. */
	Datum		params[LOOKUP_PARAMS] = {
		[LOOKUP_PARAM_SCOPE] = PointerGetDatum(ref->scope),
		[LOOKUP_PARAM_KEY] = PointerGetDatum(ref->key),
		[LOOKUP_PARAM_LIVE_AFTER] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp())
	};
	Datum		values[KEY_COLUMNS];
	bool		nulls[KEY_COLUMNS];
	TablePlans *statements;
	int			rc;

	memset(out, 0, sizeof(*out));
	SPI_connect();
	statements = plans_for(table);
	if (snapshot == LOOKUP_LATEST_SNAPSHOT)
		rc = SPI_execute_snapshot(statements->lookup, params, NULL, GetLatestSnapshot(),
								  InvalidSnapshot, false, false, 1);
	else
		rc = SPI_execute_plan(statements->lookup, params, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "idempotency: key lookup failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
	{
		for (int c = 0; c < SPI_tuptable->tupdesc->natts; c++)
			values[c] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, c + 1, &nulls[c]);
		key_row_decode(values, nulls, table->has_lease_columns, table->has_bytes_columns, out, caller_context);
	}
	SPI_finish();
}

void
key_spi_write(const KeyTable *table, const KeyRef *ref, const KeyWrite *row)
{
	Datum		values[WRITE_PARAMS];
	char		nulls[WRITE_PARAMS];
	TablePlans *statements;
	int			rc;

	memset(nulls, ' ', sizeof(nulls));
	values[WRITE_PARAM_EXPIRES_AT] = TimestampTzGetDatum(row->expires_at);
	values[WRITE_PARAM_CREATED_AT] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[WRITE_PARAM_HTTP_STATUS] = Int32GetDatum(row->response.http_status);
	values[WRITE_PARAM_SCOPE] = PointerGetDatum(ref->scope);
	values[WRITE_PARAM_KEY] = PointerGetDatum(ref->key);
	values[WRITE_PARAM_REQUEST_HASH] = PointerGetDatum(key_hash_bytea(row->request_hash));
	values[WRITE_PARAM_RESPONSE_HEADERS] = row->response.headers;
	nulls[WRITE_PARAM_RESPONSE_HEADERS] = row->response.headers_null ? 'n' : ' ';
	values[WRITE_PARAM_RESPONSE_BODY] = row->response.body;
	nulls[WRITE_PARAM_RESPONSE_BODY] = row->response.body_null ? 'n' : ' ';
	values[WRITE_PARAM_RESPONSE_CONTENT_TYPE] = row->response.content_type;
	nulls[WRITE_PARAM_RESPONSE_CONTENT_TYPE] = row->response.content_type_null ? 'n' : ' ';
	values[WRITE_PARAM_RESPONSE_BYTES] = row->response.bytes;
	nulls[WRITE_PARAM_RESPONSE_BYTES] = row->response.bytes_null ? 'n' : ' ';

	SPI_connect();
	statements = plans_for(table);
	if (row->replaces_expired_row)
	{
		rc = SPI_execute_plan(statements->replace, values, nulls, false, 0);
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
	rc = SPI_execute_plan(statements->insert, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT || SPI_processed != 1)
		elog(ERROR, "idempotency: storing the response failed: %s",
			 SPI_result_code_string(rc));
	SPI_finish();
}

void
key_spi_take_lease(const KeyTable *table, const KeyRef *ref, LeaseTake how, LeaseGrant *grant)
{
	Datum		values[LEASE_PARAMS];
	TablePlans *statements;
	int			rc;

	values[LEASE_PARAM_EXPIRES_AT] = TimestampTzGetDatum(grant->expires_at);
	values[LEASE_PARAM_CREATED_AT] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[LEASE_PARAM_SCOPE] = PointerGetDatum(ref->scope);
	values[LEASE_PARAM_KEY] = PointerGetDatum(ref->key);
	values[LEASE_PARAM_REQUEST_HASH] = PointerGetDatum(key_hash_bytea(grant->request_hash));
	values[LEASE_PARAM_LEASE_UNTIL] = TimestampTzGetDatum(grant->lease_until);
	values[LEASE_PARAM_LEASE_TOKEN] = UUIDPGetDatum(&grant->token);
	values[LEASE_PARAM_TAKE_OVER] = BoolGetDatum(how == LEASE_TAKE_OVER);
	values[LEASE_PARAM_FENCING_NUMBER] = Int64GetDatum(grant->fencing_number);

	SPI_connect();
	statements = plans_for(table);
	if (how != LEASE_NEW_ROW)
	{
		rc = SPI_execute_plan(statements->lease_replace, values, NULL, false, 0);
		if (rc != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "idempotency: taking a lease failed: %s", SPI_result_code_string(rc));
		if (SPI_processed == 1)
		{
			bool		isnull;

			grant->expires_at = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
																  SPI_tuptable->tupdesc, 1, &isnull));
			/* The number handed: the floor drawn, or above the row's last one (1.4). */
			if (table->has_fencing_column)
				grant->fencing_number = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
																	SPI_tuptable->tupdesc, 2, &isnull));
			SPI_finish();
			return;
		}
		/* A cleanup removed the row meanwhile: a takeover has nothing left to keep. */
	}
	rc = SPI_execute_plan(statements->lease_insert, values, NULL, false, 0);
	if (rc != SPI_OK_INSERT || SPI_processed != 1)
		elog(ERROR, "idempotency: storing a lease failed: %s", SPI_result_code_string(rc));
	SPI_finish();
}

bool
key_spi_change_lease(const KeyTable *table, const KeyRef *ref, const pg_uuid_t *token,
					 LeaseChange change, const LeaseChangeValues *changes, TimestampTz *lease_until)
{
	Datum		values[CHANGE_PARAMS_MAX];
	char		nulls[CHANGE_PARAMS_MAX];
	TablePlans *statements;
	bool		changed;
	bool		isnull;
	int			rc;

	memset(nulls, ' ', sizeof(nulls));
	values[CHANGE_PARAM_SCOPE] = PointerGetDatum(ref->scope);
	values[CHANGE_PARAM_KEY] = PointerGetDatum(ref->key);
	values[CHANGE_PARAM_TOKEN] = UUIDPGetDatum(token);
	switch (change)
	{
		case LEASE_EXTEND:
		case LEASE_RELEASE:
			values[CHANGE_PARAM_UNTIL] = TimestampTzGetDatum(changes->until);
			break;
		case LEASE_CHECKPOINT:
			values[CHANGE_PARAM_RECOVERY_POINT] = changes->recovery_point;
			nulls[CHANGE_PARAM_RECOVERY_POINT] = changes->recovery_point_null ? 'n' : ' ';
			values[CHANGE_PARAM_RECOVERY_STATE] = changes->recovery_state;
			nulls[CHANGE_PARAM_RECOVERY_STATE] = changes->recovery_state_null ? 'n' : ' ';
			break;
		case LEASE_COMPLETE:
			values[CHANGE_PARAM_HTTP_STATUS] = Int32GetDatum(changes->response.http_status);
			values[CHANGE_PARAM_RESPONSE_BODY] = changes->response.body;
			nulls[CHANGE_PARAM_RESPONSE_BODY] = changes->response.body_null ? 'n' : ' ';
			values[CHANGE_PARAM_RESPONSE_HEADERS] = changes->response.headers;
			nulls[CHANGE_PARAM_RESPONSE_HEADERS] = changes->response.headers_null ? 'n' : ' ';
			/* Passed only to a table with the 1.3 columns (NULL for a jsonb response: a lease row has none). */
			values[CHANGE_PARAM_RESPONSE_CONTENT_TYPE] = changes->response.content_type;
			nulls[CHANGE_PARAM_RESPONSE_CONTENT_TYPE] = changes->response.content_type_null ? 'n' : ' ';
			values[CHANGE_PARAM_RESPONSE_BYTES] = changes->response.bytes;
			nulls[CHANGE_PARAM_RESPONSE_BYTES] = changes->response.bytes_null ? 'n' : ' ';
			break;
	}

	SPI_connect();
	statements = plans_for(table);
	rc = SPI_execute_plan(statements->lease_change[change], values, nulls, false, 0);
	if (rc != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "idempotency: changing a lease failed: %s", SPI_result_code_string(rc));
	changed = SPI_processed == 1;
	*lease_until = 0;
	if (changed)
	{
		Datum		until = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		*lease_until = isnull ? 0 : DatumGetTimestampTz(until);
	}
	SPI_finish();
	return changed;
}
