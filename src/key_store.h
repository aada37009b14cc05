/*
 * key_store.h: reads and writes of the idempotency_keys table through SPI.
 *
 * Every statement names the table by its schema (the schema of the calling
 * function, which is the extension's) and every operator by pg_catalog, so no
 * object on the caller's search_path, temporary or not, is ever used. The
 * statements run as the caller: table privileges and row level security apply.
 */
#ifndef IDEM_KEY_STORE_H
#define IDEM_KEY_STORE_H

#include "fmgr.h"

#include "txn_claims.h"

typedef enum LookupSnapshot
{
	LOOKUP_CALLER_SNAPSHOT,		/* what the caller's own snapshot sees */
	LOOKUP_LATEST_SNAPSHOT		/* every completion committed so far */
} LookupSnapshot;

typedef struct KeyRef
{
	Oid			extension_function;	/* fn_oid of the calling SQL function */
	text	   *scope;
	text	   *key;
} KeyRef;

typedef struct StoredResponse
{
	bool		found;
	TimestampTz expires_at;
	uint8		request_hash[IDEM_SHA256_BYTES];
	int32		http_status;
	bool		http_status_null;
	Datum		body;			/* copied into the caller's memory context */
	bool		body_null;
	Datum		headers;
	bool		headers_null;
} StoredResponse;

typedef struct ResponseToStore
{
	int32		http_status;
	Datum		body;
	bool		body_null;
	Datum		headers;
	bool		headers_null;
} ResponseToStore;

/* Looks a key up; out->found is false when no row exists. */
void		key_store_lookup(const KeyRef *ref, LookupSnapshot snapshot, StoredResponse *out);

/* True when the storage mode is partitioned (idempotency_keys carries the inactive marker). */
bool		key_store_partitioned(Oid namespace_oid);

/* Writes the one row of a completed claim. */
void		key_store_write(const KeyRef *ref, const TxnClaim *claim, const ResponseToStore *response);

#endif
