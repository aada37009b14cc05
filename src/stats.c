/* stats.c: cluster-wide counters in shared memory, or per-backend ones without preloading. */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/regproc.h"
#include "utils/timestamp.h"

#include "shmem.h"
#include "stats.h"

#define ERROR_TEXT_BYTES 256

typedef struct SweepReport
{
	TimestampTz started_at;
	int64		duration_us;
	int64		removed;
	char		database[NAMEDATALEN];
	char		error[ERROR_TEXT_BYTES];
	char		error_database[NAMEDATALEN];
	TimestampTz error_at;
	TimestampTz reset_at;
} SweepReport;

typedef struct SharedStats
{
	pg_atomic_uint64 counters[IDEM_COUNTERS];
	slock_t		mutex;			/* guards report */
	SweepReport report;
} SharedStats;

static SharedStats *shared = NULL;
static uint64 local_counters[IDEM_COUNTERS];
static SweepReport local_report;

static void
init_shared_stats(void *block)
{
	SharedStats *stats = block;

	for (int i = 0; i < IDEM_COUNTERS; i++)
		pg_atomic_init_u64(&stats->counters[i], 0);
	SpinLockInit(&stats->mutex);
	memset(&stats->report, 0, sizeof(stats->report));
	stats->report.reset_at = GetCurrentTimestamp();
}

void
stats_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	shmem_request_block("idempotency stats", sizeof(SharedStats), (void **) &shared,
						init_shared_stats);
}

void
stats_count(IdemCounter counter, uint64 amount)
{
	if (shared)
		pg_atomic_fetch_add_u64(&shared->counters[counter], amount);
	else
		local_counters[counter] += amount;
}

static void
with_report(void (*change) (SweepReport *report, const void *arg), const void *arg)
{
	if (shared)
	{
		SpinLockAcquire(&shared->mutex);
		change(&shared->report, arg);
		SpinLockRelease(&shared->mutex);
	}
	else
		change(&local_report, arg);
}

typedef struct SweepFacts
{
	const char *database;
	TimestampTz started_at;
	int64		duration_us;
	int64		removed;
} SweepFacts;

static void
write_sweep(SweepReport *report, const void *arg)
{
	const SweepFacts *facts = arg;

	report->started_at = facts->started_at;
	report->duration_us = facts->duration_us;
	report->removed = facts->removed;
	strlcpy(report->database, facts->database, NAMEDATALEN);
}

void
stats_record_sweep(const char *database, TimestampTz started_at, int64 duration_us, int64 removed)
{
	SweepFacts	facts = {database, started_at, duration_us, removed};

	with_report(write_sweep, &facts);
}

typedef struct ErrorFacts
{
	const char *database;
	const char *message;
	TimestampTz at;
} ErrorFacts;

static void
write_error(SweepReport *report, const void *arg)
{
	const ErrorFacts *facts = arg;

	strlcpy(report->error, facts->message, ERROR_TEXT_BYTES);
	strlcpy(report->error_database, facts->database, NAMEDATALEN);
	report->error_at = facts->at;
}

/*
 * The message cut to fit ERROR_TEXT_BYTES on a character boundary of the database encoding (a byte cut could
 * split a UTF-8 character, and the text would then fail to convert for the reader of idem_stats).
 */
void
stats_record_error(const char *database, const char *message)
{
	char		clipped[ERROR_TEXT_BYTES];
	int			length = pg_mbcliplen(message, strlen(message), ERROR_TEXT_BYTES - 1);
	ErrorFacts	facts = {database, clipped, GetCurrentTimestamp()};

	memcpy(clipped, message, length);
	clipped[length] = '\0';

	with_report(write_error, &facts);
}

static void
write_reset(SweepReport *report, const void *arg)
{
	memset(report, 0, sizeof(*report));
	report->reset_at = *(const TimestampTz *) arg;
}

PG_FUNCTION_INFO_V1(idem_stats_reset);
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTimestamp();

	for (int i = 0; i < IDEM_COUNTERS; i++)
	{
		if (shared)
			pg_atomic_write_u64(&shared->counters[i], 0);
		else
			local_counters[i] = 0;
	}
	with_report(write_reset, &now);
	PG_RETURN_VOID();
}

static Datum
timestamp_or_null(TimestampTz value, bool *isnull)
{
	*isnull = value == 0;
	return TimestampTzGetDatum(value);
}

static Datum
text_or_null(const char *value, bool *isnull)
{
	*isnull = value[0] == '\0';
	return *isnull ? (Datum) 0 : CStringGetTextDatum(value);
}

static int64
counter_value(int counter)
{
	return (int64) (shared ? pg_atomic_read_u64(&shared->counters[counter]) : local_counters[counter]);
}

PG_FUNCTION_INFO_V1(idem_stats_read);
Datum
idem_stats_read(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[IDEM_COUNTERS + 9];
	bool		nulls[IDEM_COUNTERS + 9];
	SweepReport report;
	int			col = 0;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE || desc->natts > lengthof(values))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("function %s does not return the row type the idempotency library makes",
						format_procedure(fcinfo->flinfo->fn_oid)),
				 errdetail("The library makes a row of at most %d columns.", (int) lengthof(values)),
				 errhint("Run ALTER EXTENSION idempotency UPDATE, or undo the change to the function's result type.")));
	memset(nulls, false, sizeof(nulls));

	values[col++] = BoolGetDatum(shared != NULL);
	for (int i = 0; i < IDEM_COUNTERS_1_0; i++)
		values[col++] = Int64GetDatum(counter_value(i));
	if (shared)
	{
		SpinLockAcquire(&shared->mutex);
		report = shared->report;
		SpinLockRelease(&shared->mutex);
	}
	else
		report = local_report;

	values[col] = text_or_null(report.database, &nulls[col]);
	col++;
	values[col] = timestamp_or_null(report.started_at, &nulls[col]);
	col++;
	values[col] = Float8GetDatum(report.duration_us / 1000.0);
	nulls[col] = report.started_at == 0;
	col++;
	values[col] = Int64GetDatum(report.removed);
	nulls[col] = report.started_at == 0;
	col++;
	values[col] = text_or_null(report.error, &nulls[col]);
	col++;
	values[col] = text_or_null(report.error_database, &nulls[col]);
	col++;
	values[col] = timestamp_or_null(report.error_at, &nulls[col]);
	col++;
	values[col] = timestamp_or_null(report.reset_at, &nulls[col]);
	col++;
	/* The counters added in 1.1, when the SQL declares them: a 1.0 database still has 19 columns. */
	for (int i = IDEM_COUNTERS_1_0; i < IDEM_COUNTERS && col < desc->natts; i++)
		values[col++] = Int64GetDatum(counter_value(i));

	desc = BlessTupleDesc(desc);
	Assert(col == desc->natts);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
