-- Row level security covers lease rows: a tenant leases, checkpoints and completes only keys of its own
-- scope, never sees another tenant's lease or recovery point, and a token of another tenant's lease is
-- as good as stale. The lease writes run as the caller, through the statements, so the policy applies.
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
CREATE ROLE lease_app NOLOGIN;
GRANT SELECT, INSERT, UPDATE ON idempotency_keys TO lease_app;
ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant ON idempotency_keys USING (scope = current_setting('app.tenant'));
CREATE TEMP TABLE held (tenant text, token uuid);
GRANT ALL ON held TO lease_app;

SET ROLE lease_app;
SET app.tenant = 'alice';
INSERT INTO held SELECT 'alice', lease_token FROM idem_lease('k', idem_hash('a'), '1 min', scope => 'alice');
SELECT idem_checkpoint('k', (SELECT token FROM held WHERE tenant = 'alice'), 'charge_created',
                       '{"charge_id": "ch_alice"}', 'alice');
-- A lease in another tenant's scope breaks the policy: 42501, nothing written.
SELECT sqlstate_of($$SELECT idem_lease('k', idem_hash('a'), '1 min', scope => 'bob')$$);

SET app.tenant = 'bob';
-- Bob sees none of Alice's rows; the same key in his scope is his own.
SELECT count(*) AS rows_visible_to_bob FROM idempotency_keys;
INSERT INTO held SELECT 'bob', lease_token FROM idem_lease('k', idem_hash('b'), '1 min', scope => 'bob');
-- Alice's token in Alice's scope does nothing for Bob: the row is invisible to him, so it is stale (55000).
SELECT sqlstate_of($$SELECT idem_lease_complete('k', (SELECT token FROM held WHERE tenant = 'alice'), 201, '{"by": "bob"}', NULL, 'alice')$$);
SELECT idem_lease_complete('k', (SELECT token FROM held WHERE tenant = 'bob'), 201, '{"by": "bob"}', NULL, 'bob');

SET app.tenant = 'alice';
-- Alice's lease is untouched by Bob's attempts: still leased, her recovery point kept.
SELECT http_status, recovery_point, recovery_state FROM idempotency_keys;
SELECT idem_lease_complete('k', (SELECT token FROM held WHERE tenant = 'alice'), 201, '{"by": "alice"}', NULL, 'alice');
SELECT outcome, response_body FROM idem_lease('k', idem_hash('a'), '1 min', scope => 'alice');
RESET ROLE;
RESET app.tenant;

SELECT scope, http_status, response_body FROM idempotency_keys ORDER BY scope;
DROP POLICY tenant ON idempotency_keys;
ALTER TABLE idempotency_keys NO FORCE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys DISABLE ROW LEVEL SECURITY;
REVOKE ALL ON idempotency_keys FROM lease_app;
DROP TABLE held;
DROP ROLE lease_app;
DROP FUNCTION sqlstate_of(text);
TRUNCATE idempotency_keys;
