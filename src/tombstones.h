/* tombstones.h: keys remembered after their response expired (1.4, issue 41). */
#ifndef IDEM_TOMBSTONES_H
#define IDEM_TOMBSTONES_H

#include "key_store.h"

/*
 * Looks for a tombstone of the key that expired after since (now minus idempotency.tombstone_ttl), with the
 * latest snapshot, as the caller (privileges and row level security apply). True and *expired_at set when one
 * is found; false too when the extension's SQL predates tombstones (no idempotency_tombstones table).
 */
bool		tombstone_probe(const KeyRef *ref, TimestampTz since, TimestampTz *expired_at);

/*
 * Copies the expired completed rows of a partition about to be dropped, that expired after since, into the
 * tombstones (1.4), in batches of idempotency.cleanup_batch_size heap pages; before the drop takes the parent's
 * lock. Nothing when the extension's SQL predates tombstones. SPI connected, in maintenance.
 */
void		tombstones_bury_partition(Oid partition, TimestampTz since);

#endif
