-- idempotency 1.0 -> 1.1: lease mode (leases, fencing tokens, recovery points), bounded waits,
-- more counters. Every 1.0 object keeps its definition; a 1.1 library serves a 1.0 database as it was.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

-- A lease is a row with lease_until set and no http_status: in flight outside any open transaction.
-- Nullable, no default: adding them rewrites nothing, and 1.0 rows are completed responses.
ALTER TABLE @extschema@.idempotency_keys
    ADD COLUMN lease_until    timestamptz,
    ADD COLUMN lease_token    uuid,
    ADD COLUMN recovery_point text,
    ADD COLUMN recovery_state jsonb;
-- The partitioned twin and all its partitions get the same columns in the same order.
ALTER TABLE @extschema@.idempotency_keys_partitioned
    ADD COLUMN lease_until    timestamptz,
    ADD COLUMN lease_token    uuid,
    ADD COLUMN recovery_point text,
    ADD COLUMN recovery_state jsonb;

COMMENT ON COLUMN @extschema@.idempotency_keys.lease_until IS
    'Lease mode: the lease runs until then; afterwards the next claim takes the key over. NULL for a completed key.';
COMMENT ON COLUMN @extschema@.idempotency_keys.lease_token IS
    'Lease mode: fencing token of the current holder; only it may extend, checkpoint, complete or release.';
COMMENT ON COLUMN @extschema@.idempotency_keys.recovery_point IS
    'Lease mode: the last step the holder recorded with idem_checkpoint; a takeover resumes there.';
COMMENT ON COLUMN @extschema@.idempotency_keys.recovery_state IS
    'Lease mode: the state recorded with the recovery point (for example the external charge id).';

CREATE TYPE @extschema@.idem_lease_result AS (
    outcome          text,
    http_status      integer,
    response_body    jsonb,
    response_headers jsonb,
    expires_at       timestamptz,
    lease_token      uuid,
    lease_until      timestamptz,
    recovery_point   text,
    recovery_state   jsonb);

CREATE FUNCTION @extschema@.idem_lease(
    key text,
    request_hash text,
    lease interval,
    ttl interval DEFAULT NULL,
    scope text DEFAULT '',
    wait interval DEFAULT NULL)
RETURNS @extschema@.idem_lease_result
AS 'MODULE_PATHNAME', 'idem_lease'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_lease_extend(
    key text,
    lease_token uuid,
    lease interval,
    scope text DEFAULT '')
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_lease_extend'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_checkpoint(
    key text,
    lease_token uuid,
    recovery_point text,
    recovery_state jsonb DEFAULT NULL,
    scope text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_lease_complete(
    key text,
    lease_token uuid,
    http_status integer,
    response_body jsonb DEFAULT NULL,
    response_headers jsonb DEFAULT NULL,
    scope text DEFAULT '')
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_lease_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_lease_release(
    key text,
    lease_token uuid,
    scope text DEFAULT '')
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_lease_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- idem_claim with a bounded wait for a key in flight; a separate name keeps idem_claim's 1.0 signature
-- (an overload with a defaulted wait would make untyped calls ambiguous).
CREATE FUNCTION @extschema@.idem_claim_wait(
    key text,
    request_hash text,
    wait interval,
    ttl interval DEFAULT NULL,
    scope text DEFAULT '')
RETURNS @extschema@.idem_claim_result
AS 'MODULE_PATHNAME', 'idem_claim_wait'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_lease(text, text, interval, interval, text, interval) IS
    'Lease mode: claims a key for a lease in a transaction of its own, or answers replay, mismatch or in_progress.';
COMMENT ON FUNCTION @extschema@.idem_lease_extend(text, uuid, interval, text) IS
    'Lease mode: the holder extends its lease to now() + lease; returns the new end.';
COMMENT ON FUNCTION @extschema@.idem_checkpoint(text, uuid, text, jsonb, text) IS
    'Lease mode: the holder records a recovery point in the transaction of that step''s local writes.';
COMMENT ON FUNCTION @extschema@.idem_lease_complete(text, uuid, integer, jsonb, jsonb, text) IS
    'Lease mode: the holder stores the response; a 5xx releases the lease instead (keeping the recovery point) and returns false.';
