-- Moving between editions (issue 40), run by scripts/test-managed.sh in the database a dump was restored into,
-- after each trip (C edition -> managed edition -> C edition): one line "ok ..." or "not ok ..." per promise.
-- Every key answers as before, the held lease keeps its token, and fencing numbers keep rising.
SELECT CASE WHEN outcome = 'replay' AND http_status = 201 AND response_body = '{"id": 1}'
            AND response_headers = '{"Location": "/p/1"}' THEN 'ok' ELSE 'not ok' END || ' completed key replays'
FROM idem_claim('done', idem_hash('d'));
SELECT CASE WHEN outcome = 'mismatch' THEN 'ok' ELSE 'not ok' END || ' completed key still refuses another payload'
FROM idem_claim('done', idem_hash('other'));
SELECT CASE WHEN (c).outcome = 'replay' AND (c).http_status = 200 AND (c).content_type = 'text/plain'
            AND (c).body = 'hello'::bytea THEN 'ok' ELSE 'not ok' END || ' key stored as bytes replays'
FROM (SELECT idem_claim_request('lean', 'acct', 'POST', '/p', NULL, 'text/plain', 'x') AS c) s;
SELECT CASE WHEN outcome = 'in_progress' AND lease_until > now() THEN 'ok' ELSE 'not ok' END
       || ' held lease still answers in_progress'
FROM idem_lease('held', idem_hash('h'), '1 min');
SELECT CASE WHEN pg_typeof(idem_checkpoint('held', (SELECT lease_token FROM move_tokens WHERE key = 'held'),
                                           'moved', '{"trip": true}')) IS NOT NULL
            THEN 'ok' ELSE 'not ok' END || ' held lease keeps its token';
SELECT CASE WHEN recovery_point = 'moved' THEN 'ok' ELSE 'not ok' END || ' checkpoint by the held token stored'
FROM idempotency_keys WHERE key = 'held';
WITH grant_ AS (SELECT fencing_number FROM idem_lease('new-' || (SELECT count(*) FROM move_tokens),
                                                      idem_hash('n'), '1 min'))
SELECT CASE WHEN g.fencing_number > (SELECT max(fencing_number) FROM move_tokens) THEN 'ok' ELSE 'not ok' END
       || ' fencing numbers keep rising'
FROM grant_ g;
INSERT INTO move_tokens SELECT 'new', NULL, last_value FROM idempotency_fencing_numbers;
