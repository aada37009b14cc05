-- Runs the same scenarios against one implementation of the API, chosen by the psql variable api
-- (public = the extension, plpgsql_idem = the baseline). run.sh runs it for both and requires the two
-- outputs to be identical, so the benchmark compares implementations with the same behaviour.
-- Needs psql variables api and conninfo (for a second session through dblink).
\set ON_ERROR_STOP 0
\set VERBOSITY sqlstate
\pset footer off
TRUNCATE :"api".idempotency_keys;
SELECT encode(sha256('x'), 'hex') AS hx, encode(sha256('y'), 'hex') AS hy \gset

-- Claim, in_progress in the same transaction, complete, replay in the same transaction.
BEGIN;
SELECT outcome, http_status, expires_at = now() + interval '24h' AS ttl_24h FROM :"api".idem_claim('k1', :'hx');
SELECT outcome, http_status FROM :"api".idem_claim('k1', :'hx');
SELECT :"api".idem_complete('k1', 201, '{"id": 1}', '{"Location": "/1"}');
SELECT outcome, http_status, response_body, response_headers FROM :"api".idem_claim('k1', :'hx');
COMMIT;
-- Replay (hex of either case), mismatch and its setting, explicit and configured ttl.
SELECT outcome, http_status, response_body FROM :"api".idem_claim('k1', upper(:'hx'));
SELECT outcome, http_status, response_body FROM :"api".idem_claim('k1', :'hy');
SET idempotency.mismatch_status = 400;
SET plpgsql_idem.mismatch_status = 400;
SELECT outcome, http_status FROM :"api".idem_claim('k1', :'hy');
BEGIN;
SELECT expires_at = now() + interval '5 min' AS ttl_arg FROM :"api".idem_claim('k2', :'hx', '5 min');
SET LOCAL idempotency.ttl = '1h';
SET LOCAL plpgsql_idem.ttl = '1h';
SELECT expires_at = now() + interval '1h' AS ttl_setting FROM :"api".idem_claim('k3', :'hx');
ROLLBACK;

-- 4xx is stored; 5xx releases the key, which can then be claimed again; release; commit without complete.
BEGIN;
SELECT outcome FROM :"api".idem_claim('k4', :'hx');
SELECT :"api".idem_complete('k4', 402, '{"error": "funds"}');
SELECT outcome FROM :"api".idem_claim('k5', :'hx');
SELECT :"api".idem_complete('k5', 503);
SAVEPOINT s;
SELECT :"api".idem_complete('k5', 200);
ROLLBACK TO SAVEPOINT s;
SELECT outcome FROM :"api".idem_claim('k5', :'hx');
SELECT :"api".idem_release('k5');
SELECT outcome FROM :"api".idem_claim('k5', :'hx');
SELECT outcome FROM :"api".idem_claim('k6', :'hx');
COMMIT;
SELECT outcome, http_status, response_body FROM :"api".idem_claim('k4', :'hx');
SELECT outcome FROM :"api".idem_claim('k5', :'hx');
SELECT outcome FROM :"api".idem_claim('k6', :'hx');

-- Scopes are separate keys.
BEGIN;
SELECT outcome FROM :"api".idem_claim('shared', :'hx', NULL, 'a');
SELECT outcome FROM :"api".idem_claim('shared', :'hx', NULL, 'b');
SELECT :"api".idem_complete('shared', 200, '"a"', NULL, 'a');
COMMIT;
SELECT outcome, response_body FROM :"api".idem_claim('shared', :'hx', NULL, 'a');
SELECT outcome FROM :"api".idem_claim('shared', :'hx', NULL, 'b');

-- An expired key is absent and its row is replaced.
BEGIN;
SELECT outcome FROM :"api".idem_claim('old', :'hx');
SELECT :"api".idem_complete('old', 200, '"first"');
COMMIT;
UPDATE :"api".idempotency_keys SET expires_at = now() - interval '1 s' WHERE key = 'old';
BEGIN;
SELECT outcome FROM :"api".idem_claim('old', :'hy');
SELECT :"api".idem_complete('old', 200, '"second"');
COMMIT;
SELECT key, response_body, encode(request_hash, 'hex') = :'hy' AS new_hash FROM :"api".idempotency_keys WHERE key = 'old';

-- Savepoints undo claims, completions and releases.
BEGIN;
SAVEPOINT a;
SELECT outcome FROM :"api".idem_claim('sp', :'hx');
ROLLBACK TO SAVEPOINT a;
SELECT outcome FROM :"api".idem_claim('sp', :'hx');
SAVEPOINT b;
SELECT :"api".idem_complete('sp', 200, '"rolled back"');
ROLLBACK TO SAVEPOINT b;
SELECT outcome FROM :"api".idem_claim('sp', :'hx');
SAVEPOINT c;
SELECT :"api".idem_release('sp');
ROLLBACK TO SAVEPOINT c;
SELECT :"api".idem_complete('sp', 200, '"kept"');
COMMIT;
SELECT outcome, response_body FROM :"api".idem_claim('sp', :'hx');

