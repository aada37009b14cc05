-- The same requests in scope :'scope', for sql/attack.sql: every name schema-qualified and no operator or
-- backslash in the text, so that the statements mean the same under any search_path, planted object or setting
-- the caller picks; only what the extension's functions do may differ, and nothing does.
-- Its temporary table is dropped by the caller, under its own search_path (pg_tle's sql_drop event trigger compares
-- with the caller's =).
CREATE TEMP TABLE attack_lease (token pg_catalog.uuid, fencing bigint);
-- A transactional claim, its completion, the replay and a mismatch.
BEGIN;
SELECT outcome, http_status FROM public.idem_claim('pay', public.idem_hash('a'), scope => :'scope');
SELECT public.idem_complete('pay', 201, '{"charge": "ch_1", "amount": 1.10}', '{"Location": "/p/1"}', :'scope');
COMMIT;
SELECT outcome, http_status, response_body, response_headers
FROM public.idem_claim('pay', public.idem_hash('a'), scope => :'scope');
SELECT outcome, http_status FROM public.idem_claim('pay', public.idem_hash('b'), scope => :'scope');
-- The lean request: a fingerprint of its parts, the response stored as bytes.
BEGIN;
SELECT outcome, http_status
FROM public.idem_claim_request('page', :'scope', 'POST', '/pages', 'q=1', 'application/json', '{"n": 1.50}');
SELECT public.idem_complete_request('page', :'scope', 200, 'text/plain', '{"X-A": "1"}',
                                    pg_catalog.decode('00ff5c27', 'hex'));
COMMIT;
SELECT outcome, http_status, content_type, pg_catalog.encode(body, 'hex') AS body
FROM public.idem_claim_request('page', :'scope', 'POST', '/pages', 'q=1', 'application/json', '{ "n" : 1.50 }');
SELECT outcome, http_status
FROM public.idem_claim_request('page', :'scope', 'POST', '/pages', 'q=2', 'application/json', '{"n": 1.50}');
-- A lease: its fencing number kept, a recovery point, the completion and its replay.
INSERT INTO pg_temp.attack_lease
SELECT lease_token, fencing_number FROM public.idem_lease('ride', public.idem_hash('r'), interval '1 min', scope => :'scope');
SELECT public.idem_checkpoint('ride', (SELECT token FROM pg_temp.attack_lease), 'charged', '{"charge": "ch_2"}', :'scope');
SELECT public.idem_lease_complete('ride', (SELECT token FROM pg_temp.attack_lease), 200, '{"ride": 1}', NULL, :'scope');
SELECT outcome, http_status, response_body
FROM public.idem_lease('ride', public.idem_hash('r'), interval '1 min', scope => :'scope');
INSERT INTO public.attack_fencing (scope, fencing) SELECT :'scope', fencing FROM pg_temp.attack_lease;
-- A release frees the key; the keys in flight are the transaction's own claim.
BEGIN;
SELECT outcome FROM public.idem_claim('gone', public.idem_hash('g'), scope => :'scope');
SELECT public.idem_release('gone', :'scope');
SELECT outcome FROM public.idem_claim('held', public.idem_hash('h'), scope => :'scope');
SELECT scope, key FROM public.idem_keys_in_flight() ORDER BY scope, key;
COMMIT;
SELECT outcome FROM public.idem_claim_wait('gone', public.idem_hash('g'), interval '0', scope => :'scope');
-- Digests.
SELECT public.idem_hash(pg_catalog.jsonb_build_object('b', 1, 'a', pg_catalog.jsonb_build_array(1.0, 2, 'x')))
    AS jsonb_hash,
       public.idem_fingerprint('POST', '/p', 'q=1', 'application/json',
                               pg_catalog.convert_to('{"a": 1e2, "b": [true, null]}', 'UTF8')) AS fingerprint;
-- Expiry: an expired key removed by the cleanup (and by the managed edition's pg_cron sweep, where there is one),
-- then claimed anew.
BEGIN;
SELECT outcome FROM public.idem_claim('old', public.idem_hash('o'), interval '1 microsecond', :'scope');
SELECT public.idem_complete('old', 200, NULL, NULL, :'scope');
COMMIT;
SELECT pg_catalog.pg_sleep(0.01);
SELECT public.idem_cleanup() AS removed;
DO $attack$
BEGIN
    IF pg_catalog.to_regprocedure('public.idem_managed_sweep()') IS NOT NULL THEN
        CALL public.idem_managed_sweep();
    END IF;
END
$attack$;
SELECT outcome FROM public.idem_claim('old', public.idem_hash('o'), scope => :'scope');
