/*
 * stats.h: counters behind the idem_stats view.
 *
 * With the library in shared_preload_libraries they live in shared memory and
 * cover the whole cluster; without it each backend counts only its own calls.
 */
#ifndef IDEM_STATS_H
#define IDEM_STATS_H

#include "datatype/timestamp.h"

#define IDEM_COUNTERS_1_0 10

typedef enum IdemCounter
{
	IDEM_COUNT_CLAIMS,
	IDEM_COUNT_REPLAYS,
	IDEM_COUNT_IN_PROGRESS,
	IDEM_COUNT_MISMATCHES,
	IDEM_COUNT_COMPLETIONS_STORED,
	IDEM_COUNT_RELEASED_5XX,
	IDEM_COUNT_RELEASES,
	IDEM_COUNT_KEYS_REMOVED,
	IDEM_COUNT_PARTITIONS_CREATED,
	IDEM_COUNT_PARTITIONS_DROPPED,
	/* 1.1: idem_stats_read shows these after the 1.0 columns */
	IDEM_COUNT_LEASES,
	IDEM_COUNT_LEASE_TAKEOVERS,
	IDEM_COUNT_CHECKPOINTS,
	IDEM_COUNT_STALE_TOKENS,
	IDEM_COUNT_WAITS,
	/* 1.3: sweeps that passed a table by because another session held its lock */
	IDEM_COUNT_SWEEPS_BLOCKED,
	IDEM_COUNTERS
} IdemCounter;

void		stats_count(IdemCounter counter, uint64 amount);

/* The outcome of one sweep of one database. */
void		stats_record_sweep(const char *database, TimestampTz started_at, int64 duration_us,
							   int64 removed);
void		stats_record_error(const char *database, const char *message);

/* Asks for the shared counters; a no-op unless preloading (then each backend counts its own). */
void		stats_init(void);

#endif
