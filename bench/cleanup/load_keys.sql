-- Fresh table-mode state for one measurement: the seed copied into idempotency_keys
-- (expiry relative to now), vacuumed and analyzed, then a checkpoint so that every
-- variant pays the same full-page images.
TRUNCATE public.idempotency_keys;
INSERT INTO public.idempotency_keys
    (expires_at, created_at, http_status, scope, key, request_hash, response_headers, response_body)
SELECT now() + expires_in, now() + expires_in - interval '24 hours', 201, '', key, request_hash,
       '{"content-type": "application/json"}', response_body
FROM cleanup_bench.seed;
VACUUM ANALYZE public.idempotency_keys;
CHECKPOINT;
