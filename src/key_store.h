/*
 * key_store.h: the key store, the one place that reads and writes key rows.
 *
 * This is its API. key_store.c finds the active table (idempotency_keys, or its
 * partitioned twin after idem_set_storage) once per call and chooses the path:
 * the direct path (key_store_direct.c: one index probe, one heap insert) where
 * it behaves exactly like SQL, else prepared statements (key_store_spi.c). Both
 * decode rows with the one decoder in key_store_row.c; what they share is in
 * key_store_internal.h, which nothing outside the key store includes.
 *
 * Every statement names the table by its schema (the schema of the calling
 * function, which is the extension's) and every operator by pg_catalog, so no
 * object on the caller's search_path is ever used. Both paths act as the
 * caller: table privileges and row level security apply.
 */
#ifndef IDEM_KEY_STORE_H
#define IDEM_KEY_STORE_H

#include "fmgr.h"
#include "datatype/timestamp.h"
#include "utils/uuid.h"

#include "idem_core.h"

typedef enum LookupSnapshot
{
	LOOKUP_CALLER_SNAPSHOT,		/* what the caller's own snapshot sees */
	LOOKUP_LATEST_SNAPSHOT		/* every change committed so far */
} LookupSnapshot;

typedef struct KeyRef
{
	Oid			extension_function;	/* fn_oid of the calling SQL function */
	text	   *scope;
	text	   *key;
} KeyRef;

/* A key's row as read; varlena values are copied into the caller's memory context. */
typedef struct KeyRow
{
	bool		found;
	TimestampTz expires_at;
	uint8		request_hash[IDEM_SHA256_BYTES];
	int32		http_status;
	bool		http_status_null;
	Datum		body;
	bool		body_null;
	Datum		headers;
	bool		headers_null;
	/* Lease mode (1.1): a row with lease_until set and no status is a lease. */
	bool		leased;
	TimestampTz lease_until;
	pg_uuid_t	lease_token;
	Datum		recovery_point;	/* text */
	bool		recovery_point_null;
	Datum		recovery_state;	/* jsonb */
	bool		recovery_state_null;
	/* 1.3: a response stored as the bytes sent (body stays NULL then) */
	Datum		content_type;	/* text */
	bool		content_type_null;
	Datum		bytes;			/* bytea */
	bool		bytes_null;
} KeyRow;

typedef struct ResponseToStore
{
	int32		http_status;
	Datum		body;
	bool		body_null;
	Datum		headers;
	bool		headers_null;
	/* 1.3: the body as bytes with its content type; body_null then (a table before 1.3 cannot take them) */
	Datum		content_type;	/* text */
	bool		content_type_null;
	Datum		bytes;			/* bytea */
	bool		bytes_null;
} ResponseToStore;

/* Looks a key up; out->found is false when no row exists. */
void		key_store_lookup(const KeyRef *ref, LookupSnapshot snapshot, KeyRow *out);

/* True when the storage mode is partitioned (idempotency_keys_partitioned has range partitions). */
bool		key_store_partitioned(Oid namespace_oid);

/* The row of a completed transactional claim, as key_store_write stores it. */
typedef struct KeyWrite
{
	uint8		request_hash[IDEM_SHA256_BYTES];
	TimestampTz expires_at;
	/* an expired row of the key exists and must be replaced, not inserted beside */
	bool		replaces_expired_row;
	ResponseToStore response;
} KeyWrite;

/* Writes the one row of a completed transactional claim. */
void		key_store_write(const KeyRef *ref, const KeyWrite *row);

/* Lease mode (1.1): how a lease claim writes its row. */
typedef enum LeaseTake
{
	LEASE_NEW_ROW,				/* no row: insert one */
	LEASE_REPLACE_ROW,			/* an expired row: overwrite it, recovery point cleared */
	LEASE_TAKE_OVER				/* a lease that ran out: new token and end, recovery point kept */
} LeaseTake;

typedef struct LeaseGrant
{
	uint8		request_hash[IDEM_SHA256_BYTES];
	TimestampTz expires_at;		/* asked for; the stored expiry once written (a takeover keeps the later) */
	TimestampTz lease_until;
	pg_uuid_t	token;
	int64		fencing_number; /* drawn when written (above the row's last one from 1.4); 0 at 1.1 */
} LeaseGrant;

/* What the holder of a lease changes with its token. */
typedef enum LeaseChange
{
	LEASE_EXTEND,				/* lease_until = until; the key outlives it by as much as before */
	LEASE_CHECKPOINT,			/* recovery point and state */
	LEASE_COMPLETE,				/* the response; the lease ends */
	LEASE_RELEASE				/* the lease ends now, the recovery point stays */
} LeaseChange;

#define LEASE_CHANGES (LEASE_RELEASE + 1)

typedef struct LeaseChangeValues
{
	TimestampTz until;			/* EXTEND, RELEASE */
	Datum		recovery_point;	/* CHECKPOINT */
	bool		recovery_point_null;
	Datum		recovery_state;
	bool		recovery_state_null;
	ResponseToStore response;	/* COMPLETE */
} LeaseChangeValues;

/*
 * Writes the lease row of a granted lease claim, draws its fencing number and
 * sets grant->expires_at to the expiry stored and grant->fencing_number to the
 * number handed.
 */
void		key_store_take_lease(const KeyRef *ref, LeaseTake how, LeaseGrant *grant);

/*
 * Applies a change to the key's lease if token is its current token; false
 * (nothing written) when it is not: taken over, completed, released or never
 * granted. *lease_until is the lease's end afterwards.
 */
bool		key_store_change_lease(const KeyRef *ref, const pg_uuid_t *token, LeaseChange change,
								   const LeaseChangeValues *values, TimestampTz *lease_until);

#endif
