-- The two calls sql/caches.sql, caches_schema.sql and caches_update.sql make in each step: a transactional request
-- and a lease, each in one answer, through the functions of the schema named.
-- A transactional request through the 1.3 functions (claim, complete as bytes, replay), in one answer.
CREATE FUNCTION request(k text, schema_name text DEFAULT 'public') RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    first text;
    replay record;
BEGIN
    EXECUTE format('SELECT (%I.idem_claim_request($1, '''', ''POST'', ''/p'', NULL, NULL, NULL)).outcome', schema_name)
        INTO first USING k;
    EXECUTE format('SELECT %I.idem_complete_request($1, '''', 201, ''text/plain'', NULL, convert_to($1, ''UTF8''))',
                   schema_name) USING k;
    EXECUTE format('SELECT (%I.idem_claim_request($1, '''', ''POST'', ''/p'', NULL, NULL, NULL)).*', schema_name)
        INTO replay USING k;
    RETURN first || ' then ' || replay.outcome || ' ' || replay.http_status || ' ' ||
           coalesce(replay.content_type, '-') || ' ' || coalesce(convert_from(replay.body, 'UTF8'), '-');
END $$;
-- A lease taken and completed (the statements' path and the fencing number), in one answer. The number is
-- shown as the position of the schema's fencing sequence, which the grant advanced (the number itself is at
-- least the clock's microseconds since 2000, 1.4).
CREATE FUNCTION leased(k text, schema_name text DEFAULT 'public') RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    lease record;
    done boolean;
    drawn text;
BEGIN
    EXECUTE format('SELECT * FROM %I.idem_lease($1, %I.idem_hash($1), ''1 min'')', schema_name, schema_name)
        INTO lease USING k;
    IF lease.outcome <> 'claimed' THEN
        RETURN lease.outcome;
    END IF;
    EXECUTE format('SELECT %I.idem_lease_complete($1, $2, 201, ''{"ok": true}'')', schema_name)
        INTO done USING k, lease.lease_token;
    IF to_jsonb(lease)->>'fencing_number' IS NOT NULL THEN
        EXECUTE format('SELECT last_value::text FROM %I.idempotency_fencing_numbers', schema_name) INTO drawn;
    END IF;
    RETURN lease.outcome || ' fencing ' || coalesce(drawn, 'none') || ' completed ' || done;
END $$;
