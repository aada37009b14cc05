/*
 * in_flight.h: the transactional claims each backend holds, published in
 * shared memory for idem_keys_in_flight().
 *
 * One slot per backend, written only by its owner and read without a lock
 * (a change counter, as PgBackendStatus does). txn_claims.c publishes a key
 * when its claim becomes HELD and unpublishes it when it stops being HELD
 * (completed, released, or the subtransaction that claimed it rolled back);
 * the transaction's end empties the slot. Without shared_preload_libraries
 * there is no shared memory and nothing is published.
 */
#ifndef IDEM_IN_FLIGHT_H
#define IDEM_IN_FLIGHT_H

#include "datatype/timestamp.h"

#include "idem_core.h"

/* Keys listed per backend; a transaction's further claims are only counted. */
#define IN_FLIGHT_KEYS_PER_BACKEND 8

void		in_flight_init(void);

void		in_flight_publish(const uint8 identity[IDEM_SHA256_BYTES],
							  const char *scope, int scope_len, const char *key, int key_len,
							  TimestampTz since);
void		in_flight_unpublish(const uint8 identity[IDEM_SHA256_BYTES]);

/* At the transaction's end (commit, abort, prepare): nothing is in flight any more. */
void		in_flight_clear(void);

#endif
