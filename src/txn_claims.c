/* txn_claims.c: a per-transaction map from key identity to a stack of claim versions. */
#include "postgres.h"

#include "access/xact.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "txn_claims.h"

/* One state of a claim, with the state it replaced in an enclosing subtransaction. */
typedef struct ClaimVersion
{
	TxnClaim	claim;
	SubTransactionId subid;
	struct ClaimVersion *previous;
} ClaimVersion;

typedef struct ClaimEntry
{
	uint8		identity[IDEM_SHA256_BYTES];	/* hash key */
	ClaimVersion *current;
} ClaimEntry;

/* Lives in TopTransactionContext; forgotten when the transaction ends. */
static HTAB *claims = NULL;

static HTAB *
claims_table(void)
{
	HASHCTL		ctl;

	if (claims != NULL)
		return claims;
	ctl.keysize = IDEM_SHA256_BYTES;
	ctl.entrysize = sizeof(ClaimEntry);
	ctl.hcxt = TopTransactionContext;
	claims = hash_create("idempotency claims of this transaction", 8, &ctl,
						 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	return claims;
}

const TxnClaim *
txn_claims_find(const uint8 identity[IDEM_SHA256_BYTES])
{
	ClaimEntry *entry;

	if (claims == NULL)
		return NULL;
	entry = hash_search(claims, identity, HASH_FIND, NULL);
	return entry != NULL && entry->current != NULL ? &entry->current->claim : NULL;
}

void
txn_claims_record(const uint8 identity[IDEM_SHA256_BYTES], const TxnClaim *claim)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	ClaimEntry *entry;
	bool		found;

	entry = hash_search(claims_table(), identity, HASH_ENTER, &found);
	if (!found)
		entry->current = NULL;

	/* A change within the same subtransaction needs no way back of its own. */
	if (entry->current == NULL || entry->current->subid != subid)
	{
		ClaimVersion *version = MemoryContextAlloc(TopTransactionContext,
												   sizeof(ClaimVersion));

		version->subid = subid;
		version->previous = entry->current;
		entry->current = version;
	}
	entry->current->claim = *claim;
}

/* Drops the versions the aborted subtransaction made; relabels those a committed one made. */
static void
claims_at_subtransaction_end(SubXactEvent event, SubTransactionId mySubid,
							 SubTransactionId parentSubid, void *arg)
{
	HASH_SEQ_STATUS scan;
	ClaimEntry *entry;

	if (claims == NULL ||
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
			/* The memory goes with TopTransactionContext. */
			claims = NULL;
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
