-- The idempotency API written by hand in PL/pgSQL, as a careful user would: the benchmark's baseline.
-- Same signatures, outcomes and SQLSTATEs as the extension, in its own schema so both fit in one database.
--
-- Design: the extension's own, lock first + one read at claim, one INSERT at complete. The other design,
-- inserting an 'in_progress' row at claim and updating it at complete, writes every key twice (about twice
-- the WAL and dead tuples), makes a concurrent claim of the same key wait on the uncommitted row instead
-- of answering in_progress at once, and leaves a stuck row when a transaction commits without completing.
-- Lock first (pg_try_advisory_xact_lock), then read in a new statement: under READ COMMITTED its snapshot
-- sees every completion committed before the lock was granted, so one read is enough.
--
-- What PL/pgSQL cannot do the same way:
-- * a transaction-level advisory lock cannot be unlocked: a replay keeps the key's lock until the
--   transaction ends (harmless: a live row answers before the lock is looked at), and idem_release or a
--   5xx give the key back to this transaction only, as the extension's do;
-- * the claims this transaction holds live in a transaction-local setting (set_config(..., true)),
--   which a rollback to a savepoint undoes, like the extension's per-transaction claim map;
-- * under REPEATABLE READ no statement can look with a newer snapshot, so when the key's lock is free the
--   claim probes: FOR UPDATE on a visible expired row, or INSERT .. ON CONFLICT DO NOTHING inside a
--   subtransaction that is always rolled back; both raise 40001 when the row changed after the snapshot.
--   When another transaction holds the lock the probe could wait, so the answer is in_progress where the
--   extension may already answer 40001. READ COMMITTED skips all this.
-- Settings: plpgsql_idem.ttl (interval text, default 24h), plpgsql_idem.mismatch_status (default 422),
-- plpgsql_idem.max_response_bytes (default 1048576).

CREATE SCHEMA plpgsql_idem;

CREATE TABLE plpgsql_idem.idempotency_keys (
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    http_status      integer,
    scope            text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    request_hash     bytea NOT NULL,
    response_headers jsonb,
    response_body    jsonb,
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (key, scope)
);

-- NULL -> 22004; empty key, over 255 bytes, control characters (C0, DEL, C1) -> 22023.
CREATE FUNCTION plpgsql_idem.check_key(key text, scope text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF key IS NULL OR scope IS NULL THEN
        RAISE EXCEPTION 'idempotency key and scope must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF key = '' OR octet_length(key) > 255 OR octet_length(scope) > 255
       OR key ~ '[\x01-\x1f\x7f-\x9f]' OR scope ~ '[\x01-\x1f\x7f-\x9f]' THEN
        RAISE EXCEPTION 'idempotency key or scope is empty, too long or has control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- The claims this transaction holds: {"<scope>\x1f<key>": {"h": hash, "e": expires_at, "x": replaces an
-- expired row}}. \x1f cannot occur in a valid scope or key. A completed or released claim is removed: the
-- extension treats those like no claim, and the map stays small in a transaction that handles many keys.
CREATE FUNCTION plpgsql_idem.txn_claims() RETURNS jsonb
LANGUAGE sql STABLE
RETURN coalesce(nullif(current_setting('plpgsql_idem.claims', true), '')::jsonb, '{}');

-- claim NULL removes the entry.
CREATE FUNCTION plpgsql_idem.set_txn_claim(id text, claim jsonb) RETURNS text
LANGUAGE sql VOLATILE
RETURN set_config('plpgsql_idem.claims',
                  CASE WHEN claim IS NULL THEN plpgsql_idem.txn_claims() - id
                       ELSE jsonb_set(plpgsql_idem.txn_claims(), ARRAY[id], claim) END::text,
                  true);

