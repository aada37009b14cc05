/* maintenance.c: the owner, the settings and the extension's own objects for the maintenance code. */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/dependency.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_tablespace.h"
#include "commands/extension.h"
#include "commands/tablespace.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "maintenance.h"

/*
 * The settings maintenance runs under, whatever the database, the role or the session chose. Each one could
 * change what a statement means or how it runs: the date and interval styles and the time zone (bounds and
 * expiry are compared as values, and nothing is read back from text, but a partition's ATTACH and the logs
 * still print timestamps), default_tablespace (set per relation by maintenance_begin), search_path, the planner
 * switches (a paced batch is a TID range scan; with enable_tidscan off it would be a full scan each time),
 * row_security, standard_conforming_strings (the statements' literals), the timeouts. session_replication_role
 * = replica keeps ordinary triggers from firing (see maintenance_begin); it also skips foreign-key actions, so
 * foreign keys that point at the key tables are not supported (README, "Security").
 */
static const char *const pinned_settings[][2] = {
	{"search_path", "pg_catalog, pg_temp"},
	{"session_replication_role", "replica"},
	{"DateStyle", "ISO, YMD"},
	{"IntervalStyle", "postgres"},
	{"TimeZone", "UTC"},
	{"standard_conforming_strings", "on"},
	{"row_security", "on"},
	{"transform_null_equals", "off"},
	{"array_nulls", "on"},
	{"statement_timeout", "0"},
	{"lock_timeout", MAINTENANCE_LOCK_TIMEOUT},
	{"idle_in_transaction_session_timeout", "0"},
	{"enable_seqscan", "on"},
	{"enable_indexscan", "on"},
	{"enable_indexonlyscan", "on"},
	{"enable_bitmapscan", "on"},
	{"enable_tidscan", "on"},
	{"enable_sort", "on"},
	{"enable_incremental_sort", "on"},
	{"enable_hashagg", "on"},
	{"enable_material", "on"},
	{"enable_memoize", "on"},
	{"enable_nestloop", "on"},
	{"enable_mergejoin", "on"},
	{"enable_hashjoin", "on"},
	{"enable_gathermerge", "on"},
	{"enable_partitionwise_join", "off"},
	{"enable_partitionwise_aggregate", "off"},
	{"enable_partition_pruning", "on"},
	{"enable_parallel_append", "on"},
	{"enable_parallel_hash", "on"},
	{"enable_async_append", "on"},
	{"plan_cache_mode", "auto"},
	{"max_parallel_workers_per_gather", "0"},
	{"jit", "off"},
};

/*
 * Maintenance acts as the owner of the table it works on, inside a security-restricted operation with its own
 * settings, as autovacuum and REFRESH MATERIALIZED VIEW do: a trigger, policy or function anyone planted then
 * runs with no more rights than the table's owner has, and cannot change the session (SET ROLE, temporary
 * objects) for what runs after it. Ordinary triggers do not fire at all (session_replication_role = replica, as
 * in a logical replication apply): a role granted TRIGGER on a superuser's table must not get its function run
 * by the superuser's sweep. Only the table's owner can make a trigger fire ALWAYS, and it then runs as that
 * owner. New relations (partitions and their indexes) go in the table's own tablespace, never in one a
 * database owner named in default_tablespace. Everything is restored at maintenance_end, or by the
 * transaction's abort on an ERROR.
 */
void
maintenance_begin(Oid relid, Maintenance *maintenance)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			owner;
	Oid			tablespace;
	char	   *tablespace_name = NULL;

	if (!HeapTupleIsValid(tuple))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("idempotency: relation with OID %u was dropped while maintenance ran", relid)));
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	tablespace = ((Form_pg_class) GETSTRUCT(tuple))->reltablespace;
	ReleaseSysCache(tuple);
	if (OidIsValid(tablespace) && tablespace != MyDatabaseTableSpace)
		tablespace_name = get_tablespace_name(tablespace);

	GetUserIdAndSecContext(&maintenance->saved_user, &maintenance->saved_security_context);
	maintenance->guc_nest_level = NewGUCNestLevel();
	for (int i = 0; i < lengthof(pinned_settings); i++)
		(void) set_config_option(pinned_settings[i][0], pinned_settings[i][1], PGC_SUSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	/* '': the database's default tablespace, where the table itself is when reltablespace is 0. */
	(void) set_config_option("default_tablespace", tablespace_name ? tablespace_name : "", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("temp_tablespaces", "", PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	/*
	 * On a Citus node the sweep deletes from its local shards by name, which Citus refuses unless this is on;
	 * set here, in maintenance's nest level, it ends with maintenance_end instead of lasting for the rest of the
	 * caller's transaction (idem_cleanup()). Only where Citus has defined it: no placeholder is made.
	 */
	if (GetConfigOption("citus.enable_manual_changes_to_shards", true, false) != NULL)
		(void) set_config_option("citus.enable_manual_changes_to_shards", "on", PGC_SUSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	SetUserIdAndSecContext(owner, maintenance->saved_security_context | SECURITY_RESTRICTED_OPERATION);
}

void
maintenance_end(const Maintenance *maintenance)
{
	AtEOXact_GUC(false, maintenance->guc_nest_level);
	SetUserIdAndSecContext(maintenance->saved_user, maintenance->saved_security_context);
}

/*
 * Tries the lock every 10 ms on the latch, as PostgreSQL's own waits do: a cancel, a termination or the
 * postmaster's death ends the wait at once, and the time is the clock's, not a count of sleeps.
 */
bool
maintenance_lock_relation(Oid relid, LOCKMODE mode)
{
	TimestampTz start = GetCurrentTimestamp();

	for (;;)
	{
		long		waited_ms;

		if (ConditionalLockRelationOid(relid, mode))
			return true;
		waited_ms = TimestampDifferenceMilliseconds(start, GetCurrentTimestamp());
		if (waited_ms >= MAINTENANCE_TABLE_LOCK_WAIT_MS)
			return false;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(10, MAINTENANCE_TABLE_LOCK_WAIT_MS - waited_ms), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

char *
maintenance_sql_version(void)
{
	int			rc = SPI_execute("SELECT e.extversion FROM pg_catalog.pg_extension e"
								 " WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'", true, 1);

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "idempotency: reading pg_extension failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 0)
		return NULL;
	return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
}

static bool
is_member(Oid classid, Oid objid)
{
	Oid			extension = get_extension_oid("idempotency", true);

	return OidIsValid(objid) && OidIsValid(extension) && getExtensionOfObject(classid, objid) == extension;
}

Oid
maintenance_member_relation(Oid schema, const char *name)
{
	Oid			relid = get_relname_relid(name, schema);

	return is_member(RelationRelationId, relid) ? relid : InvalidOid;
}

Oid
maintenance_member_function(Oid schema, const char *name, int nargs, const Oid *argtypes)
{
	Oid			function = GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid, CStringGetDatum(name),
										   PointerGetDatum(buildoidvector(argtypes, nargs)),
										   ObjectIdGetDatum(schema));

	return is_member(ProcedureRelationId, function) ? function : InvalidOid;
}
