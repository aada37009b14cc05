-- A backend's memory stays bounded over any mix of calls (issue 38): the result row type of idem_claim and of
-- idem_claim_wait is kept per function, and alternating them reuses both. Before, every switch between the two
-- copied a row type into TopMemoryContext for good (about 2 kB per switch; 20,000 switches: 143 kB -> 42 MB).
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
\set VERBOSITY terse

-- Bytes in use in TopMemoryContext (not its total: PostgreSQL keeps there, freed but not given back, the lock
-- bookkeeping of the largest transaction so far). There is one context of that name; its level is 0 before
-- PostgreSQL 18 and 1 from 18 on, so it is found by name alone.
CREATE FUNCTION pg_temp.top_bytes() RETURNS bigint LANGUAGE sql AS $$
    SELECT used_bytes FROM pg_catalog.pg_backend_memory_contexts WHERE name = 'TopMemoryContext'
$$;
CREATE FUNCTION pg_temp.alternate(n integer) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. n LOOP
        PERFORM * FROM idem_claim('mem-' || i, pg_catalog.repeat('a', 64));
        PERFORM * FROM idem_claim_wait('mem-' || i, pg_catalog.repeat('a', 64), '0'::interval);
    END LOOP;
END $$;

-- Once to fill what a backend keeps anyway (plans, caches); then 5,000 switches each way.
BEGIN;
SELECT pg_temp.alternate(200);
ROLLBACK;
SELECT pg_temp.top_bytes() AS before_bytes \gset
BEGIN;
SELECT pg_temp.alternate(5000);
ROLLBACK;
SELECT pg_temp.top_bytes() - :before_bytes AS grown_bytes \gset
-- Fails before the fix (10.4 MB here).
SELECT :grown_bytes < 65536 AS top_memory_grew_less_than_64_kb;

TRUNCATE idempotency_keys;
DROP FUNCTION sqlstate_of(text);
