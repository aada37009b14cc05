-- ALTER EXTENSION UPDATE in a session that has used the functions (split from caches.sql, issue 40). The managed
-- edition's first version is 1.4 (managed/DIFFERENCES.md, "No version before 1.4"): this file runs on the C
-- edition only (managed/SUPPORTED).
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
\i :abs_srcdir/sql/include/undated.sql
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

-- ALTER EXTENSION UPDATE in the same session: a 1.1 database has no fencing sequence and no bytes columns; after
-- the update to 1.3 the fencing numbers start and a response is stored and replayed as bytes.
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency VERSION '1.1';
SELECT leased('lease at 1.1');
SELECT to_jsonb(l) - 'expires_at' || jsonb_build_object('response_headers', pg_temp.undated(l.response_headers))
       AS replay_at_1_1 FROM idem_lease('lease at 1.1', idem_hash('lease at 1.1'), '1 min') AS l;
SELECT outcome, http_status FROM idem_claim('claim at 1.1', idem_hash('a'));
ALTER EXTENSION idempotency UPDATE TO '1.3';
SELECT to_jsonb(l) - 'expires_at' || jsonb_build_object('response_headers', pg_temp.undated(l.response_headers))
       AS replay_at_1_3 FROM idem_lease('lease at 1.1', idem_hash('lease at 1.1'), '1 min') AS l;
SELECT leased('lease at 1.3');
SELECT request('request at 1.3');
SELECT key, http_status, response_body, response_content_type, convert_from(response_bytes, 'UTF8') AS bytes
FROM idempotency_keys WHERE key IN ('lease at 1.3', 'request at 1.3') ORDER BY key;

-- As the other files expect it.
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
DROP FUNCTION request(text, text);
DROP FUNCTION leased(text, text);
DROP FUNCTION sqlstate_of(text);
