-- A row type changed by ALTER TYPE is read again, not answered with the one kept (split from claim_memory.sql,
-- issue 40). The managed edition's PL/pgSQL functions return the changed type, the added attribute NULL
-- (managed/DIFFERENCES.md, "A result row type changed by ALTER TYPE is returned as changed"): this file runs on
-- the C edition only (managed/SUPPORTED).
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
\set VERBOSITY terse

-- ALTER TYPE on a returned row type: the claim reads the type again and refuses a row it does not make.
BEGIN;
SELECT outcome FROM idem_claim_wait('type-1', pg_catalog.repeat('a', 64), '0'::interval);
ALTER TYPE idem_claim_result ADD ATTRIBUTE extra integer;
SELECT sqlstate_of($$SELECT * FROM idem_claim_wait('type-2', pg_catalog.repeat('a', 64), '0'::interval)$$);
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_claim_request('type-3', '', 'POST', '/p', NULL, NULL, NULL);
ALTER TYPE idem_request_claim ADD ATTRIBUTE extra integer;
SELECT sqlstate_of($$SELECT * FROM idem_claim_request('type-4', '', 'POST', '/p', NULL, NULL, NULL)$$);
ROLLBACK;
BEGIN;
ALTER TYPE idem_lease_result ADD ATTRIBUTE extra integer;
SELECT sqlstate_of($$SELECT * FROM idem_lease('type-7', pg_catalog.repeat('a', 64), '1 min')$$);
ROLLBACK;
-- Back as it was: the same calls answer.
SELECT outcome FROM idem_claim_wait('type-5', pg_catalog.repeat('a', 64), '0'::interval);
SELECT outcome FROM idem_claim_request('type-6', '', 'POST', '/p', NULL, NULL, NULL);
TRUNCATE idempotency_keys;
DROP FUNCTION sqlstate_of(text);
