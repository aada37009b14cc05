-- idem_claim_request and idem_complete_request (1.3, issue 30): the response stored as the bytes sent and
-- replayed byte for byte, any content type; the 1.0 functions read it; every bad input with its SQLSTATE.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
\i :abs_srcdir/sql/include/undated.sql
CREATE FUNCTION pg_temp.undated(c idem_request_claim) RETURNS idem_request_claim LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog AS $$ SELECT ROW(c.outcome, c.http_status, c.content_type, pg_temp.undated(c.headers), c.body)::public.idem_request_claim $$;

-- A JSON request, an HTML answer with a header: stored as sent, replayed as sent.
BEGIN;
SELECT pg_temp.undated(idem_claim_request('html', 'acct', 'POST', '/pages', NULL, 'application/json', '{"n": 1}')) AS idem_claim_request;
SELECT idem_complete_request('html', 'acct', 201, 'text/html; charset=utf-8', '{"Location": "/pages/1"}',
                             convert_to(E'<p>caf\u00e9</p>\n', 'UTF8'));
COMMIT;
SELECT (c).outcome, (c).http_status, (c).content_type, pg_temp.undated((c).headers) AS headers, convert_from((c).body, 'UTF8') AS body
FROM (SELECT idem_claim_request('html', 'acct', 'POST', '/pages', NULL, 'application/json', '{ "n" : 1 }') AS c) s;
-- Another body, another query: mismatch (422); another scope: a new key.
SELECT pg_temp.undated(idem_claim_request('html', 'acct', 'POST', '/pages', NULL, 'application/json', '{"n": 2}')) AS idem_claim_request;
SELECT pg_temp.undated(idem_claim_request('html', 'acct', 'POST', '/pages', 'ref=2', 'application/json', '{"n": 1}')) AS idem_claim_request;
BEGIN;
SELECT pg_temp.undated(idem_claim_request('html', 'other', 'POST', '/pages', NULL, 'application/json', '{"n": 1}')) AS idem_claim_request;
-- In flight, to a second claim in this transaction it is still this one's: in_progress answers others only.
ROLLBACK;

-- Binary, problem+json, an empty 204 and a body-less answer replay exactly.
BEGIN;
SELECT pg_temp.undated(idem_claim_request('proto', '', 'PUT', '/blob', NULL, 'application/x-protobuf', '\x0a0300ff01'::bytea)) AS idem_claim_request;
SELECT idem_complete_request('proto', '', 200, 'application/x-protobuf', NULL, '\x08960100ff'::bytea);
SELECT pg_temp.undated(idem_claim_request('problem', '', 'POST', '/p', NULL, NULL, '{}')) AS idem_claim_request;
SELECT idem_complete_request('problem', '', 409, 'application/problem+json', NULL,
                             '{"type":"about:blank", "status":409}');
SELECT pg_temp.undated(idem_claim_request('empty', '', 'DELETE', '/p/1', NULL, NULL, NULL)) AS idem_claim_request;
SELECT idem_complete_request('empty', '', 204, NULL, NULL, ''::bytea);
SELECT pg_temp.undated(idem_claim_request('none', '', 'DELETE', '/p/2', NULL, NULL, NULL)) AS idem_claim_request;
SELECT idem_complete_request('none', '', 202, NULL, '{"Retry-After": "5"}', NULL);
COMMIT;
SELECT pg_temp.undated(idem_claim_request('proto', '', 'PUT', '/blob', NULL, 'application/x-protobuf', '\x0a0300ff01'::bytea)) AS idem_claim_request;
SELECT pg_temp.undated(idem_claim_request('proto', '', 'PUT', '/blob', NULL, 'application/x-protobuf', '\x0a0300ff02'::bytea)) AS idem_claim_request;
SELECT pg_temp.undated(idem_claim_request('problem', '', 'POST', '/p', NULL, 'application/json', '{ }')) AS idem_claim_request;
SELECT pg_temp.undated(idem_claim_request('empty', '', 'DELETE', '/p/1', NULL, NULL, '')) AS idem_claim_request;
SELECT pg_temp.undated(idem_claim_request('none', '', 'DELETE', '/p/2', '', NULL, NULL)) AS idem_claim_request;
-- The 1.0 claim reads a bytes row: jsonb when its content type is JSON and it parses, else no body.
SELECT outcome, http_status, response_body, response_headers
FROM idem_claim('problem', idem_fingerprint('POST', '/p', NULL, NULL, '{}'));
SELECT outcome, http_status, response_body, response_headers
FROM idem_claim('proto', idem_fingerprint('PUT', '/blob', NULL, 'application/x-protobuf', '\x0a0300ff01'::bytea));

