/* guc.h: the idempotency.* settings. */
#ifndef IDEM_GUC_H
#define IDEM_GUC_H

/* The longest ttl (README, Limits): idempotency.ttl's maximum, and the longest idem_claim takes. */
#define IDEM_MAX_TTL_DAYS 3650

extern int	idem_ttl_seconds;
/* idempotency.tombstone_ttl (1.4): 0 (the default) turns tombstones off; at most IDEM_MAX_TTL_DAYS. */
extern int	idem_tombstone_ttl_seconds;
extern int	idem_mismatch_status;
extern int	idem_max_response_bytes;
extern char *idem_databases;
extern int	idem_cleanup_interval_s;
extern int	idem_cleanup_batch_size;
extern int	idem_cleanup_keys_per_second;
extern int	idem_partition_lock_timeout_ms;
extern int	idem_cleanup_wal_compression;
extern bool idem_citus_direct;

/* The wal_compression value idempotency.cleanup_wal_compression names. */
const char *cleanup_wal_compression_method(void);

void		settings_init(void);

#endif
