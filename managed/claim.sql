-- The managed edition: the transactional claim (idem_claim, idem_claim_wait, idem_claim_request) and its end
-- (idem_complete, idem_complete_request, idem_release), in PL/pgSQL, with the C edition's outcomes, messages and
-- SQLSTATEs (src/claim.c, src/complete.c, src/core/outcome.cpp).
--
-- In flight without shared memory: a claim takes the transaction-level advisory lock
-- pg_try_advisory_xact_lock(hashtextextended(scope || E'\x1f' || key, 0x1DE7)) (\x1f is a control character,
-- which no valid key or scope holds, so the text names one (scope, key)); the lock is tried, never waited for
-- (idem_claim_wait waits at most its wait), so a second claim of a key held by an open transaction answers
-- in_progress at once and no other key or tenant is ever blocked. Collisions: two keys whose 64-bit hashes are
-- equal share a lock, and an advisory lock an application takes on the same number shares it too. A shared lock
-- only ever makes a claim of a free key answer in_progress (a retry later succeeds); it can never let a claim of
-- a held key answer claimed, since the holder of the key holds that very lock. The chance for two given keys is
-- 2^-64.
--
-- The claims this transaction holds (the C edition's per-transaction claim map) live in the transaction-local
-- setting idempotency_managed.claims (set_config(..., true)), which a ROLLBACK TO SAVEPOINT undoes as it undoes
-- the C edition's map, the row and the lock: a jsonb object {scope \x1f key: {"h": request hash in hex,
-- "e": expires_at, "x": an expired row of the key is to be replaced, "p": the storage mode is partitioned}}.
-- Completed and released claims are removed: both then act like no claim. A transaction-level advisory lock cannot be given back before the transaction
-- ends: a replay, a mismatch, idem_release and a 5xx keep the key's lock, as 1.0 to 1.3's PL/pgSQL baseline does
-- (bench/plpgsql_baseline.sql); other transactions' claims are answered by the stored row first, so only the
-- claim of a key released by a 5xx sees in_progress until the releasing transaction ends.
--
-- idem_claim, idem_claim_wait, idem_complete and idem_complete_request are written below as what they do: their checks,
-- then a call of their worker (idem_managed_claim, idem_managed_complete). managed/generate.py writes the worker's body
-- into each in place of the call (its INLINED): each call of a function with its fixed search_path costs about 17k
-- instructions (bench/RESULTS.md). So a worker's own names must not be those of its callers' arguments (no variable
-- hides another: plpgsql.extra_errors may say shadowed_variables).
--
-- A claim reads every column of the key's row, as the C edition does: a role needs SELECT on all of them.
-- The key table is the one the storage mode makes active: idempotency_keys_partitioned when it has range
-- partitions, idempotency_keys otherwise (read from the catalog on every claim and completion, as the C edition
-- reads it).

-- Key and scope checks of the C edition (src/sql_args.c); the claim-map name of the key: scope \x1f key.
CREATE FUNCTION @extschema@.idem_managed_key_id(key text, scope text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF key OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'idempotency key must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.octet_length(key) OPERATOR(pg_catalog.>) 255 THEN
        RAISE EXCEPTION 'idempotency key is longer than 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- C0 controls, DEL and the C1 controls U+0080..U+009F, in every server encoding.
    IF key OPERATOR(pg_catalog.~) E'[\\x01-\\x1f\\x7f-\\x9f]' THEN
        RAISE EXCEPTION 'idempotency key contains a control character' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255 THEN
        RAISE EXCEPTION 'idempotency scope is longer than 255 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF scope OPERATOR(pg_catalog.~) E'[\\x01-\\x1f\\x7f-\\x9f]' THEN
        RAISE EXCEPTION 'idempotency scope contains a control character' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN scope OPERATOR(pg_catalog.||) E'\x1f' OPERATOR(pg_catalog.||) key;
END
$$;

-- now() + ttl (the argument, else the setting idempotency.ttl, else 24 hours): ERROR 22023 unless within
-- (0, 3650 days], 22008 past the timestamp range. The setting is read as the C edition's unit: a number is
-- seconds, and interval input reads the units of PostgreSQL's settings ('90min', '1h', '2d') as they are.
-- 1.4: the ttl is a fixed duration, as extract(epoch) counts it (a day is 24 hours, a month 30 days, a year
-- 365.25 days), so the caller's TimeZone never moves the expiry (src/claim.c's claim_span_end).
CREATE FUNCTION @extschema@.idem_managed_expiry(ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    setting text;
    seconds float8;
    until timestamptz;
BEGIN
    IF ttl IS NULL THEN
        setting := pg_catalog.btrim(pg_catalog.current_setting('idempotency.ttl', true));
        IF setting IS NULL OR setting OPERATOR(pg_catalog.=) '' THEN
            ttl := interval '24 hours';
        ELSE
            ttl := setting::pg_catalog.interval;
        END IF;
    END IF;
    seconds := pg_catalog.date_part('epoch', ttl);
    IF seconds OPERATOR(pg_catalog.<=) 0 OR seconds OPERATOR(pg_catalog.>) 315360000 THEN
        -- 22008 past the timestamp range, as the C edition.
        until := pg_catalog.now() OPERATOR(pg_catalog.+) ttl;
        IF seconds OPERATOR(pg_catalog.<=) 0 THEN
            RAISE EXCEPTION 'idempotency ttl must be greater than zero' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RAISE EXCEPTION 'idempotency ttl must be at most 3650 days' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN pg_catalog.now() OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => seconds);
