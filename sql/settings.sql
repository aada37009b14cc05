-- The settings, their defaults and units.
SHOW idempotency.ttl;
SHOW idempotency.mismatch_status;
SHOW idempotency.max_response_bytes;
SELECT name, boot_val, unit, context, vartype, min_val, max_val
FROM pg_settings WHERE name LIKE 'idempotency.%' AND name <> 'idempotency.cleanup_wal_compression' ORDER BY name;
-- The sweeper's compression: lz4 by default where the server was built with it, pglz otherwise.
SELECT context, vartype,
       boot_val = CASE WHEN 'lz4' = ANY (enumvals) THEN 'lz4' ELSE 'pglz' END AS default_is_lz4_or_pglz,
       enumvals @> '{off,pglz}' AS offers_off_and_pglz
FROM pg_settings WHERE name = 'idempotency.cleanup_wal_compression';
SET idempotency.ttl = '90min';
SHOW idempotency.ttl;
RESET idempotency.ttl;

-- idempotency.tombstone_ttl (1.4, issue 41): seconds, units accepted, 0 by default, at most 3650 days.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
SHOW idempotency.tombstone_ttl;
SET idempotency.tombstone_ttl = '30d';
SHOW idempotency.tombstone_ttl;
-- The range's own spelling differs by version (PostgreSQL 15: "(0 .. 315360000)", 17 and 18: "(0 s .. 315360000 s)").
SELECT split_part(sqlstate_of($$SET idempotency.tombstone_ttl = '3651d'$$), ' (', 1) AS too_long;
SELECT split_part(sqlstate_of($$SET idempotency.tombstone_ttl = -1$$), ' (', 1) AS negative;
RESET idempotency.tombstone_ttl;
DROP FUNCTION sqlstate_of(text);
