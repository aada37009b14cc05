/* worker.c: the launcher and the per-database sweeper background workers. */
#include "postgres.h"

#include <sys/resource.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "access/xlog.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#include "cleanup.h"
#include "guc.h"
#include "maintenance.h"
#include "shmem.h"
#include "stats.h"
#include "worker.h"

PGDLLEXPORT void idem_launcher_main(Datum arg);
PGDLLEXPORT void idem_sweeper_main(Datum arg);

/* The sweeper's nice value: below the backends serving requests. */
#define SWEEPER_NICE 10

typedef enum SweepResult
{
	SWEEP_NOT_RUN,
	SWEEP_DONE,
	SWEEP_NO_EXTENSION,
	SWEEP_FAILED
} SweepResult;

/* What the running sweeper tells the launcher; one sweeper at a time. */
typedef struct SweeperSlot
{
	SweepResult result;
} SweeperSlot;

static SweeperSlot *slot = NULL;

static void
init_sweeper_slot(void *block)
{
	((SweeperSlot *) block)->result = SWEEP_NOT_RUN;
}

static void
fill_worker(BackgroundWorker *worker, const char *function, const char *type)
{
	memset(worker, 0, sizeof(*worker));
	worker->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
	strlcpy(worker->bgw_library_name, "idempotency", BGW_MAXLEN);
	strlcpy(worker->bgw_function_name, function, BGW_MAXLEN);
	strlcpy(worker->bgw_type, type, BGW_MAXLEN);
	strlcpy(worker->bgw_name, type, BGW_MAXLEN);
}

/* Shared memory and the launcher; only while preloading. */
void
worker_init(void)
{
	BackgroundWorker worker;

	if (!process_shared_preload_libraries_in_progress)
		return;
	shmem_request_block("idempotency sweeper slot", sizeof(SweeperSlot), (void **) &slot,
						init_sweeper_slot);
	fill_worker(&worker, "idem_launcher_main", "idempotency launcher");
	/* Comes back after a crash or pg_terminate_backend(). */
	worker.bgw_restart_time = 5;
	RegisterBackgroundWorker(&worker);
}

/* ---------- sweeper: one database, one pass, one transaction per batch ---------- */

static void
report_to_launcher(SweepResult result)
{
	if (slot)
		slot->result = result;
}

typedef enum SweepStep
{
	STEP_PREMAKE_PARTITIONS,
	STEP_DROP_PARTITIONS,
	STEP_DELETE_BATCH
} SweepStep;

/* Set by a STEP_DROP_PARTITIONS that left expired partitions for the next transaction. */
static bool drop_more = false;

/*
 * Runs one step in a transaction of its own, so the worker never holds a long
 * transaction and never creates and drops partitions together. Returns the
 * step's count, or -1 when the database has no idempotency extension. A
 * STEP_DROP_PARTITIONS drops one partition: its lock on the parent, which every
 * partitioned claim needs, ends with the transaction right after the drop.
 */
static int64
sweep_step(SweepStep step, SweepPosition *position, int64 *pages_scanned)
{
	Oid			schema;
	int64		count = -1;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, step == STEP_DELETE_BATCH
						   ? "idempotency: deleting expired keys"
						   : "idempotency: maintaining partitions");
	schema = cleanup_extension_schema();
	if (OidIsValid(schema))
	{
		switch (step)
		{
			case STEP_PREMAKE_PARTITIONS:
				count = cleanup_premake_partitions(schema);
				break;
			case STEP_DROP_PARTITIONS:
				count = cleanup_drop_expired_partitions(schema, 1, &drop_more);
				break;
			case STEP_DELETE_BATCH:
				count = cleanup_delete_batch(schema, idem_cleanup_batch_size, position, pages_scanned);
				break;
		}
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return count;
}

/*
 * A partition step that fails (a name taken, a lock, anything) is logged, kept
 * for idem_stats, and skipped: the deletes come next either way, so expiry never
 * stops behind partition upkeep. Its transaction is rolled back; 0 is its count.
 */
