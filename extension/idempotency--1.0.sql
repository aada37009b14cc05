-- idempotency 1.0: the install script, built into idempotency--1.0.sql. Later versions are reached
-- through the update scripts beside it (idempotency--1.0--1.1.sql, ...), as for pg_cron: a fresh install
-- and an updated one run the same statements.
-- Plain CREATE everywhere (no OR REPLACE, no IF NOT EXISTS): an object of the
-- same name made by someone else makes CREATE EXTENSION fail instead of being
-- adopted. Every name is schema-qualified. The C functions name their table and
-- operators by schema inside, so none of them depends on the caller's search_path.

\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- One row per completed key. A claim writes no row: the key's advisory lock
-- marks it in flight until idem_complete writes the row in the same transaction.
-- No CHECK constraints: idem_complete validates status and hash before writing,
-- and a CHECK would be re-parsed on every insert.
CREATE TABLE @extschema@.idempotency_keys (
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    http_status      integer,
    scope            text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    request_hash     bytea NOT NULL,
    response_headers jsonb,
    response_body    jsonb,
    -- key first: it tells rows apart at the first column, where scope ('' for
    -- most callers) would make every index comparison look at both columns.
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (key, scope)
);

COMMENT ON TABLE @extschema@.idempotency_keys IS
    'Stored responses of completed idempotent requests; written only by idem_complete.';