END
$$;

-- The claim itself, for idem_claim, idem_claim_wait, idem_claim_request and idem_lease: the outcome and the
-- stored row it was decided on (src/core/outcome.cpp's decide_claim, step by step). It checks its arguments in
-- the C edition's order after the callers' NULL checks: key and scope, the request hash (hex, unless given as
-- bytes), ttl, wait (NULL or zero: never wait), then a read-only transaction (command names the caller). Key,
-- scope and ttl are checked here rather than by the helpers above, for speed: each function call with its fixed
-- search_path costs about as much as a statement. transactional false: a lease's claim (lease.sql), which
-- records nothing in the claim map and computes no expiry; it gets the row's lease columns back (row_found,
-- row_expires_at, lease_until, recovery point and state) to decide how to write.
CREATE FUNCTION @extschema@.idem_managed_claim(
    key text, scope text, request_hash_hex text, hash_bytes bytea, ttl interval, wait interval,
    transactional boolean, command text,
    OUT outcome text, OUT http_status integer, OUT response_body jsonb, OUT response_headers jsonb,
    OUT expires_at timestamptz, OUT content_type text, OUT response_bytes bytea,
    OUT row_found boolean, OUT row_expires_at timestamptz, OUT lease_until timestamptz, OUT recovery_point text,
    OUT recovery_state jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id text := scope OPERATOR(pg_catalog.||) E'\x1f' OPERATOR(pg_catalog.||) key;
    claims jsonb := COALESCE(NULLIF(pg_catalog.current_setting('idempotency_managed.claims', true), ''),
                             '{}')::pg_catalog.jsonb;
    lock_id bigint;
    granted boolean;
    lock_waited_for boolean;  -- (no defaults here: each is an expression a transaction prepares; see below)
    partitioned boolean;
    found_row boolean;
    rows_read bigint;
    stored record;
    pause float8;
    expired_at timestamptz;
    saved_timeout text;
    until timestamptz;
    ttl_seconds float8;
    wait_until timestamptz;
BEGIN
    -- One test each on the way a valid request takes (PL/pgSQL prepares every expression once a transaction, so
    -- fewer expressions cost less); the helpers raise the C edition's error when one fails.
    IF key OPERATOR(pg_catalog.=) '' OR pg_catalog.octet_length(key) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255
       OR (key OPERATOR(pg_catalog.||) scope) OPERATOR(pg_catalog.~) E'[\\x01-\\x1f\\x7f-\\x9f]' THEN
        PERFORM @extschema@.idem_managed_key_id(key, scope);
    END IF;
    IF hash_bytes IS NULL THEN
        IF pg_catalog.octet_length(request_hash_hex) OPERATOR(pg_catalog.<>) 64
           OR request_hash_hex OPERATOR(pg_catalog.~) '[^0-9a-fA-F]' THEN
            PERFORM @extschema@.idem_managed_request_hash(request_hash_hex);
        END IF;
        hash_bytes := pg_catalog.decode(request_hash_hex, 'hex');
    END IF;
    IF transactional THEN
        -- now() + ttl as a fixed duration, as idem_managed_expiry computes it (and raises its errors).
        ttl_seconds := pg_catalog.date_part('epoch', COALESCE(ttl,
                     NULLIF(pg_catalog.current_setting('idempotency.ttl', true), '')::pg_catalog.interval,
                     interval '24 hours'));
        IF ttl_seconds OPERATOR(pg_catalog.<=) 0 OR ttl_seconds OPERATOR(pg_catalog.>) 315360000 THEN
            PERFORM @extschema@.idem_managed_expiry(ttl);
        END IF;
        until := pg_catalog.now() OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => ttl_seconds);
    END IF;
    IF wait IS NOT NULL AND wait OPERATOR(pg_catalog.<>) interval '0' THEN
        -- clock_timestamp() + wait as a fixed duration (lease.sql's idem_managed_wait_until, with its errors).
        wait_until := @extschema@.idem_managed_wait_until(wait);
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        RAISE EXCEPTION 'cannot execute %() in a read-only transaction', command
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    -- This transaction is already running the request: a second claim must not run it again.
    IF claims OPERATOR(pg_catalog.?) id THEN
        outcome := 'in_progress';
        http_status := 409;
        RETURN;
    END IF;
    lock_id := pg_catalog.hashtextextended(id COLLATE "C", 7655);
    LOOP
        -- Lock first, then read: under READ COMMITTED the read's new snapshot sees every completion committed
        -- before the lock was granted.
        -- (Once waited for, the lock is held until the transaction ends: granted stays true.)
        granted := lock_waited_for IS TRUE OR pg_catalog.pg_try_advisory_xact_lock(lock_id);
        SELECT k.expires_at, k.http_status, k.request_hash, k.response_body, k.response_headers, k.lease_until,
               k.response_content_type, k.response_bytes, k.created_at, k.lease_token, k.recovery_point,
               k.recovery_state
        INTO stored
        FROM @extschema@.idempotency_keys k
        WHERE k.scope OPERATOR(pg_catalog.=) idem_managed_claim.scope
          AND k.key OPERATOR(pg_catalog.=) idem_managed_claim.key;
        -- The storage mode, read (with whether the key's row was found) once the read above holds its lock on
        -- idempotency_keys, which idem_set_storage locks first: a claim that waited for a switch reads the
        -- mode it switched to, and from here on the lock holds the mode until this transaction ends. (Read
        -- before, it could be the mode left; read here, the table's claim runs no more statements. In partitioned
        -- storage the table is empty and its read finds nothing.)
        SELECT FOUND, EXISTS (SELECT FROM pg_catalog.pg_inherits i
                              WHERE i.inhparent OPERATOR(pg_catalog.=)
                                    '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass
                                AND NOT i.inhdetachpending
                                AND i.inhrelid OPERATOR(pg_catalog.<>)
                                    '@extschema@.idempotency_keys_partitioned_default'::pg_catalog.regclass)
        INTO found_row, partitioned;
        IF partitioned THEN
            -- No unique index spans the partitions, and PL/pgSQL reads with the transaction's snapshot: under
            -- REPEATABLE READ a completion committed after the snapshot would be missed and the request run
            -- twice (the C edition answers 40001). Refused instead (managed/DIFFERENCES.md).
            IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
                RAISE EXCEPTION 'idempotency: the managed edition claims in partitioned storage under READ COMMITTED only'
                    USING ERRCODE = 'feature_not_supported',
                          DETAIL = pg_catalog.format('This transaction is %s.',
                                                     pg_catalog.current_setting('transaction_isolation')),
                          HINT = 'Claim in a READ COMMITTED transaction, or use table storage (idem_set_storage).';
            END IF;
            -- The parent's and the default partition's locks first, in the order ATTACH and DETACH PARTITION
            -- take theirs (the parent, then the default partition), by a statement of their own: the probe below
            -- is planned with the partition list read when its plan locks the parent, so a claim whose probe
            -- waited for an ATTACH's lock on the default partition would probe the list from before the attach
            -- and answer claimed for a key stored in the attached table. Once this statement has its locks (and
            -- took in the invalidations of a change that committed while it waited), the probe reads the list as
            -- it is. '-infinity' is in no range partition: the plan prunes to the default partition, whose rows
            -- it never reads (LIMIT 0), and needs no privilege on a partition (only SELECT on the parent).
            PERFORM FROM @extschema@.idempotency_keys_partitioned k
            WHERE k.expires_at OPERATOR(pg_catalog.=) '-infinity'::pg_catalog.timestamptz LIMIT 0;
            -- Planned with the time as a constant, so the planner prunes the expired partitions: a claim never
            -- locks one, and never queues behind its drop (a cached generic plan would lock every partition).
            EXECUTE 'SELECT k.expires_at, k.http_status, k.request_hash, k.response_body, k.response_headers,'
                    ' k.lease_until, k.response_content_type, k.response_bytes, k.created_at, k.lease_token,'
                    ' k.recovery_point, k.recovery_state'
                    ' FROM @extschema@.idempotency_keys_partitioned k'
                    ' WHERE k.scope OPERATOR(pg_catalog.=) $1 AND k.key OPERATOR(pg_catalog.=) $2'
                    ' AND k.expires_at OPERATOR(pg_catalog.>) $3'
                    ' ORDER BY k.expires_at DESC LIMIT 1'
                INTO stored USING scope, key, pg_catalog.now();
            GET DIAGNOSTICS rows_read = ROW_COUNT;  -- EXECUTE leaves FOUND as it was
            found_row := rows_read OPERATOR(pg_catalog.>) 0;
        END IF;
        IF found_row AND stored.expires_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN
            IF stored.http_status IS NOT NULL OR stored.lease_until IS NULL THEN
                -- A live stored response answers, whoever holds the lock.
                outcome := CASE WHEN stored.request_hash OPERATOR(pg_catalog.=) hash_bytes THEN 'replay'
                                ELSE 'mismatch' END;
            ELSIF stored.request_hash OPERATOR(pg_catalog.<>) hash_bytes THEN
                -- A lease binds the key to its payload whether or not it has run out.
                outcome := 'mismatch';
            ELSIF stored.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() THEN
                outcome := 'in_progress';
            END IF;
            -- A lease that ran out is taken over like an absent key, below.
        END IF;
        IF outcome IS NULL THEN
            -- 1.4, tombstones (managed/tombstones.sql), only while idempotency.tombstone_ttl is above 0: a
            -- completed key whose response expired within it answers expired, whoever holds the lock. Its
            -- expired row still there tells when it expired (never a lease that ran out); with no row, its
            -- tombstone does.
            IF COALESCE(pg_catalog.current_setting('idempotency.tombstone_ttl', true), '')
                   OPERATOR(pg_catalog.<>) ALL (ARRAY['', '0']) THEN
                IF NOT found_row THEN
                    expired_at := @extschema@.idem_managed_tombstone(key, scope,
                                      @extschema@.idem_managed_tombstone_since(), partitioned);
                ELSIF stored.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                      AND NOT (stored.http_status IS NULL AND stored.lease_until IS NOT NULL)
                      AND stored.expires_at OPERATOR(pg_catalog.>) @extschema@.idem_managed_tombstone_since() THEN
                    expired_at := stored.expires_at;
                END IF;
            END IF;
            outcome := CASE WHEN expired_at IS NOT NULL THEN 'expired' WHEN granted THEN 'claimed'
                            ELSE 'in_progress' END;
        END IF;
        EXIT WHEN outcome OPERATOR(pg_catalog.<>) 'in_progress' OR wait_until IS NULL
                  OR pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) wait_until;
        -- A bounded wait: for the holding transaction's lock, which is granted the moment it ends; for a lease
        -- (no lock held), another look after a pause that doubles up to 50 ms.
        IF NOT granted THEN
            saved_timeout := pg_catalog.current_setting('lock_timeout');
            BEGIN
                PERFORM pg_catalog.set_config('lock_timeout',
                    GREATEST(1, pg_catalog.ceil(pg_catalog.date_part('epoch', wait_until OPERATOR(pg_catalog.-)
                        pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000))::pg_catalog.int8::pg_catalog.text,
                    true);
                PERFORM pg_catalog.pg_advisory_xact_lock(lock_id);
                lock_waited_for := true;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
            PERFORM pg_catalog.set_config('lock_timeout', saved_timeout, true);
        ELSE
            pause := COALESCE(pause, 0.002);
            PERFORM pg_catalog.pg_sleep(LEAST(pause, GREATEST(0.001, pg_catalog.date_part('epoch',
                wait_until OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp()))));
            pause := LEAST(pause OPERATOR(pg_catalog.*) 2, 0.05);
        END IF;
        -- Another look: what this one decided is forgotten (reset here, off the way of a claim that does not wait).
        outcome := NULL;
        expired_at := NULL;
    END LOOP;

    row_found := found_row;
    IF found_row THEN
        row_expires_at := stored.expires_at;
        lease_until := CASE WHEN stored.http_status IS NULL THEN stored.lease_until END;
        recovery_point := stored.recovery_point;
        recovery_state := stored.recovery_state;
    END IF;
    IF outcome OPERATOR(pg_catalog.=) 'claimed' OR (outcome OPERATOR(pg_catalog.=) 'expired' AND granted) THEN
        -- REPEATABLE READ and SERIALIZABLE: a completion (or the replacement or removal of an expired row)
        -- committed after the snapshot would be run twice. No statement can look with a newer snapshot, so
        -- the claim probes: FOR UPDATE on the row it saw, or an insert that is always rolled back; either
        -- fails with 40001 when the row changed after the snapshot. An expired key is probed too, as the C
        -- edition decides 40001 before expired (a sweep that removed the row after the snapshot).
        IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
            BEGIN
                IF found_row AND NOT partitioned THEN
                    PERFORM FROM @extschema@.idempotency_keys k
                    WHERE k.scope OPERATOR(pg_catalog.=) idem_managed_claim.scope
                      AND k.key OPERATOR(pg_catalog.=) idem_managed_claim.key
                    FOR UPDATE;
                ELSIF NOT partitioned THEN
                    BEGIN
                        INSERT INTO @extschema@.idempotency_keys (expires_at, created_at, scope, key, request_hash)
                        VALUES (pg_catalog.now(), pg_catalog.now(), scope, key, hash_bytes)
                        ON CONFLICT ON CONSTRAINT idempotency_keys_pkey DO NOTHING;
                        RAISE EXCEPTION USING ERRCODE = 'PIDEM';
                    EXCEPTION WHEN SQLSTATE 'PIDEM' THEN
                        NULL;
                    END;
                END IF;
            EXCEPTION WHEN serialization_failure THEN
                RAISE EXCEPTION 'could not serialize access: idempotency key was completed by a concurrent transaction'
                    USING ERRCODE = 'serialization_failure',
                          DETAIL = 'The transaction''s snapshot predates the key''s stored response.',
                          HINT = 'Retry the transaction.';
            END;
        END IF;
    END IF;
    IF outcome OPERATOR(pg_catalog.=) 'claimed' THEN
        IF NOT transactional THEN
            RETURN;
        END IF;
        PERFORM pg_catalog.set_config('idempotency_managed.claims',
            (claims OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object(id, pg_catalog.jsonb_build_object(
                'h', pg_catalog.encode(hash_bytes, 'hex'), 'e', until, 'x', found_row,
                'p', partitioned)))::pg_catalog.text,
            true);
        expires_at := until;
    ELSIF outcome OPERATOR(pg_catalog.=) 'replay' THEN
        http_status := stored.http_status;
        response_body := stored.response_body;
        response_headers := stored.response_headers;
        expires_at := stored.expires_at;
        content_type := stored.response_content_type;
        response_bytes := stored.response_bytes;
    ELSIF outcome OPERATOR(pg_catalog.=) 'mismatch' THEN
        http_status := COALESCE(NULLIF(pg_catalog.current_setting('idempotency.mismatch_status', true), ''),
                                '422')::pg_catalog.int4;
        expires_at := stored.expires_at;
    ELSIF outcome OPERATOR(pg_catalog.=) 'expired' THEN
        -- 410 Gone, and when the key's response expired.
        http_status := 410;
        expires_at := expired_at;
    ELSE
        http_status := 409;
    END IF;
END
$$;

CREATE FUNCTION @extschema@.idem_managed_request_hash(request_hash text)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.octet_length(request_hash) OPERATOR(pg_catalog.<>) 64 THEN
        RAISE EXCEPTION 'idempotency request_hash must be 64 hexadecimal digits'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF request_hash OPERATOR(pg_catalog.~) '[^0-9a-fA-F]' THEN
        RAISE EXCEPTION 'idempotency request_hash contains a character that is not a hexadecimal digit'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN pg_catalog.decode(request_hash, 'hex');
END
$$;

-- A response stored as bytes, as idem_claim returns its body: jsonb when its content type is JSON and the
-- bytes are JSON text, else none.
CREATE FUNCTION @extschema@.idem_managed_bytes_as_jsonb(content_type text, body bytea)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    media text := pg_catalog.lower(pg_catalog.btrim(pg_catalog.split_part(content_type, ';', 1), E' \t') COLLATE "C");
BEGIN
    IF body IS NULL OR content_type IS NULL OR pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8'
       OR NOT (media OPERATOR(pg_catalog.=) 'application/json' OR media OPERATOR(pg_catalog.~) '^[^/]+/.+[+]json$') THEN
        RETURN NULL;
    END IF;
    RETURN pg_catalog.convert_from(body, 'UTF8')::pg_catalog.jsonb;
EXCEPTION WHEN data_exception THEN
    RETURN NULL;
END
$$;

CREATE FUNCTION @extschema@.idem_claim(
    key text,
    request_hash text,
    ttl interval DEFAULT NULL,
    scope text DEFAULT '')
RETURNS @extschema@.idem_claim_result
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
BEGIN
    -- One test on the way of a valid call, the checks in order when it fails (see idem_managed_claim).
    IF key IS NULL OR request_hash IS NULL OR scope IS NULL THEN
        IF key IS NULL THEN
            RAISE EXCEPTION 'idempotency key must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        IF request_hash IS NULL THEN
            RAISE EXCEPTION 'idempotency request_hash must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        RAISE EXCEPTION 'idempotency scope must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    c := @extschema@.idem_managed_claim(key, scope, request_hash, NULL, ttl, NULL, true, 'idem_claim');
    -- The result in one expression (outcome, http_status, response_body, response_headers, expires_at).
    RETURN ROW(c.outcome, c.http_status,
               CASE WHEN c.response_body IS NULL AND c.response_bytes IS NOT NULL
                    THEN @extschema@.idem_managed_bytes_as_jsonb(c.content_type, c.response_bytes)
                    ELSE c.response_body END,
               c.response_headers, c.expires_at)::@extschema@.idem_claim_result;
END
$$;

CREATE FUNCTION @extschema@.idem_claim_wait(
    key text,
    request_hash text,
    wait interval,
    ttl interval DEFAULT NULL,
    scope text DEFAULT '')
RETURNS @extschema@.idem_claim_result
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
BEGIN
    -- One test on the way of a valid call, the checks in order when it fails (see idem_managed_claim).
    IF key IS NULL OR request_hash IS NULL OR scope IS NULL THEN
        IF key IS NULL THEN
            RAISE EXCEPTION 'idempotency key must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        IF request_hash IS NULL THEN
            RAISE EXCEPTION 'idempotency request_hash must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        RAISE EXCEPTION 'idempotency scope must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    c := @extschema@.idem_managed_claim(key, scope, request_hash, NULL, ttl, wait, true, 'idem_claim');
    -- The result in one expression (outcome, http_status, response_body, response_headers, expires_at).
    RETURN ROW(c.outcome, c.http_status,
               CASE WHEN c.response_body IS NULL AND c.response_bytes IS NOT NULL
                    THEN @extschema@.idem_managed_bytes_as_jsonb(c.content_type, c.response_bytes)
                    ELSE c.response_body END,
               c.response_headers, c.expires_at)::@extschema@.idem_claim_result;
END
$$;

CREATE FUNCTION @extschema@.idem_claim_request(
    key text,
    scope text,
    method text,
    path text,
    query text,
    content_type text,
    body bytea,
    ttl interval DEFAULT NULL)
RETURNS @extschema@.idem_request_claim
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
    result @extschema@.idem_request_claim;
    hash bytea;
BEGIN
    IF key IS NULL OR scope IS NULL THEN
        IF key IS NULL THEN
            RAISE EXCEPTION 'idempotency key must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        RAISE EXCEPTION 'idempotency scope must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- Key and scope before the fingerprint's own errors, as in the C edition (the claim checks them again); the
    -- helper (a call with its fixed search_path) only when idem_managed_claim's one test fails.
    IF key OPERATOR(pg_catalog.=) '' OR pg_catalog.octet_length(key) OPERATOR(pg_catalog.>) 255
       OR pg_catalog.octet_length(scope) OPERATOR(pg_catalog.>) 255
       OR (key OPERATOR(pg_catalog.||) scope) OPERATOR(pg_catalog.~) E'[\\x01-\\x1f\\x7f-\\x9f]' THEN
        PERFORM @extschema@.idem_managed_key_id(key, scope);
    END IF;
    hash := pg_catalog.decode(@extschema@.idem_fingerprint(method, path, query, content_type, body), 'hex');
    c := @extschema@.idem_managed_claim(key, scope, NULL, hash, ttl, NULL, true, 'idem_claim_request');
    result.outcome := c.outcome;
    result.http_status := c.http_status;
    IF c.outcome OPERATOR(pg_catalog.=) 'replay' THEN
        result.content_type := c.content_type;
        -- The stored headers without a member named Idempotency-Key-Expires in any case (the rule key-lifetime
        -- below adds it): a query, run for a replay only, so the claim's expressions below stay simple ones.
        result.headers := (SELECT pg_catalog.jsonb_object_agg(h.k, h.v)
                           FROM pg_catalog.jsonb_each(c.response_headers) AS h(k, v)
                           WHERE pg_catalog.lower(h.k) OPERATOR(pg_catalog.<>) 'idempotency-key-expires');
        -- A response stored as jsonb (1.0-1.2) comes back as the UTF-8 bytes of its text.
        result.body := COALESCE(c.response_bytes,
                                pg_catalog.convert_to(pg_catalog.jsonb_out(c.response_body)::pg_catalog.text, 'UTF8'));
    END IF;
    -- 1.4, rule key-lifetime: the headers this answer carries, with the key's expiry as an RFC 9110 IMF-fixdate in
    -- GMT (to_char of the UTC time with non-localized patterns: no DateStyle, TimeZone or lc_time changes it); the
    -- stored headers of a replay without a member of that name in any case; none for a claim in another
    -- transaction's flight (its row is not visible)
    IF c.outcome OPERATOR(pg_catalog.=) ANY (ARRAY['claimed', 'replay', 'mismatch'])
       OR (c.outcome OPERATOR(pg_catalog.=) 'in_progress' AND c.row_found AND c.lease_until IS NOT NULL
           AND c.row_expires_at OPERATOR(pg_catalog.>) pg_catalog.now()) THEN
        result.headers := COALESCE(result.headers, '{}'::pg_catalog.jsonb)
            OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('Idempotency-Key-Expires',
                pg_catalog.to_char(pg_catalog.timezone('UTC', COALESCE(c.expires_at, c.row_expires_at)), 'Dy, DD Mon YYYY HH24:MI:SS "GMT"'));
    END IF;
    RETURN result;
END
$$;

-- 1.4: a client writes stored headers back on a replay, so each member must be a header it can send: its name an
-- RFC 9110 token, and every string in its value (the value, or a string within an array or object value) without
-- CR, LF or another control but HTAB (RFC 9110 field-value); src/complete.c's check_stored_headers. The jsonpath
-- matches an object with a bad member (one regex per name and per string); the check raises the C edition's
-- 22023 on the first in jsonb's order, and does nothing for NULL or an object without one.
CREATE FUNCTION @extschema@.idem_managed_bad_header()
RETURNS jsonpath
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
RETURN (E'$.keyvalue() ? (!(@.key like_regex "^[-!#$%&''*+.^_`|~0-9A-Za-z]+$")' OPERATOR(pg_catalog.||)
        E' || exists(@.value.** ? (@.type() == "string" && @ like_regex "[\\x01-\\x08\\x0a-\\x1f\\x7f]")))')
       ::pg_catalog.jsonpath;

CREATE FUNCTION @extschema@.idem_managed_check_headers(headers jsonb, argument text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    h record;
BEGIN
    IF headers IS NULL OR NOT headers OPERATOR(pg_catalog.@?) @extschema@.idem_managed_bad_header() THEN
        RETURN;
    END IF;
    FOR h IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(headers) AS e LOOP
        IF h.key OPERATOR(pg_catalog.=) '' THEN
            RAISE EXCEPTION 'idempotency %: a header name must not be empty', argument
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF pg_catalog.jsonb_build_object(h.key, 0) OPERATOR(pg_catalog.@?) @extschema@.idem_managed_bad_header() THEN
            RAISE EXCEPTION 'idempotency %: a header name is not an RFC 9110 token', argument
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF pg_catalog.jsonb_build_object('n', h.value) OPERATOR(pg_catalog.@?) @extschema@.idem_managed_bad_header() THEN
            RAISE EXCEPTION 'idempotency %: the value of header "%" contains a control character', argument, h.key
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
END
$$;

-- The end of a claim this transaction holds: the row it deferred written with the response (true), or for a
-- 5xx the key given back (false). The checks of the C edition in its order, after the callers' NULL checks of key
-- and scope: the key and scope (only for a key this transaction has not claimed: its claim checked them), a NULL
-- http_status, headers that are not an object (headers_arg names the argument) or hold a header a client cannot
-- send (idem_managed_check_headers), a content type with a control character, the status range, the size (size: the response's bytes as the C edition counts them) against
-- idempotency.max_response_bytes, and then ERROR 55000 when this transaction holds no claim on the key.
CREATE FUNCTION @extschema@.idem_managed_complete(
    key text, scope text, http_status integer, response_body jsonb, response_headers jsonb,
    content_type text, response_bytes bytea, size bigint, headers_arg text, caller text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id text := scope OPERATOR(pg_catalog.||) E'\x1f' OPERATOR(pg_catalog.||) key;
    claims jsonb := COALESCE(NULLIF(pg_catalog.current_setting('idempotency_managed.claims', true), ''),
                             '{}')::pg_catalog.jsonb;
    claim jsonb := claims OPERATOR(pg_catalog.->) id;
    partitioned boolean;
BEGIN
    -- One test on the way a valid completion takes (see idem_managed_claim); the checks in order when it fails.
    IF claim IS NULL OR http_status IS NULL OR http_status OPERATOR(pg_catalog.<) 100
       OR http_status OPERATOR(pg_catalog.>) 599
       OR pg_catalog.jsonb_typeof(response_headers) OPERATOR(pg_catalog.<>) 'object'
       OR response_headers OPERATOR(pg_catalog.@?) @extschema@.idem_managed_bad_header()
       OR content_type OPERATOR(pg_catalog.~) E'[\\x01-\\x08\\x0a-\\x1f\\x7f]'
       OR size OPERATOR(pg_catalog.>) 1048576
       OR pg_catalog.current_setting('idempotency.max_response_bytes', true) IS NOT NULL THEN
        IF claim IS NULL THEN
            PERFORM @extschema@.idem_managed_key_id(key, scope);
        END IF;
        IF http_status IS NULL THEN
            RAISE EXCEPTION 'idempotency http_status must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        IF response_headers IS NOT NULL AND pg_catalog.jsonb_typeof(response_headers) OPERATOR(pg_catalog.<>) 'object' THEN
            RAISE EXCEPTION 'idempotency % must be a JSON object', headers_arg USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- The check (a call with its fixed search_path) only for headers that hold a bad member: this branch is
        -- every completion's where idempotency.max_response_bytes is set (or defined by the C library, as on a
        -- server that has both editions).
        IF response_headers OPERATOR(pg_catalog.@?) @extschema@.idem_managed_bad_header() THEN
            PERFORM @extschema@.idem_managed_check_headers(response_headers, headers_arg);
        END IF;
        -- Replayed as a header value: no CR, LF or other control character (a tab is allowed).
        IF content_type OPERATOR(pg_catalog.~) E'[\\x01-\\x08\\x0a-\\x1f\\x7f]' THEN
            RAISE EXCEPTION 'idempotency content_type contains a control character' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Status range, then size against idempotency.max_response_bytes.
        PERFORM @extschema@.idem_managed_check_size(http_status, size);
        IF claim IS NULL THEN
            RAISE EXCEPTION '%: idempotency key "%" is not claimed by this transaction', caller, key
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Call idem_claim in the same transaction first and act only on outcome ''claimed''.';
        END IF;
    END IF;
    IF http_status OPERATOR(pg_catalog.>=) 500 THEN
        PERFORM pg_catalog.set_config('idempotency_managed.claims',
                                      (claims OPERATOR(pg_catalog.-) id)::pg_catalog.text, true);
        RETURN false;
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        RAISE EXCEPTION 'cannot execute %() in a read-only transaction', caller
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    -- The storage mode the claim read: it cannot change before this transaction ends (idem_set_storage takes
    -- ACCESS EXCLUSIVE locks, and the claim's read holds a lock on the key table).
    partitioned := (claim OPERATOR(pg_catalog.->>) 'p')::pg_catalog.bool;
    IF (claim OPERATOR(pg_catalog.->>) 'x')::pg_catalog.bool THEN
        -- An expired row (or a lease that ran out) of the key is replaced; none left (a cleanup removed it
        -- meanwhile): inserted.
        IF partitioned THEN
            UPDATE @extschema@.idempotency_keys_partitioned k
            SET expires_at = (claim OPERATOR(pg_catalog.->>) 'e')::pg_catalog.timestamptz, created_at = pg_catalog.now(),
                http_status = idem_managed_complete.http_status,
                request_hash = pg_catalog.decode(claim OPERATOR(pg_catalog.->>) 'h', 'hex'),
                response_headers = idem_managed_complete.response_headers,
                response_body = idem_managed_complete.response_body,
                response_content_type = idem_managed_complete.content_type,
                response_bytes = idem_managed_complete.response_bytes,
                lease_until = NULL, lease_token = NULL, recovery_point = NULL, recovery_state = NULL
            WHERE k.scope OPERATOR(pg_catalog.=) idem_managed_complete.scope
              AND k.key OPERATOR(pg_catalog.=) idem_managed_complete.key
              AND (k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                   OR (k.http_status IS NULL AND k.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()))
              -- Only the key's live row: an expired one stays beside the new row until its partition goes.
              AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now();
        ELSE
            UPDATE @extschema@.idempotency_keys k
            SET expires_at = (claim OPERATOR(pg_catalog.->>) 'e')::pg_catalog.timestamptz, created_at = pg_catalog.now(),
                http_status = idem_managed_complete.http_status,
                request_hash = pg_catalog.decode(claim OPERATOR(pg_catalog.->>) 'h', 'hex'),
                response_headers = idem_managed_complete.response_headers,
                response_body = idem_managed_complete.response_body,
                response_content_type = idem_managed_complete.content_type,
                response_bytes = idem_managed_complete.response_bytes,
                lease_until = NULL, lease_token = NULL, recovery_point = NULL, recovery_state = NULL
            WHERE k.scope OPERATOR(pg_catalog.=) idem_managed_complete.scope
              AND k.key OPERATOR(pg_catalog.=) idem_managed_complete.key
              AND (k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                   OR (k.http_status IS NULL AND k.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp()));
        END IF;
    END IF;
    IF NOT (claim OPERATOR(pg_catalog.->>) 'x')::pg_catalog.bool OR NOT FOUND THEN
        IF partitioned THEN
            INSERT INTO @extschema@.idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key,
                request_hash, response_headers, response_body, response_content_type, response_bytes)
            VALUES ((claim OPERATOR(pg_catalog.->>) 'e')::pg_catalog.timestamptz, pg_catalog.now(), http_status,
                    scope, key, pg_catalog.decode(claim OPERATOR(pg_catalog.->>) 'h', 'hex'), response_headers,
                    response_body, content_type, response_bytes);
        ELSE
            INSERT INTO @extschema@.idempotency_keys (expires_at, created_at, http_status, scope, key,
                request_hash, response_headers, response_body, response_content_type, response_bytes)
            VALUES ((claim OPERATOR(pg_catalog.->>) 'e')::pg_catalog.timestamptz, pg_catalog.now(), http_status,
                    scope, key, pg_catalog.decode(claim OPERATOR(pg_catalog.->>) 'h', 'hex'), response_headers,
                    response_body, content_type, response_bytes);
        END IF;
    END IF;
    PERFORM pg_catalog.set_config('idempotency_managed.claims', (claims OPERATOR(pg_catalog.-) id)::pg_catalog.text,
                                  true);
    RETURN true;
END
$$;

-- idempotency.max_response_bytes (default 1MB), a number of bytes or a size with its unit ('1kB', '2MB').
CREATE FUNCTION @extschema@.idem_managed_check_size(http_status integer, size bigint)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    setting text := pg_catalog.btrim(pg_catalog.current_setting('idempotency.max_response_bytes', true));
    max_bytes bigint;
BEGIN
    IF http_status OPERATOR(pg_catalog.<) 100 OR http_status OPERATOR(pg_catalog.>) 599 THEN
        RAISE EXCEPTION 'idempotency http_status must be between 100 and 599' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF http_status OPERATOR(pg_catalog.>=) 500 THEN
        RETURN;
    END IF;
    max_bytes := CASE WHEN setting IS NULL OR setting OPERATOR(pg_catalog.=) '' THEN 1048576
                      WHEN setting OPERATOR(pg_catalog.~) '^[0-9]+$' THEN setting::pg_catalog.int8
                      ELSE pg_catalog.pg_size_bytes(setting) END;
    IF size OPERATOR(pg_catalog.>) max_bytes THEN
        RAISE EXCEPTION 'idempotency response of % bytes exceeds idempotency.max_response_bytes (%)', size, max_bytes
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
END
$$;

CREATE FUNCTION @extschema@.idem_complete(
    key text,
    http_status integer,
    response_body jsonb DEFAULT NULL,
    response_headers jsonb DEFAULT NULL,
    scope text DEFAULT '')
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF key IS NULL OR scope IS NULL THEN
        IF key IS NULL THEN
            RAISE EXCEPTION 'idempotency key must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        RAISE EXCEPTION 'idempotency scope must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN @extschema@.idem_managed_complete(key, scope, http_status, response_body, response_headers, NULL, NULL,
        COALESCE(pg_catalog.pg_column_size(response_body), 0) OPERATOR(pg_catalog.+)
        COALESCE(pg_catalog.pg_column_size(response_headers), 0), 'response_headers', 'idem_complete');
END
$$;

CREATE FUNCTION @extschema@.idem_complete_request(
    key text,
    scope text,
    http_status integer,
    content_type text,
    headers jsonb,
    body bytea)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF key IS NULL OR scope IS NULL OR http_status IS NULL THEN
        IF key IS NULL THEN
            RAISE EXCEPTION 'idempotency key must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        IF scope IS NULL THEN
            RAISE EXCEPTION 'idempotency scope must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        -- Before the key's checks here, as in the C edition.
        RAISE EXCEPTION 'idempotency http_status must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- Sizes as the C edition counts them: each value's bytes and its 4-byte header.
    RETURN @extschema@.idem_managed_complete(key, scope, http_status, NULL, headers, content_type, body,
        COALESCE(pg_catalog.octet_length(body) OPERATOR(pg_catalog.+) 4, 0) OPERATOR(pg_catalog.+)
        COALESCE(pg_catalog.pg_column_size(headers), 0) OPERATOR(pg_catalog.+)
        COALESCE(pg_catalog.octet_length(content_type) OPERATOR(pg_catalog.+) 4, 0),
        'headers', 'idem_complete_request');
END
$$;

CREATE FUNCTION @extschema@.idem_release(
    key text,
    scope text DEFAULT '')
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id text;
    claims jsonb := COALESCE(NULLIF(pg_catalog.current_setting('idempotency_managed.claims', true), ''),
                             '{}')::pg_catalog.jsonb;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'idempotency key must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF scope IS NULL THEN
        RAISE EXCEPTION 'idempotency scope must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    id := @extschema@.idem_managed_key_id(key, scope);
    IF NOT claims OPERATOR(pg_catalog.?) id THEN
        RAISE EXCEPTION 'idem_release: idempotency key "%" is not claimed by this transaction', key
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Call idem_claim in the same transaction first and act only on outcome ''claimed''.';
    END IF;
    PERFORM pg_catalog.set_config('idempotency_managed.claims', (claims OPERATOR(pg_catalog.-) id)::pg_catalog.text,
                                  true);
    RETURN true;
END
$$;
