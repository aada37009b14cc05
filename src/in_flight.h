/*
 * in_flight.h: the transactional claims each backend holds, published in
 * shared memory for idem_keys_in_flight().
 *
 * One slot per backend, written only by its owner and read without a lock
 * (a change counter, as PgBackendStatus does). txn_claims.c publishes a key
 * when its claim becomes HELD and unpublishes it when it stops being HELD
 * (completed, released, or the subtransaction that claimed it rolled back);
 * the transaction's end empties the slot. Without shared_preload_libraries
 * there is no shared memory and nothing is published. in_flight.c keeps the
 * slots; in_flight_list.c lists them for idem_keys_in_flight_claims().
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

/* One claim as read from a slot. */
typedef struct InFlightClaim
{
	text	   *scope;			/* NULL for a claim beyond the listed ones */
	text	   *key;
	int			pid;
	TimestampTz since;
} InFlightClaim;

/*
 * The claims held by the backends of this database, copied out of the slots
 * into the current memory context; false, and none, without shared memory.
 */
bool		in_flight_read_claims(InFlightClaim **claims, int *count);

#endif
