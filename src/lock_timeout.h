/*
 * lock_timeout.h: run one step that may wait for a lock, giving up after a
 * lock_timeout of its own.
 *
 * The step runs in an internal subtransaction with lock_timeout set for it
 * alone, as a PL/pgSQL exception block would run it. A lock timeout (55P03)
 * rolls the step back and is reported as false; any other error (cancel,
 * statement_timeout, deadlock) goes on to the caller. What the step did or
 * took (rows, locks) becomes the caller's when it succeeds.
 */
#ifndef IDEM_LOCK_TIMEOUT_H
#define IDEM_LOCK_TIMEOUT_H

typedef void (*LockTimeoutStep) (void *arg);

/* timeout is a lock_timeout value, such as "20ms" or "150". */
bool		run_with_lock_timeout(const char *timeout, LockTimeoutStep step, void *arg);

#endif
