-- Moving between editions (issue 40), run by scripts/test-managed.sh: the keys a database holds before its dump,
-- in whichever edition it runs. A completed key (jsonb), a completed key stored as bytes, a held lease with its
-- token and fencing number (kept in move_tokens, an ordinary table the dump carries along).
\set ON_ERROR_STOP on
BEGIN;
SELECT outcome FROM idem_claim('done', idem_hash('d'));
SELECT idem_complete('done', 201, '{"id": 1}', '{"Location": "/p/1"}');
COMMIT;
BEGIN;
SELECT (idem_claim_request('lean', 'acct', 'POST', '/p', NULL, 'text/plain', 'x')).outcome;
SELECT idem_complete_request('lean', 'acct', 200, 'text/plain', NULL, 'hello');
COMMIT;
CREATE TABLE move_tokens AS SELECT 'held'::text AS key, lease_token, fencing_number
FROM idem_lease('held', idem_hash('h'), '1 hour');
