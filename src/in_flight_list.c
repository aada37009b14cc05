/*
 * in_flight_list.c: idem_keys_in_flight_claims(), the transactional claims in
 * flight (the slots of in_flight.c) as the caller may see them.
 *
 * It applies what SELECT on the active key table would: the privilege (else
 * ERROR 42501), and, when row level security is active for the caller, the
 * table's SELECT policies on a row made of the claim's scope, key and since
 * (as created_at), every other column NULL.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rls.h"
#include "utils/timestamp.h"

#include "in_flight.h"
#include "key_store.h"
#include "pg_compat.h"

PG_FUNCTION_INFO_V1(idem_keys_in_flight_claims);

/* The columns of idem_keys_in_flight_claims(). */
enum
{
	IN_FLIGHT_COL_SCOPE,
	IN_FLIGHT_COL_KEY,
	IN_FLIGHT_COL_PID,
	IN_FLIGHT_COL_SINCE,
	IN_FLIGHT_COLUMNS
};

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

/* The policy query's one parameter, and the parameters of the filter it writes. */
enum
{
	POLICY_PARAM_TABLE,
	POLICY_PARAMS
};

enum
{
	FILTER_PARAM_SCOPES,
	FILTER_PARAM_KEYS,
	FILTER_PARAM_SINCES,
	FILTER_PARAMS
};

/* Marks the listed claims that the table's policies let the current user see. */
static void
apply_policies(Oid relid, const InFlightClaim *rows, bool *visible, int count)
{
	Datum	   *scopes = palloc(sizeof(Datum) * count);
	Datum	   *keys = palloc(sizeof(Datum) * count);
	Datum	   *sinces = palloc(sizeof(Datum) * count);
	int		   *positions = palloc(sizeof(int) * count);
	int			listed = 0;
	Oid			policy_arg_types[POLICY_PARAMS] = {[POLICY_PARAM_TABLE] = OIDOID};
	Datum		policy_args[POLICY_PARAMS];
	Oid			filter_arg_types[FILTER_PARAMS] = {
		[FILTER_PARAM_SCOPES] = TEXTARRAYOID,
		[FILTER_PARAM_KEYS] = TEXTARRAYOID,
		[FILTER_PARAM_SINCES] = TIMESTAMPTZARRAYOID
	};
	Datum		filter_args[FILTER_PARAMS];
	char	   *filter;
	bool		isnull;

	for (int i = 0; i < count; i++)
	{
		visible[i] = false;
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
	policy_args[POLICY_PARAM_TABLE] = ObjectIdGetDatum(relid);
	if (SPI_execute_with_args(policy_query_sql, POLICY_PARAMS, policy_arg_types, policy_args, NULL,
							  true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idempotency: could not read the policies of the key table");
	filter = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	if (filter != NULL)
	{
		filter_args[FILTER_PARAM_SCOPES] = PointerGetDatum(construct_array(scopes, listed, TEXTOID, -1, false,
																		   TYPALIGN_INT));
		filter_args[FILTER_PARAM_KEYS] = PointerGetDatum(construct_array(keys, listed, TEXTOID, -1, false,
																		 TYPALIGN_INT));
		filter_args[FILTER_PARAM_SINCES] = PointerGetDatum(construct_array(sinces, listed, TIMESTAMPTZOID,
																		   sizeof(TimestampTz), FLOAT8PASSBYVAL,
																		   TYPALIGN_DOUBLE));
		if (SPI_execute_with_args(filter, FILTER_PARAMS, filter_arg_types, filter_args, NULL, false, 0)
			!= SPI_OK_SELECT)
			elog(ERROR, "idempotency: could not apply the policies of the key table");
		for (uint64 row = 0; row < SPI_processed; row++)
		{
			int64		n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[row],
														SPI_tuptable->tupdesc, 1, &isnull));

			if (!isnull && n >= 1 && n <= listed)
				visible[positions[n - 1]] = true;
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
	InFlightClaim *rows;
	bool	   *visible;
	int			count;

	InitMaterializedSRF(fcinfo, 0);

	relname = key_store_partitioned(namespace_oid) ? "idempotency_keys_partitioned" : "idempotency_keys";
	relid = get_relname_relid(relname, namespace_oid);
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("idempotency: table %s is missing from the extension's schema", relname)));
	acl = pg_class_aclcheck(relid, GetUserId(), ACL_SELECT);
	if (acl != ACLCHECK_OK)
		aclcheck_error(acl, OBJECT_TABLE, relname);
	/* ERROR 42501 as for a SELECT when row_security is off and policies would apply. */
	restricted = check_enable_rls(relid, InvalidOid, false) == RLS_ENABLED;

	if (!in_flight_read_claims(&rows, &count))
	{
		ereport(NOTICE,
				(errmsg("idempotency: transactional claims are not listed"),
				 errdetail("idempotency is not in shared_preload_libraries; only leases are seen.")));
		return (Datum) 0;
	}

	visible = palloc(sizeof(bool) * Max(count, 1));
	for (int i = 0; i < count; i++)
		visible[i] = true;
	if (restricted && count > 0)
		apply_policies(relid, rows, visible, count);

	for (int i = 0; i < count; i++)
	{
		Datum		values[IN_FLIGHT_COLUMNS];
		bool		nulls[IN_FLIGHT_COLUMNS] = {false};

		if (!visible[i])
			continue;
		nulls[IN_FLIGHT_COL_SCOPE] = nulls[IN_FLIGHT_COL_KEY] = rows[i].scope == NULL;
		values[IN_FLIGHT_COL_SCOPE] = PointerGetDatum(rows[i].scope);
		values[IN_FLIGHT_COL_KEY] = PointerGetDatum(rows[i].key);
		values[IN_FLIGHT_COL_PID] = Int32GetDatum(rows[i].pid);
		values[IN_FLIGHT_COL_SINCE] = TimestampTzGetDatum(rows[i].since);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
