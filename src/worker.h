/*
 * worker.h: the cleanup worker.
 *
 * One launcher per cluster, registered while preloading. Every
 * idempotency.cleanup_interval it walks the databases in idempotency.databases
 * one after another; for each it starts a short-lived sweeper connected to that
 * database, which deletes expired keys one batch per transaction and exits.
 * Sweeping databases in turn keeps at most one extra backend busy.
 */
#ifndef IDEM_WORKER_H
#define IDEM_WORKER_H

/* Registers the launcher and its shared memory; a no-op unless preloading. */
void		worker_init(void);

#endif