static int64
sweep_partition_step(SweepStep step, const char *database)
{
	MemoryContext context = CurrentMemoryContext;
	int64		count = 0;

	PG_TRY();
	{
		count = sweep_step(step, NULL, NULL);
	}
	PG_CATCH();
	{
		ErrorData  *error;

		MemoryContextSwitchTo(context);
		error = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		pgstat_report_activity(STATE_IDLE, NULL);
		stats_record_error(database, error->message);
		if (step == STEP_PREMAKE_PARTITIONS)
			ereport(LOG,
					(errmsg("idempotency: making partitions in database \"%s\" failed, going on with the deletes",
							database),
					 errdetail_internal("%s", error->message)));
		else
			ereport(LOG,
					(errmsg("idempotency: dropping expired partitions in database \"%s\" failed, going on with the "
							"deletes", database),
					 errdetail_internal("%s", error->message)));
		FreeErrorData(error);
	}
	PG_END_TRY();
	return Max(count, 0);
}

/*
 * Whether someone waits to drop or rename this database: DROP DATABASE and
 * ALTER DATABASE ... RENAME hold its object lock in ACCESS EXCLUSIVE mode while
 * they wait (5 s at most) for the other sessions to leave. The sweeper then
 * leaves, between two batches, as autovacuum's workers are made to.
 */
