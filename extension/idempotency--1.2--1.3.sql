-- idempotency 1.2 -> 1.3: maintenance that no session setting or planted name can bend, and the lean request.
-- The Makefile appends extension/functions.sql and extension/citus.sql (the SQL-language functions, as the
-- install script defines them), so an updated database and a fresh install define them from the same text.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.3'" to load this file. \quit


-- Hardening (issue 29)
-- idem_stats gains sweeps_blocked (sweeps that passed a table by because another session held its lock): the
-- view's column list changes, so the view and its function are made again, with their grants.
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
    OUT waits bigint,
    OUT sweeps_blocked bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_stats_read'
LANGUAGE C VOLATILE PARALLEL SAFE;
CREATE VIEW @extschema@.idem_stats AS SELECT * FROM @extschema@.idem_stats_read();
REVOKE ALL ON FUNCTION @extschema@.idem_stats_read() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_read() TO pg_monitor;
GRANT SELECT ON @extschema@.idem_stats TO pg_monitor;
-- idem_partitions, idem_premake_partitions and idem_drop_expired_partitions move into C, idem_create_partition
-- and idem_set_storage pin their settings: extension/functions.sql, appended below, replaces them.
-- End of the hardening section (issue 29).

-- The lean request (issue 30)
-- New nullable columns, no default: no table rewrite. Adding them to the partitioned table adds them to each of
-- its partitions.
ALTER TABLE @extschema@.idempotency_keys
    ADD COLUMN response_content_type text,
    ADD COLUMN response_bytes bytea;
ALTER TABLE @extschema@.idempotency_keys_partitioned
    ADD COLUMN response_content_type text,
    ADD COLUMN response_bytes bytea;

-- A response stored as the bytes the handler sent, with its content type; the claim and completion take the
-- request's and response's parts, so a client sends two statements of one value each and no jsonb is built.
COMMENT ON COLUMN @extschema@.idempotency_keys.response_content_type IS
    'The stored response''s Content-Type, when idem_complete_request stored it.';
COMMENT ON COLUMN @extschema@.idempotency_keys.response_bytes IS
    'The stored response body as the bytes sent (idem_complete_request); NULL when stored as jsonb or without body.';
COMMENT ON COLUMN @extschema@.idempotency_keys_partitioned.response_content_type IS
    'The stored response''s Content-Type, when idem_complete_request stored it.';
COMMENT ON COLUMN @extschema@.idempotency_keys_partitioned.response_bytes IS
    'The stored response body as the bytes sent (idem_complete_request); NULL when stored as jsonb or without body.';

-- A lease claim's replay carries the stored bytes too, as idem_claim_request's does: two columns at the end of
-- idem_lease_result, as 1.2 added fencing_number (a 1.3 library answers a database still at 1.2 without them).
ALTER TYPE @extschema@.idem_lease_result
    ADD ATTRIBUTE response_content_type text,
    ADD ATTRIBUTE response_bytes bytea;

CREATE TYPE @extschema@.idem_request_claim AS (
    outcome      text,
    http_status  integer,
    content_type text,
    headers      jsonb,
    body         bytea);

CREATE FUNCTION @extschema@.idem_fingerprint(
    method text,
    path text,
    query text,
    content_type text,
    body bytea)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_fingerprint'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

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
AS 'MODULE_PATHNAME', 'idem_claim_request'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_complete_request(
    key text,
    scope text,
    http_status integer,
    content_type text,
    headers jsonb,
    body bytea)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_complete_request'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Lease mode's completion by the holder, with the response as the bytes sent, as idem_complete_request stores it.
CREATE FUNCTION @extschema@.idem_lease_complete_request(
    key text,
    scope text,
    lease_token uuid,
    http_status integer,
    content_type text,
    headers jsonb,
    body bytea)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_lease_complete_request'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_fingerprint(text, text, text, text, bytea) IS
    'The request fingerprint: 1.2''s idem_hash(jsonb_build_object(method, path, body)) for a JSON body without query; see the README.';
COMMENT ON FUNCTION @extschema@.idem_claim_request(text, text, text, text, text, text, bytea, interval) IS
    'idem_claim with the fingerprint computed from the request''s parts; a replay returns the stored bytes.';
COMMENT ON FUNCTION @extschema@.idem_complete_request(text, text, integer, text, jsonb, bytea) IS
    'Stores the response of a claimed key as the bytes sent, with its content type; a 5xx releases the key and returns false.';
COMMENT ON FUNCTION @extschema@.idem_lease_complete_request(text, text, uuid, integer, text, jsonb, bytea) IS
    'Lease mode: the holder stores the response as the bytes sent, with its content type; a 5xx releases the lease instead (keeping the recovery point) and returns false.';
