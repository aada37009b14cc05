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
