/*
 * key_store_types.h: the types the key store's facade (key_store.h) and its paths (key_store_internal.h)
 * share: a key's reference, its row as read, what a completion and a lease write. It includes nothing of the
 * key store; everything of the key store includes it (see the layering at the top of key_store.h).
 */
#ifndef IDEM_KEY_STORE_TYPES_H
#define IDEM_KEY_STORE_TYPES_H

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

/* The row of a completed transactional claim, as key_store_write stores it. */
typedef struct KeyWrite
{
	uint8		request_hash[IDEM_SHA256_BYTES];
	TimestampTz expires_at;
	/* an expired row of the key exists and must be replaced, not inserted beside */
	bool		replaces_expired_row;
	ResponseToStore response;
} KeyWrite;

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

#endif
