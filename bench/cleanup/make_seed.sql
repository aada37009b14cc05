-- Builds the seed once: :expired expired and :live live keys as idem_complete would write them,
-- with expiry as an offset from load time. Random UUID keys, mixed expired/live, stored in key
-- order so that reloading builds the primary key by appending (fast) and a heap page holds
-- expired and live keys alike, as after long churn. psql variables: expired, live.
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS cleanup_bench CASCADE;
CREATE SCHEMA cleanup_bench;
CREATE TABLE cleanup_bench.seed AS
SELECT CASE WHEN g <= :expired
            THEN -interval '1 hour' - (g % 3600) * interval '1 second'
            ELSE interval '1 hour' + (g % 3600) * interval '1 second' END AS expires_in,
       gen_random_uuid()::text COLLATE "C" AS key,
       sha256(int8send(g)) AS request_hash,
       jsonb_build_object('id', 'pay_' || g, 'object', 'payment', 'amount', g % 100000,
                          'currency', 'eur', 'status', 'succeeded') AS response_body
FROM generate_series(1, :expired + :live) g
ORDER BY 2;
