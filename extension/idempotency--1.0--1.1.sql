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
