-- The fast path (index probe and heap insert without SQL) must store and find exactly what the SQL statements
-- would, whatever a user has done to the table; where it cannot, the statements run instead.
-- Each case alters the table inside a transaction and rolls back.
CREATE EXTENSION amcheck;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
-- claim + complete of a new key, then a replay of it, in one answer.
CREATE FUNCTION store_and_replay(k text, s text DEFAULT '') RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    first text;
    second record;
BEGIN
    SELECT outcome INTO first FROM idem_claim(k, idem_hash(k), scope => s);
    PERFORM idem_complete(k, 201, jsonb_build_object('key', k), scope => s);
    SELECT * INTO second FROM idem_claim(k, idem_hash(k), scope => s);
    RETURN first || ' then ' || second.outcome || ' ' || second.http_status || ' ' || second.response_body::text;
END $$;
TRUNCATE idempotency_keys;
SELECT store_and_replay('plain');
-- Every heap row of the table is in its primary key (amcheck's heapallindexed).
SELECT bt_index_check('idempotency_keys_pkey', true);

-- The primary key in the other column order: scan keys follow the index's columns.
BEGIN;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (scope, key);
SELECT store_and_replay('scope-first', 'tenant-a');
SELECT outcome FROM idem_claim('plain', idem_hash('plain'));
SELECT outcome FROM idem_claim('scope-first', idem_hash('scope-first'));  -- another scope: absent
SELECT bt_index_check('idempotency_keys_pkey', true);
ROLLBACK;

-- A second index: the executor maintains both.
BEGIN;
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at, http_status);
SELECT store_and_replay('two-indexes');
SELECT bt_index_check('idempotency_keys_pkey', true), bt_index_check('idempotency_keys_created', true);
ROLLBACK;

-- A column added with a default: the INSERT statement fills it.
BEGIN;
ALTER TABLE idempotency_keys ADD COLUMN region text NOT NULL DEFAULT 'eu';
SELECT store_and_replay('with-default');
SELECT key, region FROM idempotency_keys WHERE key = 'with-default';
ROLLBACK;

-- NOT NULL on a column the request leaves NULL: 23502 as from the INSERT, nothing stored.
BEGIN;
DELETE FROM idempotency_keys;
ALTER TABLE idempotency_keys ALTER COLUMN response_headers SET NOT NULL;
SELECT outcome FROM idem_claim('not-null', idem_hash('not-null'));
SELECT sqlstate_of($$SELECT idem_complete('not-null', 200, '{}')$$);
SELECT count(*) FROM idempotency_keys WHERE key = 'not-null';
ROLLBACK;

-- A row written under the key by someone else meanwhile: the unique check of the primary key stops the insert.
BEGIN;
SELECT outcome FROM idem_claim('raced', idem_hash('raced'));
INSERT INTO idempotency_keys (expires_at, created_at, scope, key, request_hash)
VALUES (now() + interval '1 hour', now(), '', 'raced', sha256('x'));
SELECT sqlstate_of($$SELECT idem_complete('raced', 200, '{}')$$);
ROLLBACK;

-- Privileges granted on the columns, not on the table: the fast path accepts them as the statements do (the
-- executor checks each column a statement names when the table's privilege is missing).
CREATE ROLE column_app;
GRANT SELECT (expires_at, created_at, http_status, scope, key, request_hash, response_headers, response_body,
              lease_until, lease_token, recovery_point, recovery_state, response_content_type, response_bytes),
      INSERT (expires_at, created_at, http_status, scope, key, request_hash, response_headers, response_body,
              response_content_type, response_bytes)
      ON idempotency_keys TO column_app;
SET ROLE column_app;
SELECT store_and_replay('column-grants');
RESET ROLE;
-- Without SELECT on one column the lookup reads, or INSERT on one it writes (1.3's response_bytes): 42501, as
-- from the statements.
REVOKE SELECT (recovery_state) ON idempotency_keys FROM column_app;
SET ROLE column_app;
SELECT sqlstate_of($$SELECT idem_claim('column-grants', idem_hash('column-grants'))$$);
RESET ROLE;
GRANT SELECT (recovery_state) ON idempotency_keys TO column_app;
REVOKE INSERT (response_bytes) ON idempotency_keys FROM column_app;
SET ROLE column_app;
SELECT sqlstate_of($$SELECT idem_claim('column-insert', idem_hash('column-insert')),
                            idem_complete('column-insert', 201, '{}')$$);
RESET ROLE;
SELECT count(*) FROM idempotency_keys WHERE key LIKE 'column-%';
REVOKE ALL ON idempotency_keys FROM column_app;
DROP ROLE column_app;
DELETE FROM idempotency_keys WHERE key = 'column-grants';

-- After all that the plain table works as before and its caches follow it.
SELECT store_and_replay('after');
SELECT key, scope, http_status FROM idempotency_keys ORDER BY key, scope;
SELECT bt_index_check('idempotency_keys_pkey', true);
DROP FUNCTION store_and_replay(text, text);
DROP FUNCTION sqlstate_of(text);
DROP EXTENSION amcheck;
TRUNCATE idempotency_keys;
