/*
 * key_direct.h: the fast path for the plain idempotency_keys table.
 *
 * One index probe to read a key and one heap insert plus its index entries to
 * store it, with no SQL statement to plan and start. It is taken only where it
 * behaves exactly like the statements in key_store.c: table storage, no row
 * level security, no triggers or CHECK constraints on the table; privileges are
 * checked as the statements would check them. Otherwise the callers use SPI.
 */
#ifndef IDEM_KEY_DIRECT_H
#define IDEM_KEY_DIRECT_H

#include "utils/relcache.h"

#include "key_store.h"

/*
 * Both take idempotency_keys opened with at least AccessShareLock and leave it open.
 */

/* False when the fast path does not apply and nothing was read. */
bool		direct_lookup(Relation table, const KeyRef *ref, LookupSnapshot snapshot,
						  StoredResponse *out);

/* False when the fast path does not apply and nothing was written. */
bool		direct_insert(Relation table, const KeyRef *ref, const TxnClaim *claim,
						  const ResponseToStore *response);

#endif
