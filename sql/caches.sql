-- What a backend remembers between calls (issue 30: nothing looked up again per call that a backend or
-- transaction cache can hold), and that it forgets what changed, all in one session: each step first fills the
-- caches, then changes what they hold, then calls again. A stale entry shows as a wrong answer or an ERROR here.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
\i :abs_srcdir/sql/include/undated.sql
\i :abs_srcdir/sql/include/caches_functions.sql
SELECT request('first'), leased('lease-first');

-- A schema for a decoy table.
CREATE SCHEMA idem_elsewhere;

-- search_path plays no part: a decoy idempotency_keys first on the path is never read or written.
CREATE TABLE idem_elsewhere.idempotency_keys (LIKE public.idempotency_keys INCLUDING ALL);
SET search_path = idem_elsewhere, public;
SELECT public.request('decoy');
RESET search_path;
SELECT (SELECT count(*) FROM idem_elsewhere.idempotency_keys) AS decoy_rows,
       (SELECT count(*) FROM public.idempotency_keys WHERE key = 'decoy') AS real_rows;
DROP TABLE idem_elsewhere.idempotency_keys;

-- The primary key made again with its columns the other way round, and a second unique index: the remembered
-- index, its column order and whether it is the only one are forgotten (the new index must refuse a duplicate).
BEGIN;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (scope, key);
SELECT request('scope first');
SELECT request('dup');
CREATE UNIQUE INDEX idempotency_keys_key_alone ON idempotency_keys (key);
SELECT sqlstate_of($$SELECT idem_claim_request('dup', 'other', 'POST', '/p', NULL, NULL, NULL),
                            idem_complete_request('dup', 'other', 201, NULL, NULL, 'x')$$);
ROLLBACK;
SELECT request('after the index changes');

-- A transaction with many claims (past the 64 the claims table keeps), rolled back: the next transaction
-- starts with none of them, and a completion without its claim is refused.
BEGIN;
SELECT count(*) FROM generate_series(1, 100) AS i,
     LATERAL (SELECT idem_claim_request('many-' || i, '', 'POST', '/p', NULL, NULL, NULL) AS c) s
WHERE (c).outcome = 'claimed';
ROLLBACK;
SELECT sqlstate_of($$SELECT idem_claim_request('many-x', '', 'POST', '/p', NULL, NULL, NULL),
                            idem_complete_request('many-1', '', 201, NULL, NULL, 'x')$$);
SELECT count(*) AS in_flight FROM idem_keys_in_flight();
SELECT request('many-2');
-- The same with one claim, committed: the table is emptied, not remade.
BEGIN;
SELECT (idem_claim_request('few-1', '', 'POST', '/p', NULL, NULL, NULL)).outcome;
COMMIT;
SELECT sqlstate_of($$SELECT idem_claim_request('few-x', '', 'POST', '/p', NULL, NULL, NULL),
                            idem_complete_request('few-1', '', 201, NULL, NULL, 'x')$$);

-- Row level security turned on after this backend took the direct path: the next call sees it (a policy hides
-- scope 'hidden' from the application's role, so its stored key is absent to that role: claimed, not replay).
CREATE ROLE idem_caches_app;
GRANT SELECT, INSERT, UPDATE ON idempotency_keys TO idem_caches_app;
SET ROLE idem_caches_app;
BEGIN;
SELECT (idem_claim_request('rls', 'hidden', 'POST', '/p', NULL, NULL, NULL)).outcome;
SELECT idem_complete_request('rls', 'hidden', 201, NULL, NULL, 'x');
COMMIT;
SELECT (idem_claim_request('rls', 'hidden', 'POST', '/p', NULL, NULL, NULL)).outcome AS before_rls;
RESET ROLE;
ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY idem_caches_visible ON idempotency_keys USING (scope <> 'hidden');
SET ROLE idem_caches_app;
BEGIN;
SELECT (idem_claim_request('rls', 'hidden', 'POST', '/p', NULL, NULL, NULL)).outcome AS with_rls;
ROLLBACK;
RESET ROLE;
DROP POLICY idem_caches_visible ON idempotency_keys;
ALTER TABLE idempotency_keys DISABLE ROW LEVEL SECURITY;
REVOKE ALL ON idempotency_keys FROM idem_caches_app;
DROP ROLE idem_caches_app;

DROP SCHEMA idem_elsewhere;
DROP FUNCTION request(text, text);
DROP FUNCTION leased(text, text);
DROP FUNCTION sqlstate_of(text);
