/* cleanup.h: removal of expired keys, shared by idem_cleanup() and the background worker. */
#ifndef IDEM_CLEANUP_H
#define IDEM_CLEANUP_H

/*
 * Deletes up to batch_size expired keys from the table and returns how many.
 * Needs SPI connected and an active snapshot; commits nothing itself.
 */
int64		cleanup_delete_batch(const char *qualified_table, int batch_size);

/* "schema".idempotency_keys for the extension installed in this database, or NULL. */
char	   *cleanup_installed_table(void);

#endif
