-- 1.4, rule key-lifetime: the answers' headers carry the key's expiry, Idempotency-Key-Expires, a date that
-- moves with the clock; tests of other things show it as <expires> (sql/key_lifetime.sql checks the value).
CREATE FUNCTION pg_temp.undated(h jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE SET search_path = pg_catalog AS $$
    SELECT CASE WHEN h OPERATOR(pg_catalog.?) 'Idempotency-Key-Expires'
                THEN h OPERATOR(pg_catalog.||) '{"Idempotency-Key-Expires": "<expires>"}'::jsonb ELSE h END
$$;
