/* idempotency.c: the module's entry point. */
#include "postgres.h"

#include "fmgr.h"

#include "guc.h"
#include "miscadmin.h"
#include "stats.h"
#include "worker.h"
#include "txn_claims.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	idem_define_settings();
	txn_claims_init();
	if (!process_shared_preload_libraries_in_progress)
		return;
	stats_request_shared_memory();
	worker_request_shared_memory();
	worker_register_launcher();
}
