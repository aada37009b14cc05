-- The hand-written baseline: batches of 10000 by ctid, one transaction per batch, until none
-- is left. Prints the keys removed; run with \timing to get the time.
DO $$
DECLARE
    n bigint;
    total bigint := 0;
BEGIN
    LOOP
        DELETE FROM public.idempotency_keys WHERE ctid IN (
            SELECT ctid FROM public.idempotency_keys WHERE expires_at <= now() LIMIT 10000);
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total + n;
        COMMIT;
        EXIT WHEN n = 0;
    END LOOP;
    PERFORM set_config('cleanup_bench.removed', total::text, false);
END
$$;
