/*
 * partitions.h: partitioned storage's upkeep, from the catalog's bound values (partitions.c). Every function here
 * needs SPI connected and an active snapshot; the caller runs it inside maintenance_begin/_end.
 */
#ifndef IDEM_PARTITIONS_H
#define IDEM_PARTITIONS_H

#include "datatype/timestamp.h"
#include "nodes/pg_list.h"

/* One range partition of idempotency_keys_partitioned: [lower, upper). */
typedef struct RangePartition
{
	Oid			relid;
	TimestampTz lower;
	TimestampTz upper;
} RangePartition;

/* The extension's idempotency_keys_partitioned in schema (a member of the extension), or an ERROR. */
Oid			partitions_parent(Oid schema);

/* Its range partitions (RangePartition *), lowest first, read from relpartbound's values; takes no lock. */
List	   *partitions_read(Oid parent);

/* Makes the partitions claims will need up to now() + idempotency.ttl + two partitions; returns how many. */
int			partitions_premake(Oid schema);

/*
 * Drops the range partitions whose keys have all expired, except the newest; counts partitions and keys. At most
 * limit of them (0: all); *more says whether some were left for lack of it. Keys are counted before any lock on
 * the parent is taken, and a lock is waited for at most idempotency.partition_lock_timeout per try.
 */
void		partitions_drop_expired(Oid schema, int limit, int *partitions, int64 *keys, bool *more);

#endif
