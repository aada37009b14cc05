/*
 * subtransaction.h: run one step in an internal subtransaction, as a PL/pgSQL exception block runs its body,
 * and hand back the ERROR it raised instead of raising it.
 */
#ifndef IDEM_SUBTRANSACTION_H
#define IDEM_SUBTRANSACTION_H

#include "utils/elog.h"

typedef void (*SubtransactionStep) (void *arg);

/*
 * Runs step(arg) in an internal subtransaction. NULL when it returned: the subtransaction is released and what
 * it did or took (rows, locks) is the caller's. Otherwise the subtransaction is rolled back and its ERROR comes
 * back, copied into the caller's memory context, for the caller to report, rethrow (ReThrowError) or free
 * (FreeErrorData). The caller's memory context and resource owner are current again either way.
 */
ErrorData  *run_in_subtransaction(SubtransactionStep step, void *arg);

#endif
