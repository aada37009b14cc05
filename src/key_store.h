/*
 * key_store.h: the key store, the one place that reads and writes key rows.
 *
 * This is its API, the facade (key_store.c). The key store reads top-down, each layer including only the
 * ones below it:
 *
 *   key_store.h / key_store.c             the facade: finds the active table once per call (idempotency_keys,
 *                                          or its partitioned twin after idem_set_storage), locks it and
 *                                          chooses the path
 *   key_store_internal.h                  the paths' interface, which only key_store.c and the paths include:
 *     key_store_direct.c                  table storage: one index probe, one heap insert (where it behaves
 *                                          exactly like SQL; on Citus the scope's local shard)
 *     key_store_partitioned.c             partitioned storage: the same per partition, only the partitions
 *                                          that can hold a live row, from a per-backend partition list; and
 *                                          its lease writes (1.4), row moves across partitions included
 *     key_store_spi.c                     prepared statements: whatever the direct paths do not take (table
 *                                          storage's lease writes and expired row's replacement, a table or
 *                                          partition whose shape, triggers or row level security the direct
 *                                          paths leave to SQL)
 *   key_store_row.c                       the columns of a key row and their one decoder, used by every path
 *   key_store_types.h                     the shared types (KeyRef, KeyRow, KeyWrite, leases)
 *
 * No path includes key_store.h or calls the facade; the facade calls the paths.
 *
 * Every statement names the table by its schema (the schema of the calling
 * function, which is the extension's) and every operator by pg_catalog, so no
 * object on the caller's search_path is ever used. Every path acts as the
 * caller: table privileges and row level security apply.
 */
#ifndef IDEM_KEY_STORE_H
#define IDEM_KEY_STORE_H

#include "key_store_types.h"

/* Looks a key up; out->found is false when no row exists. */
void		key_store_lookup(const KeyRef *ref, LookupSnapshot snapshot, KeyRow *out);

/* True when the storage mode is partitioned (idempotency_keys_partitioned has range partitions). */
bool		key_store_partitioned(Oid namespace_oid);

/* Writes the one row of a completed transactional claim. */
void		key_store_write(const KeyRef *ref, const KeyWrite *row);

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
