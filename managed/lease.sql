-- The managed edition: lease mode (src/lease.c, src/complete.c, the lease statements of src/key_store_spi.c),
-- with fencing numbers. idem_lease claims as idem_claim does (the key's advisory lock, tried; a bounded wait) and
-- writes the lease row in the caller's transaction, which commits at once. The holder's calls wait for the key's
-- lock, so they never interleave with a claim deciding on the same row, and act only on the key's live row whose
-- token is theirs: otherwise 55000 and nothing written.

-- clock_timestamp() + lease: ERROR 22004 when NULL, 22023 unless within (0, 365 days], 22008 past the timestamp
-- range. 1.4: a fixed duration, as idem_managed_expiry counts a ttl (a day is 24 hours, a month 30 days).
CREATE FUNCTION @extschema@.idem_managed_lease_end(lease interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    start timestamptz := pg_catalog.clock_timestamp();
    seconds float8 := pg_catalog.date_part('epoch', lease);
    lease_end timestamptz;
BEGIN
    IF lease IS NULL THEN
        RAISE EXCEPTION 'idempotency lease must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF seconds OPERATOR(pg_catalog.<=) 0 OR seconds OPERATOR(pg_catalog.>) 31536000 THEN
        lease_end := start OPERATOR(pg_catalog.+) lease;
        IF seconds OPERATOR(pg_catalog.<=) 0 THEN
            RAISE EXCEPTION 'idempotency lease must be greater than zero' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RAISE EXCEPTION 'idempotency lease must be at most 365 days' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN start OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => seconds);
END
$$;

-- clock_timestamp() + wait for a bounded wait; NULL (no wait) for NULL or zero; 22023 unless within [0, 1 day].
-- 1.4: a fixed duration, as idem_managed_lease_end.
CREATE FUNCTION @extschema@.idem_managed_wait_until(wait interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    start timestamptz := pg_catalog.clock_timestamp();
    seconds float8 := pg_catalog.date_part('epoch', wait);
    wait_until timestamptz;
BEGIN
    IF wait IS NULL OR wait OPERATOR(pg_catalog.=) interval '0' THEN
        RETURN NULL;
    END IF;
    IF seconds OPERATOR(pg_catalog.<=) 0 OR seconds OPERATOR(pg_catalog.>) 86400 THEN
        wait_until := start OPERATOR(pg_catalog.+) wait;
        IF seconds OPERATOR(pg_catalog.<=) 0 THEN
            RAISE EXCEPTION 'idempotency wait must not be negative' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RAISE EXCEPTION 'idempotency wait must be at most 1 day' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN start OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => seconds);
END
$$;

CREATE FUNCTION @extschema@.idem_lease(
    key text,
    request_hash text,
    lease interval,
    ttl interval DEFAULT NULL,
    scope text DEFAULT '',
    wait interval DEFAULT NULL)
RETURNS @extschema@.idem_lease_result
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
    result @extschema@.idem_lease_result;
    id text;
    hash bytea;
    ttl_span interval;
    wait_until timestamptz;
    takeover boolean;
    partitioned boolean;
    written_expires_at timestamptz;
    written_fence bigint;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'idempotency key must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF scope IS NULL THEN
        RAISE EXCEPTION 'idempotency scope must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    id := @extschema@.idem_managed_key_id(key, scope);
    IF request_hash IS NULL THEN
        RAISE EXCEPTION 'idempotency request_hash must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    hash := @extschema@.idem_managed_request_hash(request_hash);
    -- Every argument is checked before anything is done; the lease itself is timed after any wait.
    PERFORM @extschema@.idem_managed_lease_end(lease);
    -- A fixed duration (no days to add on the caller's calendar).
    ttl_span := pg_catalog.make_interval(secs => pg_catalog.date_part('epoch',
        @extschema@.idem_managed_expiry(ttl) OPERATOR(pg_catalog.-) pg_catalog.now()));
    wait_until := @extschema@.idem_managed_wait_until(wait);
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        RAISE EXCEPTION 'cannot execute idem_lease() in a read-only transaction'
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    c := @extschema@.idem_managed_claim(key, scope, NULL, hash, NULL, wait, false, 'idem_lease');
    result.outcome := c.outcome;
    result.http_status := c.http_status;
    IF c.outcome OPERATOR(pg_catalog.=) 'claimed' THEN
        -- A lease runs its full length from the grant; the key outlives it by the ttl.
        result.lease_until := @extschema@.idem_managed_lease_end(lease);
        result.expires_at := result.lease_until OPERATOR(pg_catalog.+) ttl_span;
        result.lease_token := pg_catalog.gen_random_uuid();
        takeover := c.row_found AND c.lease_until IS NOT NULL AND c.row_expires_at OPERATOR(pg_catalog.>) pg_catalog.now();
        partitioned := EXISTS (SELECT FROM pg_catalog.pg_inherits i
                               WHERE i.inhparent OPERATOR(pg_catalog.=)
                                     '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass
                                 AND NOT i.inhdetachpending
                                 AND i.inhrelid OPERATOR(pg_catalog.<>)
                                     '@extschema@.idempotency_keys_partitioned_default'::pg_catalog.regclass);
        -- The fencing number's floor (1.4): the sequence's next value and the clock in microseconds since
        -- 2000-01-01, as the C edition's; the row's write below raises it above the number the row last carried.
        result.fencing_number := GREATEST(
            pg_catalog.nextval('@extschema@.idempotency_fencing_numbers'::pg_catalog.regclass),
            ((EXTRACT(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.-) 946684800)
             OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8);
        IF c.row_found AND NOT partitioned THEN
            -- An expired row or a lapsed lease; a takeover keeps the key's expiry (the later one) and recovery point.
            UPDATE @extschema@.idempotency_keys k SET
                expires_at = CASE WHEN takeover THEN GREATEST(k.expires_at, result.expires_at) ELSE result.expires_at END,
                created_at = CASE WHEN takeover THEN k.created_at ELSE pg_catalog.now() END,
                request_hash = hash, http_status = NULL, response_body = NULL, response_headers = NULL,
                response_content_type = NULL, response_bytes = NULL,
                lease_until = result.lease_until, lease_token = result.lease_token,
                recovery_point = CASE WHEN takeover THEN k.recovery_point END,
                recovery_state = CASE WHEN takeover THEN k.recovery_state END,
                fencing_number = GREATEST(result.fencing_number, k.fencing_number OPERATOR(pg_catalog.+) 1)
            WHERE k.scope OPERATOR(pg_catalog.=) idem_lease.scope AND k.key OPERATOR(pg_catalog.=) idem_lease.key
            RETURNING k.expires_at, k.fencing_number INTO written_expires_at, written_fence;
        ELSIF c.row_found THEN
            UPDATE @extschema@.idempotency_keys_partitioned k SET
                expires_at = CASE WHEN takeover THEN GREATEST(k.expires_at, result.expires_at) ELSE result.expires_at END,
                created_at = CASE WHEN takeover THEN k.created_at ELSE pg_catalog.now() END,
                request_hash = hash, http_status = NULL, response_body = NULL, response_headers = NULL,
                response_content_type = NULL, response_bytes = NULL,
                lease_until = result.lease_until, lease_token = result.lease_token,
                recovery_point = CASE WHEN takeover THEN k.recovery_point END,
                recovery_state = CASE WHEN takeover THEN k.recovery_state END,
                fencing_number = GREATEST(result.fencing_number, k.fencing_number OPERATOR(pg_catalog.+) 1)
            WHERE k.scope OPERATOR(pg_catalog.=) idem_lease.scope AND k.key OPERATOR(pg_catalog.=) idem_lease.key
              AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
            RETURNING k.expires_at, k.fencing_number INTO written_expires_at, written_fence;
        END IF;
        -- A row written keeps what it says; no row, or a cleanup removed it meanwhile (a takeover then has
        -- nothing left to keep): a new one. (RETURNING INTO sets NULLs when no row was written.)
        IF c.row_found AND FOUND THEN
            result.expires_at := written_expires_at;
            result.fencing_number := written_fence;
        ELSE
            IF partitioned THEN
                INSERT INTO @extschema@.idempotency_keys_partitioned (expires_at, created_at, scope, key,
                                                                      request_hash, lease_until, lease_token,
                                                                      fencing_number)
                VALUES (result.expires_at, pg_catalog.now(), scope, key, hash, result.lease_until, result.lease_token,
                        result.fencing_number);
            ELSE
                INSERT INTO @extschema@.idempotency_keys (expires_at, created_at, scope, key, request_hash,
                                                          lease_until, lease_token, fencing_number)
                VALUES (result.expires_at, pg_catalog.now(), scope, key, hash, result.lease_until, result.lease_token,
                        result.fencing_number);
            END IF;
            takeover := false;
        END IF;
        -- A takeover resumes from the recovery point the last holder recorded.
        IF takeover THEN
            result.recovery_point := c.recovery_point;
            result.recovery_state := c.recovery_state;
        END IF;
    ELSIF c.outcome OPERATOR(pg_catalog.=) 'in_progress' THEN
        -- The lease's end, for Retry-After; NULL when a transaction holds the key.
        result.lease_until := c.lease_until;
    ELSIF c.outcome OPERATOR(pg_catalog.=) 'replay' THEN
        result.response_body := CASE WHEN c.response_body IS NULL AND c.response_bytes IS NOT NULL
                                     THEN @extschema@.idem_managed_bytes_as_jsonb(c.content_type, c.response_bytes)
                                     ELSE c.response_body END;
        -- The stored headers without a member named Idempotency-Key-Expires in any case (the rule key-lifetime
        -- below adds it): a query, run for a replay only, so a grant's expressions below stay simple ones.
        result.response_headers := (SELECT pg_catalog.jsonb_object_agg(h.k, h.v)
                                    FROM pg_catalog.jsonb_each(c.response_headers) AS h(k, v)
                                    WHERE pg_catalog.lower(h.k) OPERATOR(pg_catalog.<>) 'idempotency-key-expires');
        result.expires_at := c.expires_at;
        result.response_content_type := c.content_type;
        result.response_bytes := COALESCE(c.response_bytes, pg_catalog.convert_to(
            pg_catalog.jsonb_out(c.response_body)::pg_catalog.text, 'UTF8'));
    ELSE
        result.expires_at := c.expires_at;
    END IF;
    -- 1.4, rule key-lifetime: the headers this answer carries, with the key's expiry as an RFC 9110 IMF-fixdate in
    -- GMT (to_char of the UTC time with non-localized patterns: no DateStyle, TimeZone or lc_time changes it); the
    -- stored headers of a replay without a member of that name in any case; none for a claim in another
    -- transaction's flight (its row is not visible)
    IF c.outcome OPERATOR(pg_catalog.=) ANY (ARRAY['claimed', 'replay', 'mismatch'])
       OR (c.outcome OPERATOR(pg_catalog.=) 'in_progress' AND c.row_found AND c.lease_until IS NOT NULL
           AND c.row_expires_at OPERATOR(pg_catalog.>) pg_catalog.now()) THEN
        result.response_headers := COALESCE(result.response_headers, '{}'::pg_catalog.jsonb)
            OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('Idempotency-Key-Expires',
                pg_catalog.to_char(pg_catalog.timezone('UTC', COALESCE(result.expires_at, c.row_expires_at)), 'Dy, DD Mon YYYY HH24:MI:SS "GMT"'));
    END IF;
    RETURN result;
END
$$;

-- One change by the lease's holder: extend, checkpoint, complete or release. Waits for the key's lock, then
-- changes the key's live row if its token is the holder's; 55000 otherwise. Returns the lease's end.
CREATE FUNCTION @extschema@.idem_managed_lease_change(
    change text, caller text, key text, scope text, token uuid, new_until timestamptz,
    recovery_point text, recovery_state jsonb,
    http_status integer, response_body jsonb, response_headers jsonb, content_type text, response_bytes bytea)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id text := scope OPERATOR(pg_catalog.||) E'\x1f' OPERATOR(pg_catalog.||) key;
    partitioned boolean;
    changed boolean;
    result timestamptz;
BEGIN
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        RAISE EXCEPTION 'cannot execute % in a read-only transaction', caller
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    -- Waits out a claim that is reading the row right now.
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(id COLLATE "C", 7655));
    -- Table storage's write first; then the storage mode, read once that write holds its lock on idempotency_keys,
    -- which idem_set_storage locks first (a change that waited for a switch reads the mode it switched to);
    -- in partitioned storage the table is empty and the write finds nothing.
    UPDATE @extschema@.idempotency_keys k SET
        lease_until = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN NULL
                           WHEN change OPERATOR(pg_catalog.=) 'checkpoint' THEN k.lease_until ELSE new_until END,
        lease_token = CASE WHEN change OPERATOR(pg_catalog.=) ANY ('{complete,release}'::text[]) THEN NULL
                           ELSE k.lease_token END,
        expires_at = CASE WHEN change OPERATOR(pg_catalog.=) 'extend' THEN GREATEST(k.expires_at,
                         pg_catalog.timezone('UTC', pg_catalog.timezone('UTC', new_until) OPERATOR(pg_catalog.+)
                                             (k.expires_at OPERATOR(pg_catalog.-) k.lease_until)))
                          ELSE k.expires_at END,
        recovery_point = CASE WHEN change OPERATOR(pg_catalog.=) 'checkpoint' THEN idem_managed_lease_change.recovery_point
                              ELSE k.recovery_point END,
        recovery_state = CASE WHEN change OPERATOR(pg_catalog.=) 'checkpoint' THEN idem_managed_lease_change.recovery_state
                              ELSE k.recovery_state END,
        http_status = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN idem_managed_lease_change.http_status END,
        response_body = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN idem_managed_lease_change.response_body END,
        response_headers = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN idem_managed_lease_change.response_headers END,
        response_content_type = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN content_type END,
        response_bytes = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN idem_managed_lease_change.response_bytes END
    WHERE k.scope OPERATOR(pg_catalog.=) idem_managed_lease_change.scope
      AND k.key OPERATOR(pg_catalog.=) idem_managed_lease_change.key
      AND k.lease_token OPERATOR(pg_catalog.=) token AND k.http_status IS NULL
      AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.transaction_timestamp()
    RETURNING k.lease_until INTO result;
    SELECT FOUND, EXISTS (SELECT FROM pg_catalog.pg_inherits i
                          WHERE i.inhparent OPERATOR(pg_catalog.=)
                                '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass
                            AND NOT i.inhdetachpending
                            AND i.inhrelid OPERATOR(pg_catalog.<>)
                                '@extschema@.idempotency_keys_partitioned_default'::pg_catalog.regclass)
    INTO changed, partitioned;
    IF partitioned THEN
        UPDATE @extschema@.idempotency_keys_partitioned k SET
            lease_until = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN NULL
                               WHEN change OPERATOR(pg_catalog.=) 'checkpoint' THEN k.lease_until ELSE new_until END,
            lease_token = CASE WHEN change OPERATOR(pg_catalog.=) ANY ('{complete,release}'::text[]) THEN NULL
                               ELSE k.lease_token END,
            expires_at = CASE WHEN change OPERATOR(pg_catalog.=) 'extend' THEN GREATEST(k.expires_at,
                             pg_catalog.timezone('UTC', pg_catalog.timezone('UTC', new_until) OPERATOR(pg_catalog.+)
                                                 (k.expires_at OPERATOR(pg_catalog.-) k.lease_until)))
                              ELSE k.expires_at END,
            recovery_point = CASE WHEN change OPERATOR(pg_catalog.=) 'checkpoint' THEN idem_managed_lease_change.recovery_point
                                  ELSE k.recovery_point END,
            recovery_state = CASE WHEN change OPERATOR(pg_catalog.=) 'checkpoint' THEN idem_managed_lease_change.recovery_state
                                  ELSE k.recovery_state END,
            http_status = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN idem_managed_lease_change.http_status END,
            response_body = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN idem_managed_lease_change.response_body END,
            response_headers = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN idem_managed_lease_change.response_headers END,
            response_content_type = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN content_type END,
            response_bytes = CASE WHEN change OPERATOR(pg_catalog.=) 'complete' THEN idem_managed_lease_change.response_bytes END
        WHERE k.scope OPERATOR(pg_catalog.=) idem_managed_lease_change.scope
          AND k.key OPERATOR(pg_catalog.=) idem_managed_lease_change.key
          AND k.lease_token OPERATOR(pg_catalog.=) token AND k.http_status IS NULL
          AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.transaction_timestamp()
        RETURNING k.lease_until INTO result;
        changed := FOUND;
    END IF;
    IF NOT changed THEN
        RAISE EXCEPTION '%: idempotency lease token is not the current one for key "%"', caller, key
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The lease was taken over after it ran out, or was completed or released.',
                  HINT = 'Stop working on this request: another attempt owns it now.';
    END IF;
    RETURN result;
END
$$;

-- The holder's arguments, as the C edition checks them: key, lease_token, scope not NULL; key and scope valid.
CREATE FUNCTION @extschema@.idem_managed_holder_args(key text, token uuid, scope text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'idempotency key must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION 'idempotency lease_token must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF scope IS NULL THEN
        RAISE EXCEPTION 'idempotency scope must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM @extschema@.idem_managed_key_id(key, scope);
END
$$;

CREATE FUNCTION @extschema@.idem_lease_extend(
    key text,
    lease_token uuid,
    lease interval,
    scope text DEFAULT '')
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.idem_managed_holder_args(key, lease_token, scope);
    RETURN @extschema@.idem_managed_lease_change('extend', 'idem_lease_extend', key, scope, lease_token,
        @extschema@.idem_managed_lease_end(lease), NULL, NULL, NULL, NULL, NULL, NULL, NULL);
END
$$;

CREATE FUNCTION @extschema@.idem_checkpoint(
    key text,
    lease_token uuid,
    recovery_point text,
    recovery_state jsonb DEFAULT NULL,
    scope text DEFAULT '')
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    setting text := pg_catalog.btrim(pg_catalog.current_setting('idempotency.max_response_bytes', true));
    max_bytes bigint;
BEGIN
    PERFORM @extschema@.idem_managed_holder_args(key, lease_token, scope);
    IF recovery_point IS NULL THEN
        RAISE EXCEPTION 'idempotency recovery_point must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF recovery_point OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'idempotency recovery_point must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.octet_length(recovery_point) OPERATOR(pg_catalog.>) 255 THEN
        RAISE EXCEPTION 'idempotency recovery_point is longer than 255 bytes' USING ERRCODE = 'program_limit_exceeded';
    END IF;
    -- The state is kept like a response body, under the same limit.
    max_bytes := CASE WHEN setting IS NULL OR setting OPERATOR(pg_catalog.=) '' THEN 1048576
                      WHEN setting OPERATOR(pg_catalog.~) '^[0-9]+$' THEN setting::pg_catalog.int8
                      ELSE pg_catalog.pg_size_bytes(setting) END;
    IF pg_catalog.pg_column_size(recovery_state) OPERATOR(pg_catalog.>) max_bytes THEN
        RAISE EXCEPTION 'idempotency recovery_state of % bytes exceeds idempotency.max_response_bytes (%)',
                        pg_catalog.pg_column_size(recovery_state), max_bytes
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    PERFORM @extschema@.idem_managed_lease_change('checkpoint', 'idem_checkpoint', key, scope, lease_token, NULL,
        recovery_point, recovery_state, NULL, NULL, NULL, NULL, NULL);
END
$$;

CREATE FUNCTION @extschema@.idem_lease_complete(
    key text,
    lease_token uuid,
    http_status integer,
    response_body jsonb DEFAULT NULL,
    response_headers jsonb DEFAULT NULL,
    scope text DEFAULT '')
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.idem_managed_holder_args(key, lease_token, scope);
    IF http_status IS NULL THEN
        RAISE EXCEPTION 'idempotency http_status must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF response_headers IS NOT NULL AND pg_catalog.jsonb_typeof(response_headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'idempotency response_headers must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF response_headers OPERATOR(pg_catalog.@?) @extschema@.idem_managed_bad_header() THEN  -- the call only for a bad member
        PERFORM @extschema@.idem_managed_check_headers(response_headers, 'response_headers');
    END IF;
    PERFORM @extschema@.idem_managed_check_size(http_status,
        COALESCE(pg_catalog.pg_column_size(response_body), 0) OPERATOR(pg_catalog.+)
        COALESCE(pg_catalog.pg_column_size(response_headers), 0));
    IF http_status OPERATOR(pg_catalog.>=) 500 THEN
        -- Never stored: the lease ends now, its recovery point stays.
        PERFORM @extschema@.idem_managed_lease_change('release', 'idem_lease_complete', key, scope, lease_token,
            pg_catalog.clock_timestamp(), NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        RETURN false;
    END IF;
    PERFORM @extschema@.idem_managed_lease_change('complete', 'idem_lease_complete', key, scope, lease_token, NULL,
        NULL, NULL, http_status, response_body, response_headers, NULL, NULL);
    RETURN true;
END
$$;

CREATE FUNCTION @extschema@.idem_lease_complete_request(
    key text,
    scope text,
    lease_token uuid,
    http_status integer,
    content_type text,
    headers jsonb,
    body bytea)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.idem_managed_holder_args(key, lease_token, scope);
    IF http_status IS NULL THEN
        RAISE EXCEPTION 'idempotency http_status must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'idempotency headers must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF headers OPERATOR(pg_catalog.@?) @extschema@.idem_managed_bad_header() THEN  -- the call only for a bad member
        PERFORM @extschema@.idem_managed_check_headers(headers, 'headers');
    END IF;
    IF content_type OPERATOR(pg_catalog.~) E'[\\x01-\\x08\\x0a-\\x1f\\x7f]' THEN
        RAISE EXCEPTION 'idempotency content_type contains a control character' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@.idem_managed_check_size(http_status,
        COALESCE(pg_catalog.octet_length(body) OPERATOR(pg_catalog.+) 4, 0) OPERATOR(pg_catalog.+)
        COALESCE(pg_catalog.pg_column_size(headers), 0) OPERATOR(pg_catalog.+)
        COALESCE(pg_catalog.octet_length(content_type) OPERATOR(pg_catalog.+) 4, 0));
    IF http_status OPERATOR(pg_catalog.>=) 500 THEN
        PERFORM @extschema@.idem_managed_lease_change('release', 'idem_lease_complete_request', key, scope,
            lease_token, pg_catalog.clock_timestamp(), NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        RETURN false;
    END IF;
    PERFORM @extschema@.idem_managed_lease_change('complete', 'idem_lease_complete_request', key, scope, lease_token,
        NULL, NULL, NULL, http_status, NULL, headers, content_type, body);
    RETURN true;
END
$$;

CREATE FUNCTION @extschema@.idem_lease_release(
    key text,
    lease_token uuid,
    scope text DEFAULT '')
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.idem_managed_holder_args(key, lease_token, scope);
    PERFORM @extschema@.idem_managed_lease_change('release', 'idem_lease_release', key, scope, lease_token,
        pg_catalog.clock_timestamp(), NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    RETURN true;
END
$$;

-- The fencing number comes from the sequence, which the caller needs no privilege on in the C edition (its C code
-- takes the number without a check): here every role may take the next number (USAGE: nextval, currval; neither
-- setval nor reading the position). A role that calls nextval itself only makes a gap: numbers are only ordered.
-- No SECURITY DEFINER function is needed for it (lease_rls's role has no other right on the sequence).
GRANT USAGE ON SEQUENCE @extschema@.idempotency_fencing_numbers TO PUBLIC;