-- A key stored by the 1.0 completion (jsonb) replays through the 1.3 claim: its jsonb text as bytes.
BEGIN;
SELECT outcome FROM idem_claim('old', idem_hash(jsonb_build_object('method', 'POST', 'path', '/payments',
                                                                    'body', '{"amount_cents": 500}'::jsonb)));
SELECT idem_complete('old', 201, '{"payment_id": 7,"é":"\u00e9"}', '{"Content-Type": "application/json"}');
COMMIT;
SELECT (c).outcome, (c).http_status, (c).content_type, pg_temp.undated((c).headers) AS headers, convert_from((c).body, 'UTF8') AS body
FROM (SELECT idem_claim_request('old', '', 'POST', '/payments', NULL, 'application/json',
                                '{"amount_cents":500}') AS c) s;

-- A 5xx stores nothing and gives the key back; a rollback forgets the claim.
BEGIN;
SELECT pg_temp.undated(idem_claim_request('5xx', '', 'POST', '/p', NULL, NULL, '{}')) AS idem_claim_request;
SELECT idem_complete_request('5xx', '', 503, 'text/plain', NULL, 'busy');
SELECT pg_temp.undated(idem_claim_request('5xx', '', 'POST', '/p', NULL, NULL, '{}')) AS idem_claim_request;
ROLLBACK;

-- The columns: a bytes row keeps response_body NULL, a jsonb row keeps the bytes NULL.
SELECT key, response_body IS NULL AS no_jsonb, response_content_type, response_bytes
FROM idempotency_keys WHERE key IN ('proto', 'empty', 'none', 'old') ORDER BY key;

-- Bad input: the SQLSTATE, nothing claimed or stored.
SELECT sqlstate_of($$SELECT idem_claim_request(NULL, '', 'POST', '/p', NULL, NULL, '{}')$$);
SELECT sqlstate_of($$SELECT idem_claim_request('k', NULL, 'POST', '/p', NULL, NULL, '{}')$$);
SELECT sqlstate_of($$SELECT idem_claim_request('k', '', NULL, '/p', NULL, NULL, '{}')$$);
SELECT sqlstate_of($$SELECT idem_claim_request('k', '', 'POST', NULL, NULL, NULL, '{}')$$);
SELECT sqlstate_of($$SELECT idem_claim_request('', '', 'POST', '/p', NULL, NULL, '{}')$$);
SELECT sqlstate_of($$SELECT idem_claim_request(repeat('k', 256), '', 'POST', '/p', NULL, NULL, '{}')$$);
SELECT sqlstate_of($$SELECT idem_claim_request(E'k\n', '', 'POST', '/p', NULL, NULL, '{}')$$);
SELECT sqlstate_of($$SELECT idem_claim_request('k', '', 'POST', '/p', NULL, 'application/json', 'not json')$$);
SELECT sqlstate_of($$SELECT idem_claim_request('k', '', 'POST', '/p', NULL, NULL, '\xff'::bytea)$$);
SELECT sqlstate_of($$SELECT idem_claim_request('k', '', 'POST', '/p', NULL, 'application/json', NULL)$$);
SELECT sqlstate_of($$SELECT idem_claim_request('k', '', 'POST', '/p', NULL, NULL, '{}', interval '-1 s')$$);
SELECT sqlstate_of($$SELECT idem_claim_request('k', '', 'POST', '/p', NULL, NULL, '{}', interval '3651 days')$$);
SELECT sqlstate_of($$SELECT idem_complete_request('never', '', 201, NULL, NULL, 'x')$$);
BEGIN;
SELECT outcome FROM idem_claim_request('k', '', 'POST', '/p', NULL, NULL, '{}');
SELECT sqlstate_of($$SELECT idem_complete_request(NULL, '', 201, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_complete_request('k', NULL, 201, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_complete_request('k', '', NULL, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_complete_request('k', '', 99, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_complete_request('k', '', 600, NULL, NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_complete_request('k', '', 201, NULL, '[1]', 'x')$$);
SELECT sqlstate_of($$SELECT idem_complete_request('k', '', 201, E'text/html\r\nX-Evil: 1', NULL, 'x')$$);
SET LOCAL idempotency.max_response_bytes = 1024;
SELECT sqlstate_of($$SELECT idem_complete_request('k', '', 201, NULL, NULL, convert_to(repeat('x', 1025), 'UTF8'))$$);
-- Still claimed after every refusal, and completes.
SELECT idem_complete_request('k', '', 201, E'text/plain;\tcharset=utf-8', NULL, 'ok');
COMMIT;
SELECT (idem_claim_request('k', '', 'POST', '/p', NULL, NULL, '{}')).content_type;
DROP FUNCTION sqlstate_of(text);
