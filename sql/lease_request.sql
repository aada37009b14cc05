-- idem_lease_complete_request (1.3): lease mode's completion with the response as the bytes sent and its
-- content type, replayed byte for byte (by idem_claim_request, and by idem_lease's two 1.3 columns); a 5xx
-- never stored; only the current token completes; every bad input with its SQLSTATE, changing nothing.
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
\i :abs_srcdir/sql/include/undated.sql
CREATE TEMP TABLE held (key text PRIMARY KEY, token uuid);
CREATE FUNCTION token_of(k text) RETURNS uuid LANGUAGE sql AS $$ SELECT token FROM held WHERE key = k $$;

-- An HTML answer, stored as sent: the row keeps the bytes and the type, no jsonb body, and the lease is over.
INSERT INTO held SELECT 'html', lease_token
FROM idem_lease('html', idem_fingerprint('POST', '/pages', NULL, 'application/json', '{"n": 1}'), '1 min',
                scope => 'acct');
SELECT idem_lease_complete_request('html', 'acct', token_of('html'), 201, 'text/html; charset=utf-8',
                                   '{"Location": "/pages/1"}', convert_to(E'<p>caf\u00e9</p>\n', 'UTF8'));
SELECT http_status, response_body IS NULL AS no_jsonb, response_content_type, response_headers,
       response_bytes = convert_to(E'<p>caf\u00e9</p>\n', 'UTF8') AS same_bytes, lease_until, lease_token
FROM idempotency_keys WHERE key = 'html';
-- Replayed byte for byte by the 1.3 claim, with its type and headers (the JSON request spelled otherwise).
SELECT (c).outcome, (c).http_status, (c).content_type, pg_temp.undated((c).headers) AS headers,
       (c).body = convert_to(E'<p>caf\u00e9</p>\n', 'UTF8') AS same_bytes
FROM (SELECT idem_claim_request('html', 'acct', 'POST', '/pages', NULL, 'application/json', '{ "n" : 1 }') AS c) s;
-- The lease claim replays the same bytes and type (1.3's last two columns); not JSON, so no jsonb body.
SELECT outcome, http_status, response_body, pg_temp.undated(response_headers) AS response_headers, lease_token,
       response_content_type,
       response_bytes = convert_to(E'<p>caf\u00e9</p>\n', 'UTF8') AS same_bytes
FROM idem_lease('html', idem_fingerprint('POST', '/pages', NULL, 'application/json', '{"n": 1}'), '1 min',
                scope => 'acct');
-- Another payload is still a mismatch.
SELECT (idem_claim_request('html', 'acct', 'POST', '/pages', NULL, 'application/json', '{"n": 2}')).outcome;

-- JSON bytes keep their spelling: both 1.3 claims replay them exactly; as jsonb, the 1.0 and lease claims.
INSERT INTO held SELECT 'json', lease_token FROM idem_lease('json', idem_fingerprint('PUT', '/j', NULL, NULL, NULL), '1 min');
SELECT idem_lease_complete_request('json', '', token_of('json'), 200, 'application/json', NULL,
                                   '{"b": 2,  "a": [1.0, 1e2]}');
SELECT convert_from((idem_claim_request('json', '', 'PUT', '/j', NULL, NULL, NULL)).body, 'UTF8') AS exact;
SELECT outcome, response_body, response_content_type, convert_from(response_bytes, 'UTF8') AS exact
FROM idem_lease('json', idem_fingerprint('PUT', '/j', NULL, NULL, NULL), '1 min');
SELECT outcome, response_body FROM idem_claim('json', idem_fingerprint('PUT', '/j', NULL, NULL, NULL));

-- An empty 204, a binary body and a body-less answer with headers replay exactly.
INSERT INTO held SELECT k, lease_token
FROM unnest(ARRAY['empty', 'proto', 'none']) AS k, idem_lease(k, idem_fingerprint('POST', '/' || k, NULL, NULL, NULL), '1 min');
SELECT idem_lease_complete_request('empty', '', token_of('empty'), 204, NULL, NULL, ''::bytea);
SELECT idem_lease_complete_request('proto', '', token_of('proto'), 200, 'application/x-protobuf', NULL, '\x08960100ff');
SELECT idem_lease_complete_request('none', '', token_of('none'), 202, NULL, '{"Retry-After": "5"}', NULL);
SELECT k, (c).outcome, (c).http_status, (c).content_type, pg_temp.undated((c).headers) AS headers, (c).body
FROM unnest(ARRAY['empty', 'proto', 'none']) AS k,
     LATERAL (SELECT idem_claim_request(k, '', 'POST', '/' || k, NULL, NULL, NULL) AS c) s;
SELECT k, outcome, http_status, response_content_type, pg_temp.undated(response_headers) AS response_headers,
       response_bytes
FROM unnest(ARRAY['empty', 'proto', 'none']) AS k,
     idem_lease(k, idem_fingerprint('POST', '/' || k, NULL, NULL, NULL), '1 min');

-- A response stored as jsonb (idem_lease_complete) replays through the lease claim as its jsonb text's bytes,
-- with no content type, as through idem_claim_request.
INSERT INTO held SELECT 'jsonb', lease_token FROM idem_lease('jsonb', idem_hash('jsonb'), '1 min');
SELECT idem_lease_complete('jsonb', token_of('jsonb'), 201, '{"b": 2,  "a": 1}');
SELECT outcome, response_body, response_content_type, convert_from(response_bytes, 'UTF8') AS bytes
FROM idem_lease('jsonb', idem_hash('jsonb'), '1 min');
-- Only a replay carries them: a claim, an in_progress and a mismatch have none.
SELECT outcome, response_content_type, response_bytes FROM idem_lease('jsonb-2', idem_hash('a'), '1 min');
SELECT outcome, response_content_type, response_bytes FROM idem_lease('jsonb-2', idem_hash('a'), '1 min');
SELECT outcome, response_content_type, response_bytes FROM idem_lease('jsonb', idem_hash('other'), '1 min');

-- A 5xx is never stored: false, the lease ends now, its recovery point stays, its token is spent.
INSERT INTO held SELECT '5xx', lease_token FROM idem_lease('5xx', idem_hash('a'), '1 min');
SELECT idem_checkpoint('5xx', token_of('5xx'), 'charged', '{"charge": "ch_1"}');
SELECT idem_lease_complete_request('5xx', '', token_of('5xx'), 503, 'text/plain', NULL, 'busy');
SELECT http_status, response_body, response_content_type, response_bytes, lease_token,
       lease_until <= now() AS lapsed, recovery_point
FROM idempotency_keys WHERE key = '5xx';
SELECT sqlstate_of($$SELECT idem_lease_complete_request('5xx', '', token_of('5xx'), 201, NULL, NULL, 'x')$$);
-- The retry takes the key over, resumes at the recovery point, and stores its answer.
UPDATE held SET token = (SELECT lease_token FROM idem_lease('5xx', idem_hash('a'), '1 min')) WHERE key = '5xx';
SELECT recovery_point FROM idempotency_keys WHERE key = '5xx';
SELECT idem_lease_complete_request('5xx', '', token_of('5xx'), 201, 'text/plain', NULL, 'done');
SELECT outcome, http_status FROM idem_lease('5xx', idem_hash('a'), '1 min');

-- Only the key's current token completes (55000, nothing written): a random one, one of another scope, a
-- spent one, the first holder's after a takeover, and a second completion by the holder that completed.
INSERT INTO held SELECT 'fence', lease_token FROM idem_lease('fence', idem_hash('a'), '1 min');
SELECT sqlstate_of($$SELECT idem_lease_complete_request('fence', '', gen_random_uuid(), 201, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete_request('fence', 'other', token_of('fence'), 201, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete_request('no-such-key', '', token_of('fence'), 201, NULL, NULL, 'x')$$);
INSERT INTO held SELECT 'fence-old', token_of('fence');
UPDATE idempotency_keys SET lease_until = now() - interval '1 s' WHERE key = 'fence';
UPDATE held SET token = (SELECT lease_token FROM idem_lease('fence', idem_hash('a'), '1 min')) WHERE key = 'fence';
SELECT token_of('fence') <> token_of('fence-old') AS new_token;
SELECT sqlstate_of($$SELECT idem_lease_complete_request('fence', '', token_of('fence-old'), 201, NULL, NULL, 'stale')$$);
SELECT http_status, response_bytes, lease_token = token_of('fence') AS current_holder
FROM idempotency_keys WHERE key = 'fence';
SELECT idem_lease_complete_request('fence', '', token_of('fence'), 201, NULL, NULL, 'fresh');
SELECT sqlstate_of($$SELECT idem_lease_complete_request('fence', '', token_of('fence'), 200, NULL, NULL, 'again')$$);
SELECT http_status, convert_from(response_bytes, 'UTF8') AS body FROM idempotency_keys WHERE key = 'fence';

-- A completed bytes row that expires is leased again with no trace of the old answer.
UPDATE idempotency_keys SET expires_at = now() - interval '1 s' WHERE key = 'proto';
SELECT outcome FROM idem_lease('proto', idem_fingerprint('POST', '/proto', NULL, NULL, NULL), '1 min');
SELECT http_status, response_content_type, response_bytes, lease_token IS NOT NULL AS leased
FROM idempotency_keys WHERE key = 'proto';

-- Bad input: the SQLSTATE, and the lease is still live and its holder's.
INSERT INTO held SELECT 'bad', lease_token FROM idem_lease('bad', idem_hash('a'), '1 min');
SELECT sqlstate_of($$SELECT idem_lease_complete_request(NULL, '', token_of('bad'), 201, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete_request('bad', NULL, token_of('bad'), 201, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete_request('bad', '', NULL, 201, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete_request('bad', '', token_of('bad'), NULL, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete_request('', '', token_of('bad'), 201, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete_request('bad', '', token_of('bad'), 99, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete_request('bad', '', token_of('bad'), 600, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete_request('bad', '', token_of('bad'), 201, NULL, '[1]', 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete_request('bad', '', token_of('bad'), 201, E'text/html\r\nX-Evil: 1', NULL, 'x')$$);
SET idempotency.max_response_bytes = 1024;
SELECT sqlstate_of($$SELECT idem_lease_complete_request('bad', '', token_of('bad'), 201, NULL, NULL, convert_to(repeat('x', 1025), 'UTF8'))$$);
RESET idempotency.max_response_bytes;
SELECT http_status, response_bytes, lease_token = token_of('bad') AS current_holder, lease_until > now() AS live
FROM idempotency_keys WHERE key = 'bad';
SELECT idem_lease_complete_request('bad', '', token_of('bad'), 201, E'text/plain;\tcharset=utf-8', NULL, 'ok');

DROP FUNCTION token_of(text);
DROP FUNCTION sqlstate_of(text);
TRUNCATE idempotency_keys;