CREATE FUNCTION plpgsql_idem.idem_claim(
    key text,
    request_hash text,
    ttl interval DEFAULT NULL,
    scope text DEFAULT '',
    OUT outcome text,
    OUT http_status integer,
    OUT response_body jsonb,
    OUT response_headers jsonb,
    OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    id text := scope || E'\x1f' || key;
    hash bytea;
    until timestamptz;
    stored record;
    has_row boolean;
    granted boolean;
BEGIN
    PERFORM plpgsql_idem.check_key(key, scope);
    IF request_hash IS NULL THEN
        RAISE EXCEPTION 'idempotency request_hash must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF request_hash !~ '^[0-9a-fA-F]{64}$' THEN
        RAISE EXCEPTION 'idempotency request_hash must be 64 hex digits' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    hash := decode(request_hash, 'hex');
    ttl := coalesce(ttl, coalesce(nullif(current_setting('plpgsql_idem.ttl', true), ''), '24h')::interval);
    IF ttl <= interval '0' THEN
        RAISE EXCEPTION 'idempotency ttl must be greater than zero' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    until := now() + ttl;
    IF current_setting('transaction_read_only')::boolean THEN
        RAISE EXCEPTION 'cannot execute idem_claim() in a read-only transaction'
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;

    -- This transaction is already running the request.
    IF plpgsql_idem.txn_claims() ? id THEN
        outcome := 'in_progress';
        http_status := 409;
        RETURN;
    END IF;

    granted := pg_try_advisory_xact_lock(hashtextextended(id, 7655));
    SELECT k.expires_at, k.request_hash, k.http_status, k.response_body, k.response_headers INTO stored
    FROM plpgsql_idem.idempotency_keys k WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key;
    has_row := FOUND;

    -- A live stored response answers, whoever holds the lock.
    IF has_row AND stored.expires_at > now() THEN
        IF stored.request_hash = hash THEN
            outcome := 'replay';
            http_status := stored.http_status;
            response_body := stored.response_body;
            response_headers := stored.response_headers;
        ELSE
            outcome := 'mismatch';
            http_status := coalesce(nullif(current_setting('plpgsql_idem.mismatch_status', true), ''), '422')::int;
        END IF;
        expires_at := stored.expires_at;
        RETURN;
    END IF;

    IF NOT granted THEN
        outcome := 'in_progress';
        http_status := 409;
        RETURN;
    END IF;

    -- REPEATABLE READ: a row changed after the snapshot raises 40001 here (see the top of the file).
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        IF has_row THEN
            PERFORM FROM plpgsql_idem.idempotency_keys k
            WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key FOR UPDATE;
        ELSE
            BEGIN
                INSERT INTO plpgsql_idem.idempotency_keys (expires_at, created_at, scope, key, request_hash)
                VALUES (until, now(), scope, key, hash)
                ON CONFLICT ON CONSTRAINT idempotency_keys_pkey DO NOTHING;
                RAISE EXCEPTION USING ERRCODE = 'PIDEM';  -- undo the probe
            EXCEPTION WHEN SQLSTATE 'PIDEM' THEN
                NULL;
            END;
        END IF;
    END IF;

    PERFORM plpgsql_idem.set_txn_claim(id, jsonb_build_object(
        'h', request_hash, 'e', until, 'x', has_row));
    outcome := 'claimed';
    expires_at := until;
END $$;

CREATE FUNCTION plpgsql_idem.idem_complete(
    key text,
    http_status integer,
    response_body jsonb DEFAULT NULL,
    response_headers jsonb DEFAULT NULL,
    scope text DEFAULT '')
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    id text := scope || E'\x1f' || key;
    claim jsonb;
BEGIN
    PERFORM plpgsql_idem.check_key(key, scope);
    IF http_status IS NULL THEN
        RAISE EXCEPTION 'idempotency http_status must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF response_headers IS NOT NULL AND jsonb_typeof(response_headers) <> 'object' THEN
        RAISE EXCEPTION 'idempotency response_headers must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF http_status NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION 'idempotency http_status must be within 100..599' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF http_status < 500 AND coalesce(pg_column_size(response_body), 0) + coalesce(pg_column_size(response_headers), 0)
       > coalesce(nullif(current_setting('plpgsql_idem.max_response_bytes', true), ''), '1048576')::bigint THEN
        RAISE EXCEPTION 'idempotency response exceeds plpgsql_idem.max_response_bytes'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    claim := plpgsql_idem.txn_claims() -> id;
    IF claim IS NULL THEN
        RAISE EXCEPTION 'idem_complete: idempotency key "%" is not claimed by this transaction', key
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;

    -- Technical failures are never stored: the key is given back.
    IF http_status >= 500 THEN
        PERFORM plpgsql_idem.set_txn_claim(id, NULL);
        RETURN false;
    END IF;

    IF (claim ->> 'x')::boolean THEN
        UPDATE plpgsql_idem.idempotency_keys k
        SET expires_at = (claim ->> 'e')::timestamptz, created_at = now(), http_status = idem_complete.http_status,
            request_hash = decode(claim ->> 'h', 'hex'), response_headers = idem_complete.response_headers,
            response_body = idem_complete.response_body
        WHERE k.scope = idem_complete.scope AND k.key = idem_complete.key AND k.expires_at <= now();
    END IF;
    -- A new key, or the expired row was deleted meanwhile.
    IF NOT (claim ->> 'x')::boolean OR NOT FOUND THEN
        INSERT INTO plpgsql_idem.idempotency_keys
            (expires_at, created_at, http_status, scope, key, request_hash, response_headers, response_body)
        VALUES ((claim ->> 'e')::timestamptz, now(), http_status, scope, key, decode(claim ->> 'h', 'hex'),
                response_headers, response_body);
    END IF;
    PERFORM plpgsql_idem.set_txn_claim(id, NULL);
    RETURN true;
END $$;

CREATE FUNCTION plpgsql_idem.idem_release(key text, scope text DEFAULT '') RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    id text := scope || E'\x1f' || key;
    claim jsonb;
BEGIN
    PERFORM plpgsql_idem.check_key(key, scope);
    claim := plpgsql_idem.txn_claims() -> id;
    IF claim IS NULL THEN
        RAISE EXCEPTION 'idem_release: idempotency key "%" is not claimed by this transaction', key
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    PERFORM plpgsql_idem.set_txn_claim(id, NULL);
    RETURN true;
END $$;

-- Lowercase hex SHA-256 with PostgreSQL's own sha256(); jsonb hashes its canonical text output.
CREATE FUNCTION plpgsql_idem.idem_hash(bytea) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN encode(sha256($1), 'hex');

CREATE FUNCTION plpgsql_idem.idem_hash(text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN encode(sha256(convert_to($1, 'UTF8')), 'hex');

CREATE FUNCTION plpgsql_idem.idem_hash(jsonb) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN encode(sha256(convert_to($1::text, 'UTF8')), 'hex');
