/*
 * cleanup.h: removal of expired keys, shared by idem_cleanup() and the background worker.
 * Every function here needs SPI connected and an active snapshot, and commits nothing.
 */
#ifndef IDEM_CLEANUP_H
#define IDEM_CLEANUP_H

#include "storage/itemptr.h"

/* The extension's schema in this database, or InvalidOid when it is not installed. */
Oid			cleanup_extension_schema(void);

/* Logs the ordinary triggers on the key tables that a sweep does not fire, if any. */
void		cleanup_report_skipped_triggers(Oid schema);

/*
 * How far a sweep has got: which of the relations it deletes from (a table, or a Citus node's local shards,
 * one after another), and where in that relation's heap.
 */
typedef struct SweepPosition
{
	int			relation;		/* the index of the relation in the sweep's list */
	ItemPointerData next;		/* the first tuple the next batch may take */
	bool		finished;		/* the last batch reached the end of the last relation's heap */
} SweepPosition;

void		cleanup_sweep_start(SweepPosition *position);

/*
 * Deletes up to batch_size expired rows outside droppable partitions, scanning
 * at most batch_size heap pages from the position, which it advances. Returns
 * the rows deleted and reports the pages scanned (for pacing). Each page is
 * scanned once per sweep, so a sweep ends without a full scan of the table.
 */
int64		cleanup_delete_batch(Oid schema, int batch_size, SweepPosition *position,
								 int64 *pages_scanned);

/* What cleanup_delete_batch returns when another session held its table's lock too long (logged, counted). */
#define CLEANUP_TABLE_BLOCKED (-2)

/*
 * Partitioned storage: drops the partitions whose keys have all expired, at most limit of them (0: all); returns
 * keys removed; *more: some were left for lack of limit.
 */
int64		cleanup_drop_expired_partitions(Oid schema, int limit, bool *more);

/* Partitioned storage: makes the partitions claims will need; returns how many. */
int64		cleanup_premake_partitions(Oid schema);

#endif
