/*
 * cleanup.h: removal of expired keys, shared by idem_cleanup() and the background worker.
 * Every function here needs SPI connected and an active snapshot, and commits nothing.
 */
#ifndef IDEM_CLEANUP_H
#define IDEM_CLEANUP_H

/* The extension's schema in this database, or InvalidOid when it is not installed. */
Oid			cleanup_extension_schema(void);

/* Deletes up to batch_size expired rows outside droppable partitions; returns how many. */
int64		cleanup_delete_batch(Oid schema, int batch_size);

/* Partitioned storage: drops the partitions whose keys have all expired; returns keys removed. */
int64		cleanup_drop_expired_partitions(Oid schema);

/* Partitioned storage: makes the partitions claims will need; returns how many. */
int64		cleanup_premake_partitions(Oid schema);

#endif
