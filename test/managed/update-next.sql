-- Test only: scripts/test-managed.sh (managed-update) adds this to a test-only next version of the managed edition
-- (IDEM_MANAGED_TEST_SQL of managed/generate.py), so that the update through pg_tle shows it ran: after
-- ALTER EXTENSION idempotency UPDATE the function exists and answers.
CREATE FUNCTION @extschema@.idem_managed_test_next()
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN 'next';
