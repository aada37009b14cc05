-- idempotency 1.0: install script.
-- Plain CREATE everywhere (no OR REPLACE, no IF NOT EXISTS): an object of the
-- same name made by someone else makes CREATE EXTENSION fail instead of being
-- adopted. Every name is schema-qualified. The C functions name their table and
-- operators by schema inside, so none of them depends on the caller's search_path.

\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- One row per completed key. A claim writes no row: the key's advisory lock
-- marks it in flight until idem_complete writes the row in the same transaction.
CREATE TABLE @extschema@.idempotency_keys (
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    http_status      integer CHECK (http_status BETWEEN 100 AND 499),
    scope            text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    request_hash     bytea NOT NULL CHECK (pg_catalog.octet_length(request_hash) = 32),
    response_headers jsonb,
    response_body    jsonb,
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (scope, key)
);

COMMENT ON TABLE @extschema@.idempotency_keys IS
    'Stored responses of completed idempotent requests; written only by idem_complete.';
COMMENT ON COLUMN @extschema@.idempotency_keys.scope IS 'Tenant or account the key belongs to; '''' when unscoped.';
COMMENT ON COLUMN @extschema@.idempotency_keys.key IS 'The Idempotency-Key sent by the client.';
COMMENT ON COLUMN @extschema@.idempotency_keys.request_hash IS 'SHA-256 of the request payload, 32 bytes.';
COMMENT ON COLUMN @extschema@.idempotency_keys.http_status IS 'Stored status; never 5xx.';
COMMENT ON COLUMN @extschema@.idempotency_keys.expires_at IS 'After this the key behaves as absent.';

-- Keys are application data: pg_dump keeps them.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_keys', '');

REVOKE ALL ON TABLE @extschema@.idempotency_keys FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_claim(
    key text,
    request_hash text,
    ttl interval DEFAULT NULL,
    scope text DEFAULT '',
    OUT outcome text,
    OUT http_status integer,
    OUT response_body jsonb,
    OUT response_headers jsonb,
    OUT expires_at timestamptz)
RETURNS record
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
