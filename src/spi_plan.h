/* spi_plan.h: the one way the extension prepares a statement it keeps for the backend's life. */
#ifndef IDEM_SPI_PLAN_H
#define IDEM_SPI_PLAN_H

#include "executor/spi.h"

/*
 * Prepares sql (SPI connected) with the cursor options given (0: the plan cache chooses generic or custom
 * plans) and keeps the plan past SPI_finish; ERROR when it cannot.
 */
SPIPlanPtr	spi_prepare_kept(const char *sql, int nargs, Oid *argtypes, int cursor_options);

#endif
