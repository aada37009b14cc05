/*
 * citus.h: the key store on a Citus cluster (see "Scaling out with Citus" in the README), the one file that
 * knows Citus. It answers two questions: which relation holds a scope's keys on this node (for key_store.c),
 * and which relations a sweep of this node deletes from (for cleanup.c).
 *
 * The one supported layout: idempotency_keys distributed by scope (idem_citus_distribute), every call that
 * takes a scope delegated to the node that holds that scope's shard. On such a node the table named
 * idempotency_keys is not where the rows are (the coordinator's is an empty shell; a worker's is the
 * extension's own plain table): the key store works on the scope's local shard directly, or through SQL,
 * which Citus routes to the shard, and refuses a call made anywhere else. Nothing here links against Citus:
 * its catalogs are read with SQL and its functions called through the catalog, only when the citus
 * extension exists, so the extension builds and runs without Citus.
 */
#ifndef IDEM_CITUS_H
#define IDEM_CITUS_H

#include "nodes/pg_list.h"

/*
 * Before a call reads or writes a scope's keys in table (idempotency_keys): the relation on this node that
 * the direct path may work on. Without Citus, or with Citus and the key table not in its metadata, table
 * itself. On a Citus node that distributes it: with direct and idempotency.citus_direct on and no row level
 * security on table, the scope's local shard, locked as a Citus write locks it for the rest of the
 * transaction; else InvalidOid: take the statements, which Citus routes. ERROR when the scope's shard has no
 * placement on this node (the call was not delegated, or the shard moved away), or when the layout is one
 * that cannot keep the guarantee (keys local beside distributed tables, keys as a reference table,
 * partitioned storage).
 */
Oid			citus_key_relation(Oid table, bool partitioned, text *scope, bool direct);

/*
 * In a sweep's transaction: the relations (OIDs, in order) a sweep of table deletes expired rows from on
 * this node. Without Citus, table itself; on a Citus node that distributes it, its local shards (none on the
 * coordinator), which this transaction may then change by name; none for a layout no claim accepts.
 */
List	   *citus_sweep_relations(Oid table);

/*
 * In a transaction: whether Citus distributes this database's idempotency_keys (hash, by scope). For the check
 * of idempotency.tombstone_ttl (guc.c): tombstones are not supported there (1.4).
 */
bool		citus_keys_distributed_here(void);

#endif
