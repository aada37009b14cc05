/* idempotency.c: the module's entry point: one init call per subsystem. */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"

#include "guc.h"
#include "in_flight.h"
#include "stats.h"
#include "txn_claims.h"
#include "worker.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	/* pg_upgrade loads the library only to check it: no settings, worker or shared memory then. */
	if (IsBinaryUpgrade)
		return;
	settings_init();
	txn_claims_init();
	stats_init();
	in_flight_init();
	worker_init();
}