-- Errors: only the SQLSTATE is printed.
SELECT * FROM :"api".idem_claim(NULL, :'hx');
SELECT * FROM :"api".idem_claim('k', NULL);
SELECT * FROM :"api".idem_claim('k', :'hx', NULL, NULL);
SELECT * FROM :"api".idem_claim('', :'hx');
SELECT * FROM :"api".idem_claim(repeat('k', 256), :'hx');
SELECT outcome FROM :"api".idem_claim(repeat('k', 255), :'hx');
SELECT * FROM :"api".idem_claim(E'a\nb', :'hx');
SELECT * FROM :"api".idem_claim(E'a\u0085b', :'hx');
SELECT * FROM :"api".idem_claim('k', 'abc');
SELECT * FROM :"api".idem_claim('k', :'hx' || '0');
SELECT * FROM :"api".idem_claim('k', :'hx', '0 s');
SELECT * FROM :"api".idem_claim('k', :'hx', '-1 h');
SELECT :"api".idem_complete('nope', 200);
SELECT :"api".idem_complete('nope', 503);
SELECT :"api".idem_release('nope');
BEGIN;
SELECT outcome FROM :"api".idem_claim('bad', :'hx');
SAVEPOINT s;
SELECT :"api".idem_complete('bad', NULL);
ROLLBACK TO SAVEPOINT s;
SELECT :"api".idem_complete('bad', 99);
ROLLBACK TO SAVEPOINT s;
SELECT :"api".idem_complete('bad', 600);
ROLLBACK TO SAVEPOINT s;
SELECT :"api".idem_complete('bad', 200, NULL, '[1]');
ROLLBACK TO SAVEPOINT s;
SELECT :"api".idem_complete('bad', 200, to_jsonb(repeat('x', 1100000)));
ROLLBACK;
BEGIN READ ONLY;
SELECT * FROM :"api".idem_claim('ro', :'hx');
ROLLBACK;

-- A second session through dblink: in_progress while it holds the key, replay once it committed,
-- claimed again after its rollback.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS dblink;
RESET client_min_messages;
SELECT dblink_connect('peer', :'conninfo') AS peer;
SELECT dblink_exec('peer', 'BEGIN');
SELECT * FROM dblink('peer', format('SELECT outcome FROM %I.idem_claim(%L, %L)', :'api', 'c1', :'hx')) AS t(peer text);
SELECT outcome, http_status FROM :"api".idem_claim('c1', :'hx');
SELECT * FROM dblink('peer', format('SELECT %I.idem_complete(%L, 201, %L)', :'api', 'c1', '"peer"')) AS t(peer bool);
SELECT outcome, http_status FROM :"api".idem_claim('c1', :'hx');
SELECT dblink_exec('peer', 'COMMIT');
SELECT outcome, http_status, response_body FROM :"api".idem_claim('c1', :'hx');
SELECT dblink_exec('peer', 'BEGIN');
SELECT * FROM dblink('peer', format('SELECT outcome FROM %I.idem_claim(%L, %L)', :'api', 'c2', :'hx')) AS t(peer text);
SELECT dblink_exec('peer', 'ROLLBACK');
BEGIN;
SELECT outcome FROM :"api".idem_claim('c2', :'hx');
ROLLBACK;
-- READ COMMITTED: a completion committed after the transaction began is replayed.
BEGIN;
SELECT 1 AS snapshot_taken;
SELECT * FROM dblink('peer', format('SELECT outcome FROM %I.idem_claim(%L, %L), %I.idem_complete(%L, 200)',
                                    :'api', 'c3', :'hx', :'api', 'c3')) AS t(peer text);
SELECT outcome FROM :"api".idem_claim('c3', :'hx');
COMMIT;
-- REPEATABLE READ: the same is a serialization failure, for a new key and for a replaced expired one.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 1 AS snapshot_taken;
SELECT * FROM dblink('peer', format('SELECT outcome FROM %I.idem_claim(%L, %L), %I.idem_complete(%L, 200)',
                                    :'api', 'c4', :'hx', :'api', 'c4')) AS t(peer text);
SELECT outcome FROM :"api".idem_claim('c4', :'hx');
ROLLBACK;
UPDATE :"api".idempotency_keys SET expires_at = now() - interval '1 s' WHERE key = 'c4';
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 1 AS snapshot_taken;
SELECT * FROM dblink('peer', format('SELECT outcome FROM %I.idem_claim(%L, %L), %I.idem_complete(%L, 200)',
                                    :'api', 'c4', :'hy', :'api', 'c4')) AS t(peer text);
SELECT outcome FROM :"api".idem_claim('c4', :'hy');
ROLLBACK;
-- REPEATABLE READ: an expired row deleted after the snapshot (a cleanup) is a serialization failure too.
UPDATE :"api".idempotency_keys SET expires_at = now() - interval '1 s' WHERE key = 'c4';
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 1 AS snapshot_taken;
SELECT dblink_exec('peer', format('DELETE FROM %I.idempotency_keys WHERE key = %L', :'api', 'c4'));
SELECT outcome FROM :"api".idem_claim('c4', :'hx');
ROLLBACK;
-- A live row answers even while another transaction holds the key's lock.
SELECT dblink_exec('peer', 'BEGIN');
SELECT * FROM dblink('peer', format('SELECT outcome FROM %I.idem_claim(%L, %L)', :'api', 'c1', :'hx')) AS t(peer text);
SELECT outcome FROM :"api".idem_claim('c1', :'hx');
SELECT dblink_exec('peer', 'ROLLBACK');
-- REPEATABLE READ without a concurrent completion claims normally, and leaves no row behind.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT outcome FROM :"api".idem_claim('c5', :'hx');
COMMIT;
SELECT dblink_disconnect('peer');

SELECT scope, key, http_status, response_body, response_headers FROM :"api".idempotency_keys ORDER BY scope, key;

-- idem_hash: the same hex for text, bytea and jsonb (key order and spacing do not matter).
SELECT :"api".idem_hash('abc'::text) AS text_hash, :"api".idem_hash('\x00ff'::bytea) AS bytea_hash,
       :"api".idem_hash('{"b": 1,  "a": [1, 2]}'::jsonb) = :"api".idem_hash('{"a":[1,2],"b":1}'::jsonb) AS jsonb_canonical,
       :"api".idem_hash('{"a":[1,2],"b":1}'::jsonb) AS jsonb_hash;
TRUNCATE :"api".idempotency_keys;
