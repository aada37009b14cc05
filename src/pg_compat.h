/*
 * pg_compat.h: every difference between the PostgreSQL majors the extension
 * builds against (15, 17, 18), in one place. Include it after postgres.h;
 * the rest of the code calls the idem_* names below and has no version #if.
 */
#ifndef IDEM_PG_COMPAT_H
#define IDEM_PG_COMPAT_H

#include "access/genam.h"
#include "executor/executor.h"
#include "utils/relcache.h"

#if PG_VERSION_NUM < 150000
#error "idempotency needs PostgreSQL 15 or later"
#endif

/* 16 moved VARDATA_ANY, VARSIZE_ANY_EXHDR and the other varlena macros out of postgres.h. */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/*
 * 18 replaced the suffix pg_attribute_noreturn() with the prefix pg_noreturn.
 * Written as a prefix: GCC and clang take the attribute there too.
 */
#if PG_VERSION_NUM >= 180000
#define idem_noreturn pg_noreturn
#else
#define idem_noreturn pg_attribute_noreturn()
#endif

/* 17 added the MERGE actions, 18 the ON CONFLICT action, to CheckValidResultRel. */
#if PG_VERSION_NUM >= 180000
#define idem_check_valid_insert_rel(rri) CheckValidResultRel((rri), CMD_INSERT, ONCONFLICT_NONE, NIL)
#elif PG_VERSION_NUM >= 170000
#define idem_check_valid_insert_rel(rri) CheckValidResultRel((rri), CMD_INSERT, NIL)
#else
#define idem_check_valid_insert_rel(rri) CheckValidResultRel((rri), CMD_INSERT)
#endif

/* 16 added onlySummarizing (index updates of HOT tuples) to ExecInsertIndexTuples. */
#if PG_VERSION_NUM >= 160000
#define idem_insert_index_tuples(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL, false)
#else
#define idem_insert_index_tuples(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL)
#endif

/* 18 added the scan's instrumentation (EXPLAIN ANALYZE's index searches) to index_beginscan. */
#if PG_VERSION_NUM >= 180000
#define idem_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define idem_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/*
 * 18 lets RelationGetPrimaryKeyIndex return a deferrable primary key on request;
 * without it (false), as before 18, a deferrable one is not returned.
 */
#if PG_VERSION_NUM >= 180000
#define idem_primary_key_index(rel) RelationGetPrimaryKeyIndex((rel), false)
#else
#define idem_primary_key_index(rel) RelationGetPrimaryKeyIndex(rel)
#endif

/*
 * This backend's index among MaxBackends, from 0; negative for a process without one.
 * 17 replaced MyBackendId (from 1, InvalidBackendId -1) by MyProcNumber (from 0).
 */
#if PG_VERSION_NUM >= 170000
#include "storage/procnumber.h"
#define idem_my_backend_index() ((int) MyProcNumber)
#else
#include "storage/backendid.h"
#define idem_my_backend_index() (MyBackendId == InvalidBackendId ? -1 : (int) MyBackendId - 1)
#endif

/* 16 replaced pg_proc_aclcheck by object_aclcheck on pg_proc. */
#if PG_VERSION_NUM >= 160000
#define idem_function_aclcheck(function, role, mode) object_aclcheck(ProcedureRelationId, (function), (role), (mode))
#else
#define idem_function_aclcheck(function, role, mode) pg_proc_aclcheck((function), (role), (mode))
#endif

/*
 * 16 added the out argument that says which indexes an update must keep (TU_UpdateIndexes) to
 * simple_heap_update; before, a heap-only (HOT) tuple needs no index entry. True: every index needs one.
 */
#include "access/heapam.h"
#include "access/htup_details.h"
#if PG_VERSION_NUM >= 160000
static inline bool
idem_simple_heap_update(Relation rel, ItemPointer otid, HeapTuple tuple)
{
	TU_UpdateIndexes update_indexes;

	simple_heap_update(rel, otid, tuple, &update_indexes);
	return update_indexes == TU_All;
}
#else
static inline bool
idem_simple_heap_update(Relation rel, ItemPointer otid, HeapTuple tuple)
{
	simple_heap_update(rel, otid, tuple);
	return !HeapTupleIsHeapOnly(tuple);
}
#endif

#endif							/* IDEM_PG_COMPAT_H */
