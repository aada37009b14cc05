/*
 * key_lock.h: the lock that marks a key as in flight.
 *
 * A transaction-scoped advisory lock on a 64-bit tag derived from the key's
 * identity, tried without waiting: a busy lock is the in_progress answer, or,
 * for a claim given a wait (idem_claim_wait, idem_lease), a lock to wait for
 * until the wait runs out. It goes away when the holder commits or rolls back,
 * so a crashed or vanished client never leaves a key stuck.
 */
#ifndef IDEM_KEY_LOCK_H
#define IDEM_KEY_LOCK_H

#include "idem_core.h"

/* pg_locks shows the key locks as advisory locks with this objsubid. */
#define IDEM_LOCK_OBJSUBID 0x1DE7

typedef enum KeyLockResult
{
	KEY_LOCK_BUSY,				/* another transaction holds it */
	KEY_LOCK_TAKEN,				/* granted now */
	KEY_LOCK_ALREADY_OURS		/* this transaction held it already */
} KeyLockResult;

KeyLockResult key_lock_try(const uint8 identity[IDEM_SHA256_BYTES]);

/*
 * Waits for the lock, to the end of the transaction (lock_timeout and cancel
 * apply). A lease holder's calls wait for it (claims hold it for a lookup, or
 * a lease claim's transaction until it commits); a claim with a wait waits
 * under a lock_timeout of what is left of its wait.
 */
void		key_lock_wait(const uint8 identity[IDEM_SHA256_BYTES]);

/* Gives back a lock that key_lock_try answered KEY_LOCK_TAKEN for. */
void		key_lock_release(const uint8 identity[IDEM_SHA256_BYTES]);

#endif
