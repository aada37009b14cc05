/* lock_timeout.c: one step under a lock_timeout of its own, in a subtransaction. */
#include "postgres.h"

#include "utils/guc.h"

#include "lock_timeout.h"
#include "subtransaction.h"

typedef struct TimedStep
{
	const char *timeout;
	LockTimeoutStep step;
	void	   *arg;
} TimedStep;

/* The step with lock_timeout set for it alone; an ERROR undoes the setting with the subtransaction. */
static void
timed_step(void *arg)
{
	TimedStep  *timed = arg;
	int			guc_level = NewGUCNestLevel();

	(void) set_config_option("lock_timeout", timed->timeout, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
							 false);
	timed->step(timed->arg);
	AtEOXact_GUC(true, guc_level);
}

bool
run_with_lock_timeout(const char *timeout, LockTimeoutStep step, void *arg)
{
	TimedStep	timed = {.timeout = timeout, .step = step, .arg = arg};
	ErrorData  *error = run_in_subtransaction(timed_step, &timed);

	if (error == NULL)
		return true;
	if (error->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
		ReThrowError(error);
	FreeErrorData(error);
	return false;
}
