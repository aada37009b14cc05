/* key_lifetime.h: the key's expiry as the header Idempotency-Key-Expires (1.4, issue 41, rule key-lifetime). */
#ifndef IDEM_KEY_LIFETIME_H
#define IDEM_KEY_LIFETIME_H

#include "key_store.h"

#define KEY_LIFETIME_HEADER "Idempotency-Key-Expires"

/*
 * The headers the answer of a claim carries (idem_claim_request's headers, idem_lease's response_headers), a
 * jsonb object: claimed, {"Idempotency-Key-Expires": <claimed_until>}; replay, the stored headers with that
 * member, the row's expires_at (replacing a stored member of that name in any case); mismatch, the row's
 * expiry; in_progress, the row's expiry when it is a committed lease, else none (a transaction's claim in
 * flight is not visible). *isnull when the answer carries none (expired, or in_progress without a row).
 */
Datum		key_lifetime_headers(IdemClaimOutcome outcome, const KeyRow *row, TimestampTz claimed_until,
								 bool *isnull);

#endif							/* IDEM_KEY_LIFETIME_H */
