/* lock_timeout.c: one step under a lock_timeout of its own, in a subtransaction. */
#include "postgres.h"

#include "access/xact.h"
#include "utils/elog.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "lock_timeout.h"

bool
run_with_lock_timeout(const char *timeout, LockTimeoutStep step, void *arg)
{
	MemoryContext context = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	bool		done = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(context);
	PG_TRY();
	{
		int			guc_level = NewGUCNestLevel();

		(void) set_config_option("lock_timeout", timeout, PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		step(arg);
		AtEOXact_GUC(true, guc_level);
		ReleaseCurrentSubTransaction();
		done = true;
	}
	PG_CATCH();
	{
		ErrorData  *error;

		MemoryContextSwitchTo(context);
		error = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(context);
		CurrentResourceOwner = owner;
		if (error->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			ReThrowError(error);
		FreeErrorData(error);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(context);
	CurrentResourceOwner = owner;
	return done;
}