COMMENT ON FUNCTION @extschema@.idem_lease_release(text, uuid, text) IS
    'Lease mode: the holder gives the lease back at once, keeping the recovery point.';
COMMENT ON FUNCTION @extschema@.idem_claim_wait(text, text, interval, interval, text) IS
    'idem_claim that waits at most wait for a key in flight to finish, then answers replay or in_progress.';

-- The counters of lease mode, after the 1.0 columns.
DROP VIEW @extschema@.idem_stats;
DROP FUNCTION @extschema@.idem_stats_read();
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
    OUT stats_reset_at timestamptz,
    OUT leases bigint,
    OUT lease_takeovers bigint,
    OUT checkpoints bigint,
    OUT stale_tokens bigint,
    OUT waits bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_stats_read'
LANGUAGE C VOLATILE PARALLEL SAFE;
CREATE VIEW @extschema@.idem_stats AS SELECT * FROM @extschema@.idem_stats_read();

-- Field-subset fingerprints (IETF draft: the fingerprint may leave out fields that differ between retries,
-- such as a request id or a client timestamp). Each entry of exclude is a path of object keys joined by
-- '.', removed from the payload before hashing: '{request_id}' or 'meta.sent_at'.
CREATE FUNCTION @extschema@.idem_hash(payload jsonb, exclude text[])
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    path text;
BEGIN
    FOREACH path IN ARRAY exclude LOOP
        IF path IS NULL THEN
            RAISE EXCEPTION 'idempotency exclude paths must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        IF path = '' THEN
            RAISE EXCEPTION 'idempotency exclude paths must not be empty' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        payload := payload OPERATOR(pg_catalog.#-) pg_catalog.string_to_array(path, '.');
    END LOOP;
    RETURN @extschema@.idem_hash(payload);
END
$$;

COMMENT ON FUNCTION @extschema@.idem_hash(jsonb, text[]) IS
    'idem_hash of the payload without the fields named by exclude (paths of keys joined by ''.'').';

-- ---------------------------------------------------------------------------
-- The storage mode survives pg_dump. In 1.0 it was a CHECK (false) constraint, idempotency_keys_inactive,
-- on the inactive table. pg_dump does not write constraints of extension tables, so a restore came back in
-- table mode, and the ATTACH of each dumped partition failed on the fresh twin's marker. From 1.1 the mode is
-- whether idempotency_keys_partitioned has range partitions (the C code reads the same), which pg_dump
-- writes with their rows and ATTACH. In 1.0 databases the two always agree, so the markers can go.
ALTER TABLE @extschema@.idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_inactive;
ALTER TABLE @extschema@.idempotency_keys_partitioned DROP CONSTRAINT IF EXISTS idempotency_keys_inactive;

CREATE OR REPLACE FUNCTION @extschema@.idem_storage_mode()
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN EXISTS (SELECT FROM @extschema@.idem_partitions())
    THEN 'partitioned' ELSE 'table' END
$$;

-- Switches the storage mode, moving every live key (expired ones are dropped on the way). The mode is
-- whether idempotency_keys_partitioned has range partitions: it makes them all or drops them all.
-- Takes ACCESS EXCLUSIVE locks on both tables: claims arriving meanwhile wait and then use the new mode.
CREATE OR REPLACE FUNCTION @extschema@.idem_set_storage(mode text, partition_interval interval DEFAULT interval '1 day')
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
        RETURN format('partitioned: %s live keys moved, partitions of %s', moved, partition_interval);
    END IF;

    IF current_mode = 'table' THEN
        RETURN 'table: already';
    END IF;
    INSERT INTO @extschema@.idempotency_keys
        SELECT * FROM @extschema@.idempotency_keys_partitioned WHERE expires_at > now();
    GET DIAGNOSTICS moved = ROW_COUNT;
    FOR old_partition IN SELECT partition_name FROM @extschema@.idem_partitions() LOOP
        EXECUTE format('DROP TABLE @extschema@.%I', old_partition.partition_name);
    END LOOP;
    TRUNCATE @extschema@.idempotency_keys_partitioned_default;
    RETURN format('table: %s live keys moved', moved);
END
$$;


-- One index per partition, made with the partition, instead of a partitioned index on the twin. pg_dump writes
-- each partition's index apart; with a partitioned index in the fresh install, the restored ATTACH made that
-- index itself and the dumped one then collided with it. Updating a 1.0 database rebuilds the partitions' indexes.
DROP INDEX @extschema@.idempotency_keys_partitioned_key_scope;
CREATE INDEX idempotency_keys_partitioned_default_key_scope
    ON @extschema@.idempotency_keys_partitioned_default (key, scope);
DO $$
DECLARE
    existing record;
BEGIN
    FOR existing IN SELECT partition_name FROM @extschema@.idem_partitions() LOOP
        EXECUTE format('CREATE INDEX ON @extschema@.%I (key, scope)', existing.partition_name);
    END LOOP;
END
$$;

-- Makes one partition [lower, upper), taking over the rows parked for it in the default partition.
-- Built aside and attached: the parent is locked only SHARE UPDATE EXCLUSIVE, but the default
-- partition, which every claim reads, ACCESS EXCLUSIVE for the (short) rest of the transaction.
CREATE OR REPLACE FUNCTION @extschema@.idem_create_partition(lower_bound timestamptz, upper_bound timestamptz)
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
    EXECUTE format('CREATE INDEX ON @extschema@.%I (key, scope)', partition_name);
    EXECUTE format('WITH moved AS (DELETE FROM @extschema@.idempotency_keys_partitioned_default'
                   ' WHERE expires_at >= $1 AND expires_at < $2 RETURNING *)'
                   ' INSERT INTO @extschema@.%I SELECT * FROM moved', partition_name)
        USING lower_bound, upper_bound;
    EXECUTE format('ALTER TABLE @extschema@.idempotency_keys_partitioned ATTACH PARTITION @extschema@.%I'
                   ' FOR VALUES FROM (%L) TO (%L)', partition_name, lower_bound, upper_bound);
    RETURN partition_name;
END
$$;


-- ---------------------------------------------------------------------------
-- Keys in flight, for operators. A transactional claim writes no row: each backend publishes the keys it holds
-- in shared memory (needs shared_preload_libraries), and this lists them as SELECT on the active key table
-- would: ERROR 42501 without the privilege; under row level security only the claims whose scope, key and since
-- (as created_at) pass the table's SELECT policies for the caller. Every other column of that row is NULL.
CREATE FUNCTION @extschema@.idem_keys_in_flight_claims(
    OUT scope text, OUT key text, OUT pid integer, OUT since timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_keys_in_flight_claims'
LANGUAGE C VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_keys_in_flight_claims() IS
    'Transactional claims held now in this database (scope, key, holding pid, since), as the caller may see them.';

-- Both kinds: transactional claims (pid of the holder) and live leases (rows read as the caller, pid NULL).
CREATE FUNCTION @extschema@.idem_keys_in_flight(
    OUT scope text, OUT key text, OUT pid integer, OUT since timestamptz,
    OUT lease_until timestamptz, OUT holder text)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
        SELECT c.scope, c.key, c.pid, c.since, NULL::timestamptz, 'transaction'::text
        FROM @extschema@.idem_keys_in_flight_claims() c;
    RETURN QUERY EXECUTE pg_catalog.format(
        'SELECT k.scope::pg_catalog.text, k.key::pg_catalog.text, NULL::pg_catalog.int4, k.created_at,'
        ' k.lease_until, ''lease''::pg_catalog.text FROM @extschema@.%I k'
        ' WHERE k.http_status IS NULL AND k.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()',
        CASE @extschema@.idem_storage_mode() WHEN 'partitioned' THEN 'idempotency_keys_partitioned'
             ELSE 'idempotency_keys' END);
END
$$;

COMMENT ON FUNCTION @extschema@.idem_keys_in_flight() IS
    'Keys in flight: transactional claims (holder ''transaction'', pid of the backend) and live leases '
    '(holder ''lease''), as the caller may see them; join pg_stat_activity USING (pid).';
