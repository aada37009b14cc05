/* guc.h: the idempotency.* settings. */
#ifndef IDEM_GUC_H
#define IDEM_GUC_H

extern int	idem_ttl_seconds;
extern int	idem_mismatch_status;
extern int	idem_max_response_bytes;

void		idem_define_settings(void);

#endif
