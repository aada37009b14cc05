-- The settings, their defaults and units. The library defines them; without it (the managed edition) they are
-- placeholders (managed/DIFFERENCES.md, "Settings are placeholders"): this file runs on the C edition only.
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

-- Settings reject values out of range at SET (moved here from bad_input.sql and limits.sql, issue 40).
SELECT sqlstate_of($$SET idempotency.mismatch_status = 500$$);
-- 16 and later print the unit in the range, "(1 s .. 2147483647 s)": shown in that form for every version.
SELECT regexp_replace(sqlstate_of($$SET idempotency.ttl = 0$$), '\(1 \.\. ([0-9]+)\)$', '(1 s .. \1 s)')
    AS sqlstate_of;
-- idempotency.ttl's maximum is the claims' (3650 days: limits.sql).
-- 16 and later print the unit in the range: shown in that form for every version.
SELECT regexp_replace(sqlstate_of($$SET idempotency.ttl = '3651d'$$), '\(1 \.\. ([0-9]+)\)$', '(1 s .. \1 s)')
    AS sqlstate_of;
DROP FUNCTION sqlstate_of(text);