COMMENT ON COLUMN @extschema@.idempotency_keys.scope IS 'Tenant or account the key belongs to; '''' when unscoped.';
COMMENT ON COLUMN @extschema@.idempotency_keys.key IS 'The Idempotency-Key sent by the client.';
COMMENT ON COLUMN @extschema@.idempotency_keys.request_hash IS 'SHA-256 of the request payload, 32 bytes.';
COMMENT ON COLUMN @extschema@.idempotency_keys.http_status IS 'Stored status; never 5xx.';
COMMENT ON COLUMN @extschema@.idempotency_keys.expires_at IS 'After this the key behaves as absent.';

-- The same rows in date-partitioned form, used after idem_set_storage('partitioned').
-- Exactly one of the two tables is active; the other carries the CHECK (false)
-- constraint idempotency_keys_inactive, which is how the C code tells the mode
-- and which makes a write to the inactive table fail instead of getting lost.
-- A unique index cannot span partitions: the key's advisory lock keeps (scope, key) unique.
CREATE TABLE @extschema@.idempotency_keys_partitioned (
    LIKE @extschema@.idempotency_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS,
    CONSTRAINT idempotency_keys_inactive CHECK (false)
) PARTITION BY RANGE (expires_at);
CREATE INDEX idempotency_keys_partitioned_key_scope
    ON @extschema@.idempotency_keys_partitioned (key, scope);
-- Rows beyond the partitions made ahead of time wait here until their partition exists.
CREATE TABLE @extschema@.idempotency_keys_partitioned_default
    PARTITION OF @extschema@.idempotency_keys_partitioned DEFAULT;

COMMENT ON TABLE @extschema@.idempotency_keys_partitioned IS
    'Stored responses when the storage mode is partitioned (see idem_set_storage); range partitions on expires_at.';

-- Keys are application data: pg_dump keeps them.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_keys', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_keys_partitioned_default', '');

REVOKE ALL ON TABLE @extschema@.idempotency_keys FROM PUBLIC;
REVOKE ALL ON TABLE @extschema@.idempotency_keys_partitioned FROM PUBLIC;
REVOKE ALL ON TABLE @extschema@.idempotency_keys_partitioned_default FROM PUBLIC;

-- A named row type rather than OUT parameters: a call in FROM then describes
-- its result from the type cache instead of rebuilding it from pg_proc.
CREATE TYPE @extschema@.idem_claim_result AS (
    outcome          text,
    http_status      integer,
    response_body    jsonb,
    response_headers jsonb,
    expires_at       timestamptz);

CREATE FUNCTION @extschema@.idem_claim(
    key text,
    request_hash text,
    ttl interval DEFAULT NULL,
    scope text DEFAULT '')
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_complete(
    key text,
    http_status integer,
    response_body jsonb DEFAULT NULL,
    response_headers jsonb DEFAULT NULL,
    scope text DEFAULT '')
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_release(
    key text,
    scope text DEFAULT '')
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_hash(text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_hash_text'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION @extschema@.idem_hash(bytea)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_hash_bytea'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION @extschema@.idem_hash(jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_hash_jsonb'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_claim(text, text, interval, text) IS
    'Claims a key, or answers replay, mismatch or in_progress without waiting.';
COMMENT ON FUNCTION @extschema@.idem_complete(text, integer, jsonb, jsonb, text) IS
    'Stores the response of a claimed key; a 5xx releases the key instead and returns false.';
COMMENT ON FUNCTION @extschema@.idem_release(text, text) IS
    'Gives a claimed key back without storing a response.';

-- Expiry: one sweep of expired keys in this database (the background worker does the same, batch by batch).
CREATE FUNCTION @extschema@.idem_cleanup()
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_cleanup'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_cleanup() IS
    'Deletes every expired key in batches of idempotency.cleanup_batch_size; returns how many.';

-- Counters: cluster-wide when preloaded, this backend's own otherwise (see the column shared).
CREATE FUNCTION @extschema@.idem_stats_read(
    OUT shared boolean,
    OUT claims bigint,
    OUT replays bigint,
    OUT in_progress bigint,
    OUT mismatches bigint,
    OUT completions_stored bigint,
    OUT released_5xx bigint,
    OUT releases bigint,
    OUT keys_removed bigint,
    OUT partitions_created bigint,
    OUT partitions_dropped bigint,
    OUT last_sweep_database text,
    OUT last_sweep_started_at timestamptz,
    OUT last_sweep_duration_ms double precision,
    OUT last_sweep_removed bigint,
    OUT last_error text,
    OUT last_error_database text,
    OUT last_error_at timestamptz,
    OUT stats_reset_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_stats_read'
LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE VIEW @extschema@.idem_stats AS SELECT * FROM @extschema@.idem_stats_read();

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

REVOKE ALL ON FUNCTION @extschema@.idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_cleanup() FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- Storage modes. These functions are PL/pgSQL: they run DDL rarely, and their
-- search_path is pinned so that only pg_catalog and the names they qualify are used.

CREATE FUNCTION @extschema@.idem_storage_mode()
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN EXISTS (
        SELECT FROM pg_catalog.pg_constraint
        WHERE conrelid OPERATOR(pg_catalog.=) '@extschema@.idempotency_keys'::pg_catalog.regclass
          AND conname OPERATOR(pg_catalog.=) 'idempotency_keys_inactive')
    THEN 'partitioned' ELSE 'table' END
$$;

-- The range partitions with their bounds, oldest first.
CREATE FUNCTION @extschema@.idem_partitions(
    OUT partition_name name, OUT lower_bound timestamptz, OUT upper_bound timestamptz)
RETURNS SETOF record
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.relname,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
    FROM pg_catalog.pg_inherits i
    JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
    WHERE i.inhparent OPERATOR(pg_catalog.=) '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass
      AND pg_get_expr(c.relpartbound, c.oid) OPERATOR(pg_catalog.<>) 'DEFAULT'
    ORDER BY 2
$$;

-- Makes one partition [lower, upper), taking over the rows parked for it in the default partition.
-- Built aside and attached: the parent is locked only SHARE UPDATE EXCLUSIVE, but the default
-- partition, which every claim reads, ACCESS EXCLUSIVE for the (short) rest of the transaction.
CREATE FUNCTION @extschema@.idem_create_partition(lower_bound timestamptz, upper_bound timestamptz)
RETURNS name
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = 0
AS $$
DECLARE
    partition_name name := format('idempotency_keys_p%s',
                                  to_char(lower_bound AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS'));
BEGIN
    -- Claims read the default partition; attaching locks it ACCESS EXCLUSIVE. Take that lock
    -- first, waiting at most idempotency.partition_lock_timeout, so that no claim still in
    -- flight can add a row to the range between the move and the attach.
    PERFORM set_config('lock_timeout',
                       coalesce(current_setting('idempotency.partition_lock_timeout', true), '100ms'), true);
    LOCK TABLE @extschema@.idempotency_keys_partitioned_default IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('CREATE TABLE @extschema@.%I (LIKE @extschema@.idempotency_keys_partitioned'
                   ' INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)', partition_name);
    EXECUTE format('REVOKE ALL ON TABLE @extschema@.%I FROM PUBLIC', partition_name);
    EXECUTE format('WITH moved AS (DELETE FROM @extschema@.idempotency_keys_partitioned_default'
                   ' WHERE expires_at >= $1 AND expires_at < $2 RETURNING *)'
                   ' INSERT INTO @extschema@.%I SELECT * FROM moved', partition_name)
        USING lower_bound, upper_bound;
    EXECUTE format('ALTER TABLE @extschema@.idempotency_keys_partitioned ATTACH PARTITION @extschema@.%I'
                   ' FOR VALUES FROM (%L) TO (%L)', partition_name, lower_bound, upper_bound);
    RETURN partition_name;
END
$$;

-- Partitions ahead of time, up to now() + idempotency.ttl + two partitions, so a claim never
-- lacks one. Returns how many it made. Waits for locks at most idempotency.partition_lock_timeout.
CREATE FUNCTION @extschema@.idem_premake_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = 0
AS $$
DECLARE
    width interval;
    last_upper timestamptz;
    horizon timestamptz;
    created integer := 0;
BEGIN
    IF @extschema@.idem_storage_mode() OPERATOR(pg_catalog.<>) 'partitioned' THEN
        RETURN 0;
    END IF;
    -- The newest partition is never dropped, so its width is always known.
    SELECT upper_bound - lower_bound, upper_bound INTO width, last_upper
    FROM @extschema@.idem_partitions() ORDER BY upper_bound DESC LIMIT 1;
    IF width IS NULL THEN
        RETURN 0;
    END IF;
    -- No claim can expire in the past: after a long pause, start again at the current partition.
    last_upper := greatest(last_upper, date_bin(width, now(), timestamptz '2000-01-01 00:00:00+00'));
    horizon := now() + coalesce(current_setting('idempotency.ttl', true), '1d')::interval + 2 * width;
    WHILE last_upper < horizon LOOP
        BEGIN
            PERFORM @extschema@.idem_create_partition(last_upper, last_upper + width);
        EXCEPTION WHEN lock_not_available THEN
            -- Claims in flight hold the default partition: try again at the next sweep.
            RAISE LOG 'idempotency: the default partition is busy; making partitions at the next sweep';
            RETURN created;
        END;
        last_upper := last_upper + width;
        created := created + 1;
    END LOOP;
    RETURN created;
END
$$;

-- Drops every partition whose rows have all expired, with DROP TABLE: no row deletes, little WAL.
-- A drop that cannot get its lock within idempotency.partition_lock_timeout is left for the next sweep,
-- so claims never queue behind it for longer than that.
CREATE FUNCTION @extschema@.idem_drop_expired_partitions(OUT partitions_dropped integer, OUT keys_removed bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = 0
AS $$
DECLARE
    expired record;
    keys bigint;
BEGIN
    partitions_dropped := 0;
    keys_removed := 0;
    -- The newest partition stays even when expired: it carries the width for the next ones.
    FOR expired IN SELECT partition_name FROM @extschema@.idem_partitions()
                   WHERE upper_bound <= now()
                     AND upper_bound < (SELECT max(upper_bound) FROM @extschema@.idem_partitions()) LOOP
        BEGIN
            PERFORM set_config('lock_timeout',
                               coalesce(current_setting('idempotency.partition_lock_timeout', true), '100ms'),
                               true);
            EXECUTE format('SELECT count(*) FROM @extschema@.%I', expired.partition_name) INTO keys;
            EXECUTE format('DROP TABLE @extschema@.%I', expired.partition_name);
            partitions_dropped := partitions_dropped + 1;
            keys_removed := keys_removed + keys;
        EXCEPTION WHEN lock_not_available THEN
            RAISE LOG 'idempotency: partition % is busy; dropping it at the next sweep', expired.partition_name;
        END;
    END LOOP;
END
$$;

-- Switches the storage mode, moving every live key (expired ones are dropped on the way).
-- Takes ACCESS EXCLUSIVE locks on both tables: claims arriving meanwhile wait and then use the new mode.
CREATE FUNCTION @extschema@.idem_set_storage(mode text, partition_interval interval DEFAULT interval '1 day')
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    current_mode text;
    moved bigint;
    first_lower timestamptz;
    last_upper timestamptz;
    horizon timestamptz;
    old_partition record;
BEGIN
    IF mode IS NULL OR partition_interval IS NULL THEN
        RAISE EXCEPTION 'idem_set_storage: mode and partition_interval must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF mode NOT IN ('table', 'partitioned') THEN
        RAISE EXCEPTION 'idem_set_storage: unknown storage mode "%"', mode
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''table'' or ''partitioned''.';
    END IF;
    IF partition_interval < interval '1 minute' OR extract(month FROM partition_interval) <> 0
       OR extract(year FROM partition_interval) <> 0 THEN
        RAISE EXCEPTION 'idem_set_storage: partition_interval must be at least 1 minute and have no months or years'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The move reads with a snapshot taken after the locks are granted; a transaction snapshot
    -- taken before them would miss keys completed while waiting, and TRUNCATE would lose them.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'idem_set_storage must run in a READ COMMITTED transaction'
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    -- Every claim reads every partition (the key does not tell which): keep them few.
    IF mode = 'partitioned' AND
       (coalesce(current_setting('idempotency.ttl', true), '1d')::interval + 2 * partition_interval)
       / 64 > partition_interval THEN
        RAISE EXCEPTION 'idem_set_storage: partition_interval % is too small for idempotency.ttl %',
                        partition_interval, coalesce(current_setting('idempotency.ttl', true), '1d')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'At most 64 partitions may cover idempotency.ttl plus two partitions.';
    END IF;

    LOCK TABLE @extschema@.idempotency_keys IN ACCESS EXCLUSIVE MODE;
    LOCK TABLE @extschema@.idempotency_keys_partitioned IN ACCESS EXCLUSIVE MODE;
    current_mode := @extschema@.idem_storage_mode();

    -- Tenants separated by row level security on one table must stay separated on the other.
    IF EXISTS (SELECT FROM pg_catalog.pg_class source, pg_catalog.pg_class target
               WHERE source.oid OPERATOR(pg_catalog.=) (CASE WHEN mode = 'partitioned'
                         THEN '@extschema@.idempotency_keys' ELSE '@extschema@.idempotency_keys_partitioned'
                         END)::pg_catalog.regclass
                 AND target.oid OPERATOR(pg_catalog.=) (CASE WHEN mode = 'partitioned'
                         THEN '@extschema@.idempotency_keys_partitioned' ELSE '@extschema@.idempotency_keys'
                         END)::pg_catalog.regclass
                 AND ((source.relrowsecurity AND NOT target.relrowsecurity)
                      OR (source.relforcerowsecurity AND NOT target.relforcerowsecurity)
                      OR (SELECT count(*) FROM pg_catalog.pg_policy p
                          WHERE p.polrelid OPERATOR(pg_catalog.=) source.oid)
                         OPERATOR(pg_catalog.>)
                         (SELECT count(*) FROM pg_catalog.pg_policy p
                          WHERE p.polrelid OPERATOR(pg_catalog.=) target.oid))) THEN
        RAISE EXCEPTION 'idem_set_storage: row level security on the current table is missing on the other one'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Enable (and force) row level security and create the same policies on both '
                         'idempotency_keys and idempotency_keys_partitioned, then switch.';
    END IF;

    IF mode = 'partitioned' THEN
        SELECT max(upper_bound) INTO last_upper FROM @extschema@.idem_partitions();
        IF current_mode = 'table' THEN
            ALTER TABLE @extschema@.idempotency_keys_partitioned DROP CONSTRAINT idempotency_keys_inactive;
        END IF;
        -- Partitions of the new width from the current one (or after the last existing one) onwards.
        first_lower := coalesce(last_upper, date_bin(partition_interval, now(), timestamptz '2000-01-01 00:00:00+00'));
        horizon := now() + coalesce(current_setting('idempotency.ttl', true), '1d')::interval
                   + 2 * partition_interval;
        last_upper := first_lower;
        LOOP
            PERFORM @extschema@.idem_create_partition(last_upper, last_upper + partition_interval);
            last_upper := last_upper + partition_interval;
            EXIT WHEN last_upper >= horizon;
        END LOOP;
        IF current_mode = 'partitioned' THEN
            RETURN format('partitioned: new partitions of %s', partition_interval);
        END IF;
        INSERT INTO @extschema@.idempotency_keys_partitioned
            SELECT * FROM @extschema@.idempotency_keys WHERE expires_at > now();
        GET DIAGNOSTICS moved = ROW_COUNT;
        TRUNCATE @extschema@.idempotency_keys;
        ALTER TABLE @extschema@.idempotency_keys
            ADD CONSTRAINT idempotency_keys_inactive CHECK (false);
        RETURN format('partitioned: %s live keys moved, partitions of %s', moved, partition_interval);
    END IF;

    IF current_mode = 'table' THEN
        RETURN 'table: already';
    END IF;
    ALTER TABLE @extschema@.idempotency_keys DROP CONSTRAINT idempotency_keys_inactive;
    INSERT INTO @extschema@.idempotency_keys
        SELECT * FROM @extschema@.idempotency_keys_partitioned WHERE expires_at > now();
    GET DIAGNOSTICS moved = ROW_COUNT;
    FOR old_partition IN SELECT partition_name FROM @extschema@.idem_partitions() LOOP
        EXECUTE format('DROP TABLE @extschema@.%I', old_partition.partition_name);
    END LOOP;
    TRUNCATE @extschema@.idempotency_keys_partitioned_default;
    ALTER TABLE @extschema@.idempotency_keys_partitioned
        ADD CONSTRAINT idempotency_keys_inactive CHECK (false);
    RETURN format('table: %s live keys moved', moved);
END
$$;

REVOKE ALL ON FUNCTION @extschema@.idem_set_storage(text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_create_partition(timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_premake_partitions() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_drop_expired_partitions() FROM PUBLIC;