static bool
database_wanted_exclusively(void)
{
	LOCKTAG		tag;

	SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, MyDatabaseId, 0);
	if (LockAcquire(&tag, AccessShareLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		return true;
	LockRelease(&tag, AccessShareLock, true);
	return false;
}

/*
 * Whether the extension is installed in this database, in a transaction of its own; logs skipped triggers.
 * sql_current: whether its SQL objects are this library's version. Older SQL (a database not yet updated
 * after the library was) has PL/pgSQL bodies that name the schema when they run; the sweep must not run them
 * as the table's owner, so it keeps to the deletes, which bind nothing by name, and says so.
 */
static bool
extension_installed(const char *database, bool *sql_current)
{
	Oid			schema;
	bool		installed;

	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	schema = cleanup_extension_schema();
	installed = OidIsValid(schema);
	*sql_current = false;
	if (installed)
	{
		char	   *version = maintenance_sql_version();

		cleanup_report_skipped_triggers(schema);
		*sql_current = version != NULL && strcmp(version, IDEM_LIBRARY_VERSION) == 0;
		if (!*sql_current)
		{
			stats_record_error(database, psprintf("the extension's SQL objects are at version %s and the library at "
												  "%s: partitions are neither made nor dropped until ALTER "
												  "EXTENSION idempotency UPDATE", version ? version : "?",
												  IDEM_LIBRARY_VERSION));
			ereport(LOG,
					(errmsg("idempotency: in database \"%s\", the extension's SQL objects are at version %s and the "
							"library at %s: partitions are neither made nor dropped until ALTER EXTENSION "
							"idempotency UPDATE", database, version ? version : "?", IDEM_LIBRARY_VERSION),
					 errdetail("Expired keys outside partitions are still deleted."),
					 errhint("Run ALTER EXTENSION idempotency UPDATE in database \"%s\".", database)));
		}
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	return installed;
}

/* The sweeper's own settings; again after a reload, which may change them. */
static void
apply_sweeper_settings(void)
{
	/* A delete lost in a crash is redone by the next sweep: no need to wait for the flush. */
	SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("wal_compression", cleanup_wal_compression_method(), PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * What a database or role setting could make of the sweeper's own transactions: read-only, serializable,
	 * or waiting on a lock without end (every maintenance step pins its settings again, see maintenance.c; this
	 * covers the catalog reads between them). A wait past the timeout fails the step, and the launcher goes on.
	 */
	SetConfigOption("default_transaction_read_only", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("default_transaction_isolation", "read committed", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("default_transaction_deferrable", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("statement_timeout", "0", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("lock_timeout", MAINTENANCE_LOCK_TIMEOUT, PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
}

/* How often a waiting sweeper looks for a DROP or RENAME of its database. */
#define YIELD_CHECK_MS 100

/*
 * Holds the sweep to idempotency.cleanup_keys_per_second: work counts the keys
 * deleted or the heap pages scanned, whichever a batch had more of, so a table
 * with few expired rows is not scanned flat out either. A batch is given
 * work / pace seconds from its start, or from the end of the previous batch's
 * time if that is later: a sweep that fell behind (a slow batch, a reload that
 * paused it) goes on at the pace instead of catching up in a burst, which would
 * come just when the machine is busy. Sleeps on the latch, so a shutdown is not
 * delayed; a reload recomputes the batch's time at the new pace. False when the
 * sweep must end now because its database is being dropped or renamed: it looks
 * every YIELD_CHECK_MS while it waits.
 */
static bool
pace_sweep(TimestampTz *batch_deadline, TimestampTz batch_started_at, int64 work)
{
	TimestampTz from = Max(*batch_deadline, batch_started_at);

	for (;;)
	{
		long		wait_ms;

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			apply_sweeper_settings();
		}
		if (database_wanted_exclusively())
			return false;
		if (idem_cleanup_keys_per_second <= 0)
		{
			*batch_deadline = 0;
			return true;
		}
		*batch_deadline = from + (TimestampTz) ((double) work * USECS_PER_SEC / idem_cleanup_keys_per_second);
		wait_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), *batch_deadline);
		if (wait_ms <= 0)
			return true;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(wait_ms, YIELD_CHECK_MS), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

void
idem_sweeper_main(Datum arg)
{
	char		database[NAMEDATALEN];
	TimestampTz started_at = GetCurrentTimestamp();
	int64		removed = 0;
	TimestampTz batch_deadline = 0;
	SweepPosition position;
	long		secs;
	int			usecs;
	MemoryContext context = CurrentMemoryContext;

	memcpy(database, MyBgworkerEntry->bgw_extra, NAMEDATALEN);
	database[NAMEDATALEN - 1] = '\0';
	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();

	/*
	 * Housekeeping yields the CPU to the requests it shares the machine with:
	 * on an idle machine the sweep runs at full speed, under load the claims
	 * come first. Raising one's own nice value needs no privilege.
	 */
	if (setpriority(PRIO_PROCESS, 0, SWEEPER_NICE) != 0)
		elog(DEBUG1, "idempotency: could not lower the sweeper's CPU priority: %m");
	BackgroundWorkerInitializeConnection(database, NULL, 0);
	apply_sweeper_settings();

	PG_TRY();
	{
		bool		yielded = database_wanted_exclusively();
		bool		sql_current = false;

		if (!yielded && !extension_installed(database, &sql_current))
		{
			report_to_launcher(SWEEP_NO_EXTENSION);
			proc_exit(0);
		}
		if (!yielded && sql_current)
		{
			(void) sweep_partition_step(STEP_PREMAKE_PARTITIONS, database);
			do
			{
				drop_more = false;
				removed += sweep_partition_step(STEP_DROP_PARTITIONS, database);
			} while (drop_more && !(yielded = database_wanted_exclusively()));
		}
		cleanup_sweep_start(&position);
		while (!yielded && !position.finished)
		{
			int64		pages = 0;
			TimestampTz batch_started_at = GetCurrentTimestamp();
			int64		batch = sweep_step(STEP_DELETE_BATCH, &position, &pages);

			if (batch < 0)
				break;
			removed += batch;
			if (!position.finished)
				yielded = !pace_sweep(&batch_deadline, batch_started_at, Max(batch, pages));
		}
		if (yielded)
			ereport(LOG,
					(errmsg("idempotency: database \"%s\" is being dropped or renamed; its sweep stops here",
							database)));
	}
	PG_CATCH();
	{
		ErrorData  *error;

		/* Logged as an ERROR, kept for idem_stats; the launcher carries on. */
		MemoryContextSwitchTo(context);
		error = CopyErrorData();
		stats_record_error(database, error->message);
		report_to_launcher(SWEEP_FAILED);
		EmitErrorReport();
		FlushErrorState();
		proc_exit(1);
	}
	PG_END_TRY();

	TimestampDifference(started_at, GetCurrentTimestamp(), &secs, &usecs);
	stats_record_sweep(database, started_at, (int64) secs * USECS_PER_SEC + usecs, removed);
	report_to_launcher(SWEEP_DONE);
	if (removed > 0)
		elog(DEBUG1, "idempotency: removed %lld expired keys in database \"%s\"",
			 (long long) removed, database);
	proc_exit(0);
}

/* ---------- launcher: the schedule ---------- */

/* The databases skipped at the last tick: missing, or without the extension. */
static List *databases_skipped = NIL;

static bool
name_in_list(List *names, const char *name)
{
	ListCell   *cell;

	foreach(cell, names)
	{
		if (strcmp((const char *) lfirst(cell), name) == 0)
			return true;
	}
	return false;
}

static void
forget_name(List **names, const char *name)
{
	ListCell   *cell;

	foreach(cell, *names)
	{
		if (strcmp((const char *) lfirst(cell), name) == 0)
		{
			*names = foreach_delete_current(*names, cell);
			return;
		}
	}
}

/*
 * A heap scan of pg_database, as the autovacuum launcher does: a backend that
 * is connected to no database cannot rely on catalog indexes.
 */
static bool
database_exists(const char *name)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;
	bool		exists = false;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (!exists && (tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database database = (Form_pg_database) GETSTRUCT(tuple);

		/* A database that refuses connections (template0) is skipped like a missing one. */
		exists = strcmp(NameStr(database->datname), name) == 0 && database->datallowconn;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return exists;
}

typedef enum DatabaseState
{
	DATABASE_READY,
	DATABASE_MISSING,
	DATABASE_WITHOUT_EXTENSION
} DatabaseState;

/* Logs a database's state only when it changes, so a skipped database is said once. */
static void
note_database_state(const char *database, DatabaseState state)
{
	MemoryContext old;
	bool		skipped = state != DATABASE_READY;

	if (skipped == name_in_list(databases_skipped, database))
		return;
	old = MemoryContextSwitchTo(TopMemoryContext);
	if (state == DATABASE_MISSING)
		ereport(LOG,
				(errmsg("idempotency: database \"%s\" in idempotency.databases does not exist or refuses connections; skipping it until that changes",
						database)));
	else if (state == DATABASE_WITHOUT_EXTENSION)
		ereport(LOG,
				(errmsg("idempotency: database \"%s\" has no idempotency extension; skipping it until it has",
						database)));
	else
		ereport(LOG, (errmsg("idempotency: cleaning database \"%s\"", database)));
	if (skipped)
		databases_skipped = lappend(databases_skipped, pstrdup(database));
	else
		forget_name(&databases_skipped, database);
	MemoryContextSwitchTo(old);
}

/* Starts the sweeper for one database and waits for it to exit. */
static void
sweep_database(const char *database)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	pid_t		pid;

	if (!database_exists(database))
	{
		note_database_state(database, DATABASE_MISSING);
		return;
	}
	fill_worker(&worker, "idem_sweeper_main", "idempotency cleanup");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency cleanup of %s", database);
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	worker.bgw_notify_pid = MyProcPid;
	strlcpy(worker.bgw_extra, database, NAMEDATALEN);

	slot->result = SWEEP_NOT_RUN;
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		ereport(LOG, (errmsg("idempotency: no background worker slot free for cleanup of \"%s\"",
							 database),
					  errhint("Raise max_worker_processes.")));
		return;
	}
	if (WaitForBackgroundWorkerStartup(handle, &pid) != BGWH_STARTED)
		return;
	WaitForBackgroundWorkerShutdown(handle);
	if (slot->result == SWEEP_NO_EXTENSION)
		note_database_state(database, DATABASE_WITHOUT_EXTENSION);
	else if (slot->result == SWEEP_DONE)
		note_database_state(database, DATABASE_READY);
}

static List *
configured_databases(void)
{
	char	   *copy = pstrdup(idem_databases);
	List	   *names = NIL;

	if (!SplitIdentifierString(copy, ',', &names))
	{
		ereport(LOG, (errmsg("idempotency.databases is not a valid list: \"%s\"", idem_databases)));
		return NIL;
	}
	return names;
}

void
idem_launcher_main(Datum arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	/* No database: the launcher reads only the shared catalog pg_database. */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	for (;;)
	{
		MemoryContext tick = AllocSetContextCreate(CurrentMemoryContext, "idempotency tick",
												   ALLOCSET_DEFAULT_SIZES);
		MemoryContext old = MemoryContextSwitchTo(tick);
		TimestampTz next_sweep;
		long		wait_ms;

		CHECK_FOR_INTERRUPTS();
		/* A standby's keys are the primary's to remove. */
		if (!RecoveryInProgress())
		{
			ListCell   *cell;

			foreach(cell, configured_databases())
			{
				CHECK_FOR_INTERRUPTS();
				sweep_database((const char *) lfirst(cell));
			}
		}
		MemoryContextSwitchTo(old);
		MemoryContextDelete(tick);

		/* Sleep out the interval; a reload may change it while we wait. */
		next_sweep = GetCurrentTimestamp();
		for (;;)
		{
			if (ConfigReloadPending)
			{
				ConfigReloadPending = false;
				ProcessConfigFile(PGC_SIGHUP);
			}
			wait_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
													  TimestampTzPlusMilliseconds(next_sweep,
																				  (int64) idem_cleanup_interval_s * 1000));
			if (wait_ms <= 0)
				break;
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 wait_ms, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
	}
}
