/* fingerprint.h: the request fingerprint of 1.3 (issue 30), for idem_fingerprint and idem_claim_request. */
#ifndef IDEM_FINGERPRINT_H
#define IDEM_FINGERPRINT_H

#include "fmgr.h"

#include "idem_core.h"

/* Where a function has the request's parts among its arguments. */
typedef struct RequestArgs
{
	int			method;
	int			path;
	int			query;
	int			content_type;
	int			body;
} RequestArgs;

/*
 * The fingerprint of the request in the arguments: the core canonicalises it, or PostgreSQL's jsonb does when
 * the core leaves it (a body that is not JSON, or one outside the core's exact range, or a database that is not
 * UTF-8). ERROR 22004 for a NULL method or path; whatever body::jsonb raises for a JSON-form body that is not
 * JSON (22P02; 22021 for bytes that are not UTF-8, 22P05 for \u0000).
 */
void		request_fingerprint(FunctionCallInfo fcinfo, const RequestArgs *args,
								uint8 out[IDEM_SHA256_BYTES]);

/*
 * A response stored as bytes, as the jsonb the 1.0 functions return: the body parsed when its content type is
 * a JSON media type and it is JSON the core reads; else *isnull.
 */
Datum		response_bytes_as_jsonb(Datum content_type, bool content_type_null, Datum bytes, bool *isnull);

#endif
