-- idempotency 1.3: the install script, built into idempotency--1.3.sql together with extension/functions.sql
-- (the SQL-language functions, shared with the update script idempotency--1.2--1.3.sql, so that a fresh install
-- and an updated one define them from the same text). Older versions are reached through
-- idempotency--1.0.sql and the update scripts beside it.
-- Plain CREATE for every object here (no OR REPLACE, no IF NOT EXISTS): an object of the same name made by
-- someone else makes CREATE EXTENSION fail instead of being adopted. Every name is schema-qualified. The C
-- functions find their table and sequence by the OID of their own schema, so none of them depends on the
-- caller's search_path or on the schema's name.

\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- One row per completed key, or per lease (lease mode writes its row when it claims). A transactional
-- claim writes no row: the key's advisory lock marks it in flight until idem_complete writes the row in the
-- same transaction.
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
    lease_until      timestamptz,
    lease_token      uuid,
    recovery_point   text,
    recovery_state   jsonb,
    -- 1.3 (issue 30): a response stored as the bytes sent, with its content type (response_body stays NULL)
    response_content_type text,
    response_bytes   bytea,
    -- 1.4 (issue 38): the fencing number of the key's last lease grant, so the next one is higher wherever the
    -- row goes (logical replication, a dump, a shard move) even if the sequence does not go with it
    fencing_number   bigint,
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
COMMENT ON COLUMN @extschema@.idempotency_keys.lease_until IS
    'Lease mode: the lease runs until then; afterwards the next claim takes the key over. NULL for a completed key.';
COMMENT ON COLUMN @extschema@.idempotency_keys.lease_token IS
    'Lease mode: fencing token of the current holder; only it may extend, checkpoint, complete or release.';
COMMENT ON COLUMN @extschema@.idempotency_keys.recovery_point IS
    'Lease mode: the last step the holder recorded with idem_checkpoint; a takeover resumes there.';
COMMENT ON COLUMN @extschema@.idempotency_keys.recovery_state IS
    'Lease mode: the state recorded with the recovery point (for example the external charge id).';

-- The same rows in date-partitioned form. The storage mode is whether this table has range partitions
-- beside its default one (idem_set_storage makes them all or drops them all); pg_dump writes them with their
-- ATTACH, so a restored database comes back in the mode it was dumped in.
-- A unique index cannot span partitions: the key's advisory lock keeps (scope, key) unique. Each partition has
-- its own (key, scope) index, made with it (a partitioned index would collide with the dumped ones on restore).
CREATE TABLE @extschema@.idempotency_keys_partitioned (
    LIKE @extschema@.idempotency_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS
) PARTITION BY RANGE (expires_at);
-- Rows beyond the partitions made ahead of time wait here until their partition exists.
CREATE TABLE @extschema@.idempotency_keys_partitioned_default
    PARTITION OF @extschema@.idempotency_keys_partitioned DEFAULT;
CREATE INDEX idempotency_keys_partitioned_default_key_scope
    ON @extschema@.idempotency_keys_partitioned_default (key, scope);

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

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

REVOKE ALL ON FUNCTION @extschema@.idem_stats_reset() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_cleanup() FROM PUBLIC;

CREATE TYPE @extschema@.idem_lease_result AS (
    outcome          text,
    http_status      integer,
    response_body    jsonb,
    response_headers jsonb,
    expires_at       timestamptz,
    lease_token      uuid,
    lease_until      timestamptz,
    recovery_point   text,
    recovery_state   jsonb,
    fencing_number   bigint,
    response_content_type text,
    response_bytes   bytea);

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


-- Field-subset fingerprints (IETF draft: the fingerprint may leave out fields that differ between retries,
-- such as a request id or a client timestamp). Each entry of exclude is a path of object keys joined by
-- '.', removed from the payload before hashing: '{request_id}' or 'meta.sent_at'.
CREATE FUNCTION @extschema@.idem_hash(payload jsonb, exclude text[])
RETURNS text
AS 'MODULE_PATHNAME', 'idem_hash_jsonb_exclude'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_hash(jsonb, text[]) IS
    'idem_hash of the payload without the fields named by exclude (paths of keys joined by ''.'').';

CREATE FUNCTION @extschema@.idem_keys_in_flight_claims(
    OUT scope text, OUT key text, OUT pid integer, OUT since timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_keys_in_flight_claims'
LANGUAGE C VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_keys_in_flight_claims() IS
    'Transactional claims held now in this database (scope, key, holding pid, since), as the caller may see them.';

-- Fencing numbers (1.2): idem_lease hands each grant the next one, so the numbers of one key's holders
-- strictly increase across takeovers, expiry and re-claims. A sequence survives restarts, and pg_dump and
-- pg_upgrade carry its position.
CREATE SEQUENCE @extschema@.idempotency_fencing_numbers AS bigint;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_fencing_numbers', '');
REVOKE ALL ON SEQUENCE @extschema@.idempotency_fencing_numbers FROM PUBLIC;
COMMENT ON SEQUENCE @extschema@.idempotency_fencing_numbers IS
    'Fencing numbers of idem_lease grants; read only by the extension''s C code.';

-- The counters are for operators: the owner, pg_monitor, and whoever they grant both to.
REVOKE ALL ON FUNCTION @extschema@.idem_stats_read() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_read() TO pg_monitor;
GRANT SELECT ON @extschema@.idem_stats TO pg_monitor;


-- The lean request (issue 30)
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


-- Fencing numbers that rise per key wherever the database moves (issue 38)
COMMENT ON COLUMN @extschema@.idempotency_keys.fencing_number IS
    'Lease mode: the fencing number of the key''s last grant; the next grant''s is higher.';
COMMENT ON COLUMN @extschema@.idempotency_keys_partitioned.fencing_number IS
    'Lease mode: the fencing number of the key''s last grant; the next grant''s is higher.';

-- Tombstones (1.4, issue 41): a completed key whose response expired, remembered without its response for
-- idempotency.tombstone_ttl, so a late retry answers 'expired' instead of running again. The sweeper writes
-- them as it removes expired rows (both storage modes) and removes them in turn; nothing is written while
-- idempotency.tombstone_ttl is 0, the default. Same key order and collation as idempotency_keys.
CREATE TABLE @extschema@.idempotency_tombstones (
    expired_at   timestamptz NOT NULL,
    scope        text COLLATE "C" NOT NULL,
    key          text COLLATE "C" NOT NULL,
    request_hash bytea NOT NULL,
    CONSTRAINT idempotency_tombstones_pkey PRIMARY KEY (key, scope)
);
COMMENT ON TABLE @extschema@.idempotency_tombstones IS
    'Keys whose response expired, kept without it for idempotency.tombstone_ttl; a claim of one answers expired.';
COMMENT ON COLUMN @extschema@.idempotency_tombstones.expired_at IS
    'When the key''s response expired (its expires_at); the tombstone goes idempotency.tombstone_ttl later.';
COMMENT ON COLUMN @extschema@.idempotency_tombstones.request_hash IS 'SHA-256 of the request payload, 32 bytes.';
-- Application data like the keys: pg_dump keeps them.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_tombstones', '');
REVOKE ALL ON TABLE @extschema@.idempotency_tombstones FROM PUBLIC;
