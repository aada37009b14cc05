-- The settings, their defaults and units.
SHOW idempotency.ttl;
SHOW idempotency.mismatch_status;
SHOW idempotency.max_response_bytes;
SELECT name, boot_val, unit, context, vartype, min_val, max_val
FROM pg_settings WHERE name LIKE 'idempotency.%' ORDER BY name;
SET idempotency.ttl = '90min';
SHOW idempotency.ttl;
RESET idempotency.ttl;
