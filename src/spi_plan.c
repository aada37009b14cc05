/* spi_plan.c: kept prepared statements; see spi_plan.h. */
#include "postgres.h"

#include "spi_plan.h"

SPIPlanPtr
spi_prepare_kept(const char *sql, int nargs, Oid *argtypes, int cursor_options)
{
	SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, argtypes, cursor_options);

	if (plan == NULL)
		elog(ERROR, "idempotency: could not prepare \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "idempotency: could not keep a prepared plan");
	return plan;
}
