/*
 * citus.h: the key store on a Citus cluster (see "Scaling out with Citus" in the README).
 *
 * The one supported layout: idempotency_keys distributed by scope (idem_citus_distribute), every call that
 * takes a scope delegated to the node that holds that scope's shard. On such a node the table named
 * idempotency_keys is not where the rows are (the coordinator's is an empty shell; a worker's is the
 * extension's own plain table), so the key store reads and writes through SQL, which Citus routes to the
 * shard, and refuses a call made anywhere else. Nothing here calls Citus's C code: its catalogs are read
 * with SQL, only when the citus extension exists, so the extension builds and runs without Citus.
 */
#ifndef IDEM_CITUS_H
#define IDEM_CITUS_H

#include "utils/relcache.h"

#include "cleanup.h"

/*
 * For key_store.c, before each call reads or writes a key: true when the key table is distributed by Citus,
 * in which case the caller never takes the direct path on keys itself. With local_shard (lookups and inserts)
 * and idempotency.citus_direct on, *local_shard is the scope's shard relation on this node, locked as a
 * Citus write locks it for the rest of the transaction, so that the caller may take the direct path on it;
 * InvalidOid (and always for callers passing NULL): take the SQL statements, which Citus routes. ERROR when
 * the scope's shard has no placement on this node (the call was not delegated, or the shard moved away), or
 * when the layout is one that cannot keep the guarantee (keys local beside distributed tables, keys as a
 * reference table, partitioned storage).
 */
bool		citus_route_key_call(Relation keys, bool partitioned, text *scope, Oid *local_shard);

/*
 * For cleanup.c, before a batch: the relation the batch deletes from. Unchanged without Citus; on a Citus
 * node, the current local shard of idempotency_keys (none on the coordinator). False when this node holds
 * no rows of the key table: the batch then does nothing and the sweep is finished.
 */
bool		citus_sweep_target(Oid schema, const char **relname, SweepPosition *position);

/* For cleanup.c, after a batch: a finished shard hands over to the next local shard, if any. */
void		citus_sweep_advance(SweepPosition *position);

#endif
