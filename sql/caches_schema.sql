-- What a backend remembers between calls about where the key table is (split from caches.sql and fast_path.sql,
-- issue 40): the C edition looks for it, per call, in the schema of the calling function, by name, and forgets
-- what it remembered when the table or its schema is renamed or the extension made again. The managed edition
-- names its tables through the schema it was created in (managed/DIFFERENCES.md, "The key table is named
-- through the schema it was created in"), so this file runs on the C edition only (managed/SUPPORTED).
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
SELECT request('first'), leased('lease-first');

-- The schema of the calling function: a member function moved to another schema looks for the key table there,
-- and finds none (42P01), though this backend met the function before.
CREATE SCHEMA idem_elsewhere;
ALTER FUNCTION idem_claim_request(text, text, text, text, text, text, bytea, interval) SET SCHEMA idem_elsewhere;
SELECT sqlstate_of($$SELECT idem_elsewhere.idem_claim_request('moved', '', 'POST', '/p', NULL, NULL, NULL)$$);
ALTER FUNCTION idem_elsewhere.idem_claim_request(text, text, text, text, text, text, bytea, interval) SET SCHEMA public;
SELECT request('moved back');

-- The table's OID is remembered per backend, and forgotten when the table is renamed.
BEGIN;
ALTER TABLE idempotency_keys RENAME TO idempotency_keys_renamed;
SELECT sqlstate_of($$SELECT idem_claim('renamed', idem_hash('renamed'))$$);
ROLLBACK;

-- The extension's schema renamed: the statements (lease mode) name the new name.
DROP EXTENSION idempotency;
CREATE SCHEMA idem_s;
CREATE EXTENSION idempotency SCHEMA idem_s;
SELECT request('in s', 'idem_s'), leased('lease in s', 'idem_s');
ALTER SCHEMA idem_s RENAME TO idem_r;
SELECT request('renamed', 'idem_r'), leased('lease renamed', 'idem_r');

-- DROP and CREATE EXTENSION in the same session: new functions, table, index and sequence; the fencing numbers
-- start again from the new sequence.
DROP EXTENSION idempotency;
DROP SCHEMA idem_r;
CREATE EXTENSION idempotency;
SELECT request('made again'), leased('lease made again');

DROP SCHEMA idem_elsewhere;
DROP FUNCTION request(text, text);
DROP FUNCTION leased(text, text);
DROP FUNCTION sqlstate_of(text);
