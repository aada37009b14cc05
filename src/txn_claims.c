/* txn_claims.c: a per-transaction map from key identity to a stack of claim versions. */
#include "postgres.h"

#include "access/xact.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "in_flight.h"
#include "pg_compat.h"
#include "txn_claims.h"

/* One state of a claim, with the state it replaced in an enclosing subtransaction. */
typedef struct ClaimVersion
{
	TxnClaim	claim;
	TimestampTz since;			/* when it became HELD; a HELD claim only */
	SubTransactionId subid;
	struct ClaimVersion *previous;
} ClaimVersion;

typedef struct ClaimEntry
{
	uint8		identity[IDEM_SHA256_BYTES];	/* hash key */
	ClaimVersion *current;
	/* what idem_keys_in_flight() shows */
	uint16		scope_len;
	uint16		key_len;
	char		scope[IDEM_MAX_SCOPE_BYTES];
	char		key[IDEM_MAX_KEY_BYTES];
} ClaimEntry;

/*
 * The table lives for the backend (making one costs more than a claim's own bookkeeping) and is emptied when
 * a transaction ends; the versions live in TopTransactionContext and go with it. A table grown past
 * CLAIMS_KEPT entries is destroyed then instead, so a transaction with many claims leaves no large table.
 */
#define CLAIMS_KEPT 64
static HTAB *claims = NULL;
static bool claims_used = false;	/* entries may exist: this transaction recorded a claim */

static HTAB *
claims_table(void)
{
	HASHCTL		ctl;

	claims_used = true;
	if (claims != NULL)
		return claims;
	ctl.keysize = IDEM_SHA256_BYTES;
	ctl.entrysize = sizeof(ClaimEntry);
	ctl.hcxt = TopMemoryContext;
	claims = hash_create("idempotency claims of a transaction", 8, &ctl,
						 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	return claims;
}

static void
empty_claims_table(void)
{
	HASH_SEQ_STATUS scan;
	ClaimEntry *entry;

	if (claims == NULL || !claims_used)
		return;
	claims_used = false;
	if (hash_get_num_entries(claims) > CLAIMS_KEPT)
	{
		hash_destroy(claims);
		claims = NULL;
		return;
	}
	hash_seq_init(&scan, claims);
	while ((entry = hash_seq_search(&scan)) != NULL)
		(void) hash_search(claims, entry->identity, HASH_REMOVE, NULL);
}

const TxnClaim *
txn_claims_find(const uint8 identity[IDEM_SHA256_BYTES])
{
	ClaimEntry *entry;

	if (claims == NULL || !claims_used)
		return NULL;
	entry = hash_search(claims, identity, HASH_FIND, NULL);
	return entry != NULL && entry->current != NULL ? &entry->current->claim : NULL;
}

static bool
is_held(const ClaimVersion *version)
{
	return version != NULL && version->claim.state == TXN_CLAIM_HELD;
}

static void
publish(const ClaimEntry *entry)
{
	in_flight_publish(entry->identity, entry->scope, entry->scope_len, entry->key, entry->key_len,
					  entry->current->since);
}

/*
 * Keeps the published key in step with the entry's current version; was_held
 * and since_before describe the version it replaced.
 */
static void
republish(const ClaimEntry *entry, bool was_held, TimestampTz since_before)
{
	bool		now_held = is_held(entry->current);

	if (was_held && (!now_held || entry->current->since != since_before))
		in_flight_unpublish(entry->identity);
	if (now_held && (!was_held || entry->current->since != since_before))
		publish(entry);
}

static void
record(const uint8 identity[IDEM_SHA256_BYTES], const text *scope, const text *key,
	   const TxnClaim *claim)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	ClaimEntry *entry;
	bool		found;
	bool		was_held;
	TimestampTz since_before = 0;

	entry = hash_search(claims_table(), identity, HASH_ENTER, &found);
	if (!found)
	{
		entry->current = NULL;
		entry->scope_len = 0;
		entry->key_len = 0;
	}
	if (!found && scope != NULL && key != NULL)
	{
		entry->scope_len = Min(VARSIZE_ANY_EXHDR(scope), IDEM_MAX_SCOPE_BYTES);
		entry->key_len = Min(VARSIZE_ANY_EXHDR(key), IDEM_MAX_KEY_BYTES);
		memcpy(entry->scope, VARDATA_ANY(scope), entry->scope_len);
		memcpy(entry->key, VARDATA_ANY(key), entry->key_len);
	}
	was_held = is_held(entry->current);
	if (was_held)
		since_before = entry->current->since;

	/* A change within the same subtransaction needs no way back of its own. */
	if (entry->current == NULL || entry->current->subid != subid)
	{
		ClaimVersion *version = MemoryContextAlloc(TopTransactionContext,
												   sizeof(ClaimVersion));

		version->subid = subid;
		version->since = 0;
		version->previous = entry->current;
		entry->current = version;
	}
	entry->current->claim = *claim;
	if (claim->state == TXN_CLAIM_HELD)
		entry->current->since = was_held ? since_before : GetCurrentTimestamp();
	republish(entry, was_held, since_before);
}

void
txn_claims_record(const uint8 identity[IDEM_SHA256_BYTES], const TxnClaim *claim)
{
	record(identity, NULL, NULL, claim);
}

void
txn_claims_record_claim(const uint8 identity[IDEM_SHA256_BYTES], const text *scope,
						const text *key, const TxnClaim *claim)
{
	record(identity, scope, key, claim);
}

/* Drops the versions the aborted subtransaction made; relabels those a committed one made. */
static void
claims_at_subtransaction_end(SubXactEvent event, SubTransactionId mySubid,
							 SubTransactionId parentSubid, void *arg)
{
	HASH_SEQ_STATUS scan;
	ClaimEntry *entry;

	if (claims == NULL || !claims_used ||
		(event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB))
		return;

	hash_seq_init(&scan, claims);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		ClaimVersion *version = entry->current;

		if (version == NULL || version->subid != mySubid)
			continue;
		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			entry->current = version->previous;
			republish(entry, is_held(version), version->since);
			pfree(version);
		}
		else if (version->previous != NULL && version->previous->subid == parentSubid)
		{
			/* The parent's own earlier version is superseded for good. */
			ClaimVersion *superseded = version->previous;

			version->previous = superseded->previous;
			version->subid = parentSubid;
			pfree(superseded);
		}
		else
			version->subid = parentSubid;
	}
}

static void
claims_at_transaction_end(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* The versions go with TopTransactionContext. */
			empty_claims_table();
			in_flight_clear();
			break;
		default:
			break;
	}
}

void
txn_claims_init(void)
{
	RegisterXactCallback(claims_at_transaction_end, NULL);
	RegisterSubXactCallback(claims_at_subtransaction_end, NULL);
}
