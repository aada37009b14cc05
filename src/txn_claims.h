/*
 * txn_claims.h: the keys this transaction has claimed, and what it did with them.
 *
 * A claim writes no row: the key's advisory lock marks it in flight, and the
 * row is written once, by idem_complete. Until then the request hash and the
 * expiry live here. Each change is undone when its subtransaction rolls back,
 * exactly as PostgreSQL undoes the row and the lock. A key is published as in
 * flight (in_flight.h) exactly while its current state is HELD.
 */
#ifndef IDEM_TXN_CLAIMS_H
#define IDEM_TXN_CLAIMS_H

#include "datatype/timestamp.h"

#include "idem_core.h"

typedef enum TxnClaimState
{
	TXN_CLAIM_HELD,				/* claimed, the request is running */
	TXN_CLAIM_COMPLETED,		/* the response row is written */
	TXN_CLAIM_RELEASED			/* given back: released or a 5xx */
} TxnClaimState;

typedef struct TxnClaim
{
	TxnClaimState state;
	uint8		request_hash[IDEM_SHA256_BYTES];
	TimestampTz expires_at;
	/* an expired row of the key exists and must be replaced, not inserted beside */
	bool		replaces_expired_row;
} TxnClaim;

/* The current state of a key in this transaction, or NULL if it never claimed it. */
const TxnClaim *txn_claims_find(const uint8 identity[IDEM_SHA256_BYTES]);

/* Records a new state for a key, undoable by a rollback to savepoint. */
void		txn_claims_record(const uint8 identity[IDEM_SHA256_BYTES], const TxnClaim *claim);

/*
 * The same for a new claim, with the key's scope and key text: while the key
 * is HELD, idem_keys_in_flight() lists it (src/in_flight.h).
 */
void		txn_claims_record_claim(const uint8 identity[IDEM_SHA256_BYTES], const text *scope,
									const text *key, const TxnClaim *claim);

/* Hooks the registry into transaction and subtransaction ends. */
void		txn_claims_init(void);

#endif
