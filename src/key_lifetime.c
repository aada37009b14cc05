/*
 * key_lifetime.c: the headers a claim's answer carries, with the key's expiry (1.4, issue 41, rule
 * key-lifetime). The date is written by the C++ core (idem_core_http_date) from the timestamp's seconds, so
 * DateStyle, TimeZone and lc_time never reach it; the jsonb is built directly, never through text.
 */
#include "postgres.h"

#include "access/xact.h"
#include "datatype/timestamp.h"
#include "utils/jsonb.h"

#include "idem_core.h"
#include "key_lifetime.h"

/* Unix seconds of a timestamptz, truncated toward the past. */
static int64
unix_seconds(TimestampTz ts)
{
	int64		seconds = ts / USECS_PER_SEC;

	if (ts % USECS_PER_SEC < 0)
		seconds--;
	return seconds + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY;
}

static void
push_string(JsonbParseState **state, JsonbIteratorToken token, char *data, int len)
{
	JsonbValue	value;

	value.type = jbvString;
	value.val.string.val = data;
	value.val.string.len = len;
	(void) pushJsonbValue(state, token, &value);
}

static bool
is_lifetime_member(const JsonbValue *key)
{
	return key->type == jbvString && key->val.string.len == (int) strlen(KEY_LIFETIME_HEADER) &&
		pg_strncasecmp(key->val.string.val, KEY_LIFETIME_HEADER, key->val.string.len) == 0;
}

/*
 * {KEY_LIFETIME_HEADER: date} laid out as jsonb's binary form directly (what pushJsonbValue and
 * JsonbValueToJsonb would make, at a fraction of their cost: the claim of a new key pays it): the container's
 * header (one pair, an object), the key's JEntry (a string; the first JEntry holds its end offset), the value's
 * (a string, its length), then the key's and the value's bytes, unpadded (strings need no alignment).
 */
static Datum
lifetime_only(const char date[IDEM_HTTP_DATE_CHARS])
{
	const uint32 key_len = sizeof(KEY_LIFETIME_HEADER) - 1;
	const uint32 size = VARHDRSZ + sizeof(uint32) + 2 * sizeof(JEntry) + key_len + IDEM_HTTP_DATE_CHARS;
	Jsonb	   *jb = palloc(size);
	char	   *data = (char *) jb->root.children + 2 * sizeof(JEntry);

	SET_VARSIZE(jb, size);
	jb->root.header = 1 | JB_FOBJECT;
	jb->root.children[0] = JENTRY_ISSTRING | JENTRY_HAS_OFF | key_len;
	jb->root.children[1] = JENTRY_ISSTRING | IDEM_HTTP_DATE_CHARS;
	memcpy(data, KEY_LIFETIME_HEADER, key_len);
	memcpy(data + key_len, date, IDEM_HTTP_DATE_CHARS);
	return JsonbPGetDatum(jb);
}

/* stored (a jsonb object, or NULL) with the member KEY_LIFETIME_HEADER: expires_at as an HTTP-date. */
static Datum
headers_with_expiry(Jsonb *stored, TimestampTz expires_at)
{
	char	   *date = palloc(IDEM_HTTP_DATE_CHARS);
	JsonbParseState *state = NULL;
	JsonbValue *result;
	IdemStatus	status = idem_core_http_date(unix_seconds(expires_at), date);

	/* expires_at is at most 3650 days past a transaction's start: always within the years an HTTP-date writes */
	if (status != IDEM_OK)
		elog(ERROR, "idempotency: the key's expiry has no HTTP-date: %s", idem_core_status_message(status));

	if (stored == NULL || !JB_ROOT_IS_OBJECT(stored) || JB_ROOT_COUNT(stored) == 0)
		return lifetime_only(date);
	(void) pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	{
		JsonbIterator *it = JsonbIteratorInit(&stored->root);
		JsonbValue	value;
		JsonbIteratorToken token;
		bool		skip = false;

		while ((token = JsonbIteratorNext(&it, &value, true)) != WJB_DONE)
		{
			if (token == WJB_KEY)
			{
				skip = is_lifetime_member(&value);
				if (!skip)
					(void) pushJsonbValue(&state, WJB_KEY, &value);
			}
			else if (token == WJB_VALUE)
			{
				if (!skip)
					(void) pushJsonbValue(&state, WJB_VALUE, &value);
			}
		}
	}
	push_string(&state, WJB_KEY, KEY_LIFETIME_HEADER, strlen(KEY_LIFETIME_HEADER));
	push_string(&state, WJB_VALUE, date, IDEM_HTTP_DATE_CHARS);
	result = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbPGetDatum(JsonbValueToJsonb(result));
}

Datum
key_lifetime_headers(IdemClaimOutcome outcome, const KeyRow *row, TimestampTz claimed_until, bool *isnull)
{
	*isnull = false;
	switch (outcome)
	{
		case IDEM_OUTCOME_CLAIMED:
			return headers_with_expiry(NULL, claimed_until);
		case IDEM_OUTCOME_REPLAY:
			return headers_with_expiry(row->headers_null ? NULL : DatumGetJsonbP(row->headers), row->expires_at);
		case IDEM_OUTCOME_MISMATCH:
			if (row->found)
				return headers_with_expiry(NULL, row->expires_at);
			break;
		case IDEM_OUTCOME_IN_PROGRESS:
			/* a committed lease's row; a claim in another transaction's flight is not visible */
			if (row->found && row->leased && row->expires_at > GetCurrentTransactionStartTimestamp())
				return headers_with_expiry(NULL, row->expires_at);
			break;
		default:
			break;
	}
	*isnull = true;
	return (Datum) 0;
}
