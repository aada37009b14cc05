/* guc.c: defines the idempotency.* settings; behaviour ones are per session. */
#include "postgres.h"

#include <limits.h>

#include "access/parallel.h"
#include "access/xact.h"
#include "utils/guc.h"

#include "citus.h"
#include "guc.h"

int			idem_ttl_seconds = 24 * 60 * 60;
int			idem_tombstone_ttl_seconds = 0;
int			idem_mismatch_status = 422;
int			idem_max_response_bytes = 1024 * 1024;
char	   *idem_databases = NULL;
int			idem_cleanup_interval_s = 60;
int			idem_cleanup_batch_size = 200;
int			idem_cleanup_keys_per_second = 2000;
int			idem_partition_lock_timeout_ms = 100;

/* wal_compression's methods this server was built with; the sweeper sets its own wal_compression to one. */
static const struct config_enum_entry wal_compression_methods[] = {
	{"off", 0, false},
	{"pglz", 1, false},
#ifdef USE_LZ4
	{"lz4", 2, false},
#endif
#ifdef USE_ZSTD
	{"zstd", 3, false},
#endif
	{NULL, 0, false}
};

#ifdef USE_LZ4
#define DEFAULT_SWEEPER_WAL_COMPRESSION 2
#else
#define DEFAULT_SWEEPER_WAL_COMPRESSION 1
#endif
int			idem_cleanup_wal_compression = DEFAULT_SWEEPER_WAL_COMPRESSION;
bool		idem_citus_direct = true;

/*
 * idempotency.tombstone_ttl above 0 set in a session (SET, set_config, a function's SET clause) of a database whose
 * key table Citus distributes: refused at once (tombstones are not supported on Citus in 1.4), with the claims'
 * and the sweep's SQLSTATE. Values from the configuration file, ALTER DATABASE or ALTER ROLE are not checked here
 * (no catalog to read, or another database's); every claim and sweep under them refuses instead (citus.c).
 */
static bool
check_tombstone_ttl(int *newval, void **extra, GucSource source)
{
	if (*newval > 0 && source == PGC_S_SESSION && IsTransactionState() && !IsParallelWorker() &&
		citus_keys_distributed_here())
	{
		GUC_check_errcode(ERRCODE_FEATURE_NOT_SUPPORTED);
		GUC_check_errmsg("idempotency: tombstones are not supported on a Citus-distributed key table");
		GUC_check_errhint("Leave idempotency.tombstone_ttl at 0 in a Citus cluster.");
		return false;
	}
	return true;
}

const char *
cleanup_wal_compression_method(void)
{
	for (const struct config_enum_entry *entry = wal_compression_methods; entry->name != NULL; entry++)
		if (entry->val == idem_cleanup_wal_compression)
			return entry->name;
	return "off";
}

void
settings_init(void)
{
	DefineCustomIntVariable("idempotency.ttl",
							"How long a completed key answers with its stored response.",
							"Used when idem_claim is called without a ttl.",
							&idem_ttl_seconds,
							24 * 60 * 60,
							1,
							IDEM_MAX_TTL_DAYS * 24 * 60 * 60,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL,
							NULL,
							NULL);

	DefineCustomIntVariable("idempotency.tombstone_ttl",
							"How long a key is remembered after its response expired (1.4); 0 turns tombstones off.",
							"Within it a claim of the key answers expired instead of claimed, and the sweeper "
							"keeps a tombstone of each expired completed key.",
							&idem_tombstone_ttl_seconds,
							0,
							0,
							IDEM_MAX_TTL_DAYS * 24 * 60 * 60,
							PGC_USERSET,
							GUC_UNIT_S,
							check_tombstone_ttl,
							NULL,
							NULL);

	DefineCustomBoolVariable("idempotency.citus_direct",
							 "On a Citus worker, read and write keys in the local shard directly.",
							 "Under the shard metadata lock a Citus write takes; off sends the key store's "
							 "statements through Citus's planner instead.",
							 &idem_citus_direct,
							 true,
							 PGC_SUSET,
							 0,
							 NULL,
							 NULL,
							 NULL);

	DefineCustomIntVariable("idempotency.mismatch_status",
							"HTTP status answered when a key is reused with another payload.",
							"422 follows the IETF draft; 400 follows Stripe.",
							&idem_mismatch_status,
							422,
							400,
							499,
							PGC_USERSET,
							0,
							NULL,
							NULL,
							NULL);

	DefineCustomIntVariable("idempotency.max_response_bytes",
							"Largest response (body plus headers) idem_complete stores.",
							NULL,
							&idem_max_response_bytes,
							1024 * 1024,
							0,
							INT_MAX,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL,
							NULL,
							NULL);

	/* The worker's schedule: read on reload, so no restart is needed to change it. */
	DefineCustomStringVariable("idempotency.databases",
							   "Databases whose expired keys the background worker removes.",
							   "Comma-separated list, swept one after another.",
							   &idem_databases,
							   "postgres",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   NULL,
							   NULL,
							   NULL);

	DefineCustomIntVariable("idempotency.cleanup_interval",
							"Time between two sweeps of the background worker.",
							NULL,
							&idem_cleanup_interval_s,
							60,
							1,
							INT_MAX / 1000,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL,
							NULL,
							NULL);

	DefineCustomIntVariable("idempotency.cleanup_batch_size",
							"Expired keys deleted per transaction by a sweep.",
							NULL,
							&idem_cleanup_batch_size,
							200,
							1,
							10000000,
							PGC_SIGHUP,
							0,
							NULL,
							NULL,
							NULL);

	DefineCustomIntVariable("idempotency.cleanup_keys_per_second",
							"Pace of the background worker's sweep, in keys deleted per second.",
							"A batch counts its deleted keys or its scanned heap pages, whichever is more. "
							"0 sweeps at full speed.",
							&idem_cleanup_keys_per_second,
							2000,
							0,
							INT_MAX,
							PGC_SIGHUP,
							0,
							NULL,
							NULL,
							NULL);

	/*
	 * Nine tenths of a sweep's WAL are full-page images of the pages it
	 * deletes from; compressed, the claims committing behind them flush less.
	 */
	DefineCustomEnumVariable("idempotency.cleanup_wal_compression",
							 "wal_compression of the background worker's sweeps.",
							 "off writes their full-page images uncompressed, as a server without wal_compression does.",
							 &idem_cleanup_wal_compression,
							 DEFAULT_SWEEPER_WAL_COMPRESSION,
							 wal_compression_methods,
							 PGC_SIGHUP,
							 0,
							 NULL,
							 NULL,
							 NULL);

	/* Read by the partition functions in SQL: how long claims may queue behind a DROP or ATTACH.
	 * Superuser-settable so that a maintenance session can wait longer than the worker does. */
	DefineCustomIntVariable("idempotency.partition_lock_timeout",
							"Longest wait for the locks that create or drop a partition.",
							"Past it the step is left for the next sweep.",
							&idem_partition_lock_timeout_ms,
							100,
							1,
							INT_MAX,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL,
							NULL,
							NULL);

	MarkGUCPrefixReserved("idempotency");
}
