-- The floor's key table: idempotency_keys' columns, collations, NOT NULLs and primary key (key, scope),
-- so the floor writes the same row and index entry the extension does. Run after bench/setup.sql.
CREATE TABLE bench.lease_floor (LIKE public.idempotency_keys INCLUDING ALL);

-- n completed rows, keys prefix||first .. prefix||(first+n-1), as bench.load_keys makes for the extension.
CREATE PROCEDURE bench.load_floor_keys(prefix text, first bigint, n integer, request_hash text, body jsonb)
LANGUAGE sql AS $$
    INSERT INTO bench.lease_floor (expires_at, created_at, http_status, scope, key, request_hash, response_body)
    SELECT now() + '24 h', now(), 201, '', prefix || (first + i), decode(request_hash, 'hex'), body
    FROM generate_series(0, n - 1) i;
$$;
