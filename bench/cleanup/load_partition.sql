-- Partitioned mode: one partition for the hour three hours ago, filled with :n keys that expired
-- in it (taken from the seed, in key order), then vacuumed, analyzed and checkpointed.
-- psql variable: n.
SELECT public.idem_create_partition(date_trunc('hour', now()) - interval '3 hours',
                                    date_trunc('hour', now()) - interval '2 hours') AS partition \gset
INSERT INTO public.idempotency_keys_partitioned
    (expires_at, created_at, http_status, scope, key, request_hash, response_headers, response_body)
SELECT e.expires_at, e.expires_at - interval '24 hours', 201, '', key, request_hash,
       '{"content-type": "application/json"}', response_body
FROM (SELECT * FROM cleanup_bench.seed LIMIT :n) s,
     LATERAL (SELECT date_trunc('hour', now()) - interval '3 hours'
                     + (abs(hashtext(s.key)) % 3600) * interval '1 second' AS expires_at) e;
VACUUM ANALYZE public.:"partition";
CHECKPOINT;
