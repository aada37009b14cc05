-- Benchmark objects: the business table, the one-call request functions of workload "proc",
-- a key loader and the hash timer. Run after CREATE EXTENSION idempotency and plpgsql_baseline.sql.
CREATE SCHEMA bench;

-- What a request does besides idempotency: one insert.
CREATE TABLE bench.ledger (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id   integer NOT NULL,
    amount_cents bigint NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Workload "proc": the whole request in one call, as a stored procedure user would write it.
CREATE FUNCTION bench.request_bare(account integer, amount bigint) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench.ledger (account_id, amount_cents) VALUES (account, amount);
    RETURN 201;
END $$;

-- Two trivial statements with the same arguments where claim and complete would be.
CREATE FUNCTION bench.request_floor(key text, request_hash text, account integer, amount bigint, body jsonb)
RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM key, request_hash;
    INSERT INTO bench.ledger (account_id, amount_cents) VALUES (account, amount);
    PERFORM key, 201, body;
    RETURN 201;
END $$;

CREATE FUNCTION bench.request_extension(key text, request_hash text, account integer, amount bigint, body jsonb)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    claim record;
BEGIN
    SELECT * INTO claim FROM public.idem_claim(key, request_hash);
    IF claim.outcome <> 'claimed' THEN
        RETURN claim.http_status;
    END IF;
    INSERT INTO bench.ledger (account_id, amount_cents) VALUES (account, amount);
    PERFORM public.idem_complete(key, 201, body);
    RETURN 201;
END $$;

CREATE FUNCTION bench.request_plpgsql(key text, request_hash text, account integer, amount bigint, body jsonb)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    claim record;
BEGIN
    SELECT * INTO claim FROM plpgsql_idem.idem_claim(key, request_hash);
    IF claim.outcome <> 'claimed' THEN
        RETURN claim.http_status;
    END IF;
    INSERT INTO bench.ledger (account_id, amount_cents) VALUES (account, amount);
    PERFORM plpgsql_idem.idem_complete(key, 201, body);
    RETURN 201;
END $$;

-- Completes n keys through the API named by api (extension or plpgsql): prefix||first .. prefix||(first+n-1),
-- or random UUIDs as real clients send. Commits every 1000 keys: each open claim holds a lock-table entry.
CREATE PROCEDURE bench.load_keys(api text, prefix text, first bigint, n integer, request_hash text, body jsonb,
                                 random_keys boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    k text;
BEGIN
    FOR i IN 0 .. n - 1 LOOP
        k := CASE WHEN random_keys THEN gen_random_uuid()::text ELSE prefix || (first + i) END;
        IF api = 'extension' THEN
            PERFORM public.idem_claim(k, request_hash);
            PERFORM public.idem_complete(k, 201, body);
        ELSE
            PERFORM plpgsql_idem.idem_claim(k, request_hash);
            PERFORM plpgsql_idem.idem_complete(k, 201, body);
        END IF;
        IF i % 1000 = 999 THEN
            COMMIT;
        END IF;
    END LOOP;
END $$;

-- Random bytes for the hash payloads.
CREATE FUNCTION bench.random_bytes(n integer) RETURNS bytea
LANGUAGE sql VOLATILE
RETURN (SELECT substr(decode(string_agg(md5(random()::text), ''), 'hex'), 1, n)
        FROM generate_series(1, (n + 15) / 16));

-- MB/s (10^6 bytes) of hash function fn over one in-memory payload of payload_bytes, hashed again and again
-- until total_bytes: measures the hash and its call, not reading or detoasting payloads.
CREATE FUNCTION bench.hash_mb_per_s(fn text, payload_bytes integer, total_bytes bigint) RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    payload bytea := bench.random_bytes(payload_bytes);
    n bigint := greatest(1, total_bytes / payload_bytes);
    hex text;
    digest bytea;
    t0 timestamptz := clock_timestamp();
BEGIN
    CASE fn
        WHEN 'idem_hash' THEN
            FOR i IN 1 .. n LOOP hex := public.idem_hash(payload); END LOOP;
        WHEN 'sha256' THEN
            FOR i IN 1 .. n LOOP digest := pg_catalog.sha256(payload); END LOOP;
        WHEN 'plpgsql_idem_hash' THEN
            FOR i IN 1 .. n LOOP hex := plpgsql_idem.idem_hash(payload); END LOOP;
    END CASE;
    RETURN n * payload_bytes / 1e6 / extract(epoch FROM clock_timestamp() - t0);
END $$;
