/* idempotency.c: the module's entry point. */
#include "postgres.h"

#include "fmgr.h"

#include "guc.h"
#include "txn_claims.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	idem_define_settings();
	txn_claims_init();
}
