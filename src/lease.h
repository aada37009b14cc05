/* lease.h: the holder's side of lease mode, shared by lease.c and idem_lease_complete in complete.c. */
#ifndef IDEM_LEASE_H
#define IDEM_LEASE_H

#include "fmgr.h"

#include "key_store.h"

typedef struct LeaseHolder
{
	KeyRef		ref;
	pg_uuid_t	token;
	uint8		identity[IDEM_SHA256_BYTES];
} LeaseHolder;

/* Key, token and scope from the arguments; ERROR 22004 / 22023 on bad input. */
void		lease_holder_args(FunctionCallInfo fcinfo, int key_argno, int token_argno, int scope_argno,
							  LeaseHolder *holder);

/*
 * Waits for the key's lock, then applies the change if the token is current;
 * ERROR 55000 and nothing written otherwise. Returns the lease's end afterwards.
 */
TimestampTz lease_holder_change(LeaseHolder *holder, LeaseChange change,
								const LeaseChangeValues *values, const char *caller);

#endif
