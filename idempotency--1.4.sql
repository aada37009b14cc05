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
-- idempotency 1.3: the SQL-language functions. Appended to both the install script (idempotency--1.3.sql) and
-- the update script (idempotency--1.2--1.3.sql) by the Makefile, so the two define them from the same text.
-- OR REPLACE is for the update; in CREATE EXTENSION, replacing a function that is not the extension's own fails
-- ("is not a member of extension"), so a pre-created look-alike is never adopted.
--
-- Nothing here binds a name at call time: no function calls another function of the extension by name.
-- idem_storage_mode and idem_keys_in_flight have SQL-standard bodies (BEGIN ATOMIC), which are parsed when
-- created and refer to the objects they use by OID; the partitions' upkeep and idem_set_storage are in C (1.3) and
-- call idem_create_partition by OID; the PL/pgSQL functions read the storage mode from the catalog. They find the
-- extension's schema by OID from pg_extension on every call and name their objects through it: a renamed schema,
-- and same-named objects planted in a new schema of the old name, change nothing. Every function pins its
-- search_path to pg_catalog, pg_temp, and every operator outside pg_catalog's own defaults is written out.

-- The storage mode: whether idempotency_keys_partitioned has range partitions (C reads the same). In C (1.3): the
-- bounds are the values stored in the catalog, the same under every DateStyle and TimeZone (1.2 read them back
-- from pg_get_expr's text under the caller's settings, hours off in some zones).
CREATE OR REPLACE FUNCTION @extschema@.idem_partitions(
    OUT partition_name name, OUT lower_bound timestamptz, OUT upper_bound timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_partitions'
LANGUAGE C STABLE
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION @extschema@.idem_storage_mode()
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT CASE WHEN EXISTS (SELECT FROM @extschema@.idem_partitions())
    THEN 'partitioned' ELSE 'table' END;
END;

-- Makes one partition [lower, upper), taking over the rows parked for it in the default partition.
-- Built aside and attached: the parent is locked only SHARE UPDATE EXCLUSIVE, but the default
-- partition, which every claim reads, ACCESS EXCLUSIVE for the (short) rest of the transaction.
-- At most 64 range partitions exist (every claim reads them all), whatever idempotency.ttl says: ERROR 54000.
-- A relation of the partition's name that is not ours (names are predictable, and a role with CREATE on the
-- schema may take one first) is left alone: the partition gets a name with a random suffix instead.
-- The settings that print or place what it makes are its own (the ATTACH prints the bounds, the partition and
-- its index go in the parent's tablespace), and it calls no function of the extension: nothing an overload,
-- a DateStyle, a TimeZone or a default_tablespace chosen by another role can bend.
CREATE OR REPLACE FUNCTION @extschema@.idem_create_partition(lower_bound timestamptz, upper_bound timestamptz)
RETURNS name
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = 0
SET DateStyle = 'ISO, YMD'
SET IntervalStyle = 'postgres'
SET TimeZone = 'UTC'
SET default_tablespace = ''
AS $$
DECLARE
    schema_oid oid := (SELECT e.extnamespace FROM pg_catalog.pg_extension e
                       WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency');
    s text := (SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_namespace n
               WHERE n.oid OPERATOR(pg_catalog.=) schema_oid);
    parent oid := (SELECT c.oid FROM pg_catalog.pg_class c
                   WHERE c.relnamespace OPERATOR(pg_catalog.=) schema_oid
                     AND c.relname OPERATOR(pg_catalog.=) 'idempotency_keys_partitioned');
    partition_name name := pg_catalog.format('idempotency_keys_p%s',
                               pg_catalog.to_char(lower_bound AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS'));
    existing integer;
BEGIN
    -- Range partitions: every partition but the default one.
    SELECT pg_catalog.count(*) INTO existing FROM pg_catalog.pg_inherits i
    WHERE i.inhparent OPERATOR(pg_catalog.=) parent
      AND i.inhrelid OPERATOR(pg_catalog.<>) ALL (SELECT p.partdefid FROM pg_catalog.pg_partitioned_table p
                                                 WHERE p.partrelid OPERATOR(pg_catalog.=) parent);
    IF existing OPERATOR(pg_catalog.>=) 64 THEN
        RAISE EXCEPTION 'idempotency: %.idempotency_keys_partitioned already has 64 partitions', s
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Every claim reads every partition; lower idempotency.ttl or widen the partitions '
                         'with idem_set_storage(''partitioned'', ...).';
    END IF;
    -- A table's name is taken in pg_type too (its row type): a domain or type of that name blocks it as well.
    IF EXISTS (SELECT FROM pg_catalog.pg_class c
               WHERE c.relnamespace OPERATOR(pg_catalog.=) schema_oid
                 AND c.relname OPERATOR(pg_catalog.=) partition_name)
       OR EXISTS (SELECT FROM pg_catalog.pg_type t
                  WHERE t.typnamespace OPERATOR(pg_catalog.=) schema_oid
                    AND t.typname OPERATOR(pg_catalog.=) partition_name) THEN
        RAISE LOG 'idempotency: a relation or type named %.% exists already and is not a partition of ours; '
                  'making the partition for % under another name', s, partition_name, lower_bound;
        partition_name := pg_catalog.format('%s_%s', partition_name,
                              pg_catalog.left(pg_catalog.md5(pg_catalog.gen_random_uuid()::text), 12));
    END IF;
    -- Claims read the default partition; attaching locks it ACCESS EXCLUSIVE. Take that lock
    -- first, waiting at most idempotency.partition_lock_timeout, so that no claim still in
    -- flight can add a row to the range between the move and the attach.
    PERFORM pg_catalog.set_config('lock_timeout',
                       coalesce(pg_catalog.current_setting('idempotency.partition_lock_timeout', true), '100ms'),
                       true);
    EXECUTE pg_catalog.format('LOCK TABLE %s.idempotency_keys_partitioned_default IN ACCESS EXCLUSIVE MODE', s);
    -- The partition and its index go where the parent is ('' is the database's default tablespace).
    PERFORM pg_catalog.set_config('default_tablespace',
                       coalesce((SELECT t.spcname::text FROM pg_catalog.pg_class c
                                 JOIN pg_catalog.pg_tablespace t ON t.oid OPERATOR(pg_catalog.=) c.reltablespace
                                 WHERE c.oid OPERATOR(pg_catalog.=) parent), ''),
                       true);
    EXECUTE pg_catalog.format('CREATE TABLE %s.%I (LIKE %s.idempotency_keys_partitioned'
                   ' INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)', s, partition_name, s);
    EXECUTE pg_catalog.format('REVOKE ALL ON TABLE %s.%I FROM PUBLIC', s, partition_name);
    EXECUTE pg_catalog.format('CREATE INDEX ON %s.%I (key, scope)', s, partition_name);
    EXECUTE pg_catalog.format('WITH moved AS (DELETE FROM %s.idempotency_keys_partitioned_default'
                   ' WHERE expires_at OPERATOR(pg_catalog.>=) $1 AND expires_at OPERATOR(pg_catalog.<) $2'
                   ' RETURNING *) INSERT INTO %s.%I SELECT * FROM moved', s, s, partition_name)
        USING lower_bound, upper_bound;
    EXECUTE pg_catalog.format('ALTER TABLE %s.idempotency_keys_partitioned ATTACH PARTITION %s.%I'
                   ' FOR VALUES FROM (%L) TO (%L)', s, s, partition_name, lower_bound, upper_bound);
    RETURN partition_name;
END
$$;

-- Partitions ahead of time, up to now() + idempotency.ttl + two partitions, so a claim never
-- lacks one. Returns how many it made. Waits for locks at most idempotency.partition_lock_timeout.
-- A partition it cannot make (a busy default partition, the 64-partition cap, any other error) is logged and
-- left for the next sweep; the sweep goes on to its deletes either way.
-- In C (1.3), as the worker runs it: as the table's owner with the maintenance settings (README, "Security"),
-- the bounds read as values, idem_create_partition called by OID.
CREATE OR REPLACE FUNCTION @extschema@.idem_premake_partitions()
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_premake_partitions'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

-- Drops every partition whose rows have all expired, with DROP TABLE: no row deletes, little WAL.
-- Keys are counted before any lock on the parent; a lock not granted within idempotency.partition_lock_timeout is
-- asked for again after a pause, up to 10 tries (1.4), so claims queue behind one try for at most that long. A
-- partition still busy after them, or failing otherwise, is logged and left for the next sweep. Its locks last
-- until the caller's transaction ends: call it alone in one. In C (1.3), as the worker runs it.
CREATE OR REPLACE FUNCTION @extschema@.idem_drop_expired_partitions(OUT partitions_dropped integer,
                                                                    OUT keys_removed bigint)
AS 'MODULE_PATHNAME', 'idem_drop_expired_partitions'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

-- Switches the storage mode, moving every live key (expired ones are dropped on the way). The mode is
-- whether idempotency_keys_partitioned has range partitions: it makes them all or drops them all.
-- Takes ACCESS EXCLUSIVE locks on both tables: claims arriving meanwhile wait and then use the new mode.
-- Its date arithmetic is UTC's, whatever the session's DateStyle and TimeZone (its messages keep the caller's
-- IntervalStyle). Refused, changing nothing: a NULL argument (22004), an unknown mode, a partition_interval under
-- 1 minute or with months or years, or one that would need more than 64 partitions for idempotency.ttl plus two
-- partitions (22023), a transaction that is not READ COMMITTED (25000), keys distributed by Citus (0A000), row
-- level security on the current table that the other one lacks (55000). In C (1.3): it reads the partitions as
-- values and calls idem_create_partition by OID, so no overload can capture or break its calls.
CREATE OR REPLACE FUNCTION @extschema@.idem_set_storage(mode text, partition_interval interval DEFAULT interval '1 day')
RETURNS text
AS 'MODULE_PATHNAME', 'idem_set_storage'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp
SET DateStyle = 'ISO, YMD'
SET TimeZone = 'UTC';

REVOKE ALL ON FUNCTION @extschema@.idem_set_storage(text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_create_partition(timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_premake_partitions() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_drop_expired_partitions() FROM PUBLIC;

-- The part of idem_keys_in_flight() after this node's claims: on a Citus coordinator whose keys are distributed,
-- the transactional claims held on the other nodes (holder 'transaction@host:port': the pid is that node's), then
-- the live leases of the active key table (rows read as the caller, pid NULL; on Citus, from every shard).
-- It calls no function of the extension: the active table is the one with range partitions, read from the
-- catalog, as the claims pick it. The other nodes are asked through Citus's dynamic SQL, once it is found, and
-- answer with their own idem_keys_in_flight_claims().
CREATE OR REPLACE FUNCTION @extschema@.idem_keys_in_flight_rest(
    OUT scope text, OUT key text, OUT pid integer, OUT since timestamptz,
    OUT lease_until timestamptz, OUT holder text)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    schema_oid oid := (SELECT e.extnamespace FROM pg_catalog.pg_extension e
                       WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency');
    s text := (SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_namespace n
               WHERE n.oid OPERATOR(pg_catalog.=) schema_oid);
    twin oid := (SELECT c.oid FROM pg_catalog.pg_class c
                 WHERE c.relnamespace OPERATOR(pg_catalog.=) schema_oid
                   AND c.relname OPERATOR(pg_catalog.=) 'idempotency_keys_partitioned');
    partitioned boolean;
    remote record;
    cluster_wide boolean := false;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        EXECUTE 'SELECT pg_catalog.citus_is_coordinator() AND EXISTS (SELECT FROM pg_catalog.pg_dist_partition p'
                ' WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1::pg_catalog.regclass)'
            INTO cluster_wide USING pg_catalog.format('%s.idempotency_keys', s);
    END IF;
    IF cluster_wide THEN
        FOR remote IN EXECUTE
            'SELECT nodename, nodeport, success, result FROM pg_catalog.run_command_on_workers($1)'
            USING pg_catalog.format('SELECT COALESCE(pg_catalog.json_agg(c), ''[]'')'
                                    ' FROM %s.idem_keys_in_flight_claims() c', s)
        LOOP
            IF NOT remote.success THEN
                RAISE WARNING 'idem_keys_in_flight: node %:% did not answer: %', remote.nodename, remote.nodeport,
                              remote.result;
                CONTINUE;
            END IF;
            RETURN QUERY
                SELECT r.scope, r.key, r.pid, r.since, NULL::timestamptz,
                       pg_catalog.format('transaction@%s:%s', remote.nodename, remote.nodeport)
                FROM pg_catalog.json_to_recordset(remote.result::json) AS r(scope text, key text, pid integer,
                                                                             since timestamptz);
        END LOOP;
    END IF;
    -- The storage mode, as idem_storage_mode() and the claims read it: range partitions besides the default one.
    partitioned := EXISTS (SELECT FROM pg_catalog.pg_inherits i
                           WHERE i.inhparent OPERATOR(pg_catalog.=) twin AND NOT i.inhdetachpending
                             AND i.inhrelid OPERATOR(pg_catalog.<>) ALL (
                                 SELECT p.partdefid FROM pg_catalog.pg_partitioned_table p
                                 WHERE p.partrelid OPERATOR(pg_catalog.=) twin));
    RETURN QUERY EXECUTE pg_catalog.format(
        'SELECT k.scope::pg_catalog.text, k.key::pg_catalog.text, NULL::pg_catalog.int4, k.created_at,'
        ' k.lease_until, ''lease''::pg_catalog.text FROM %s.%I k'
        ' WHERE k.http_status IS NULL AND k.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()'
        ' AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()',
        s, CASE WHEN partitioned THEN 'idempotency_keys_partitioned' ELSE 'idempotency_keys' END);
END
$$;

COMMENT ON FUNCTION @extschema@.idem_keys_in_flight_rest() IS
    'The part of idem_keys_in_flight() after this node''s claims: the claims of the other Citus nodes, then live '
    'leases; call idem_keys_in_flight() instead.';

-- Both kinds of keys in flight: transactional claims (pid of the holder) and live leases (rows read as the
-- caller, pid NULL), with the claims held on the other nodes of a Citus cluster between them. An SQL-standard
-- body: the two functions it calls are bound by OID when it is created.
CREATE OR REPLACE FUNCTION @extschema@.idem_keys_in_flight(
    OUT scope text, OUT key text, OUT pid integer, OUT since timestamptz,
    OUT lease_until timestamptz, OUT holder text)
RETURNS SETOF record
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT c.scope, c.key, c.pid, c.since, NULL::pg_catalog.timestamptz, 'transaction'::pg_catalog.text
    FROM @extschema@.idem_keys_in_flight_claims() c
    UNION ALL
    SELECT r.scope, r.key, r.pid, r.since, r.lease_until, r.holder
    FROM @extschema@.idem_keys_in_flight_rest() r;
END;

COMMENT ON FUNCTION @extschema@.idem_keys_in_flight() IS
    'Keys in flight: transactional claims (holder ''transaction'', pid of the backend) and live leases '
    '(holder ''lease''), as the caller may see them; join pg_stat_activity USING (pid).';
-- ---------------------------------------------------------------------------
-- Scaling out with Citus (README, "Scaling out with Citus"). Appended after functions.sql to both the install
-- script and the update script, under the same rules: every PL/pgSQL function finds the extension's schema by OID
-- on each call. Nothing here needs Citus to be installed: its functions and catalogs are reached only through
-- EXECUTE, after pg_extension shows citus.

-- The one supported layout in one call, on the coordinator: idempotency_keys distributed by scope and co-located
-- with the tenant's business tables, so that a key's row and the business rows of its tenant live on one node and
-- commit in one local transaction there; every function taking a scope delegated to that node.
CREATE OR REPLACE FUNCTION @extschema@.idem_citus_distribute(colocate_with regclass)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s text := (SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
               WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency');
    keys pg_catalog.regclass;
    twin pg_catalog.oid := (SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_extension e
                            ON e.extnamespace OPERATOR(pg_catalog.=) c.relnamespace
                            WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'
                              AND c.relname OPERATOR(pg_catalog.=) 'idempotency_keys_partitioned');
    storage_mode text;
    keys_method text;
    keys_colocation integer;
    business_method text;
    business_replication text;
    business_colocation integer;
    business_column text;
    column_type pg_catalog.oid;
    column_collation pg_catalog.oid;
    scope_collation pg_catalog.oid;
    unscoped bigint;
    fn pg_catalog.regprocedure;
    delegated integer := 0;
    is_coordinator boolean;
BEGIN
    IF colocate_with IS NULL THEN
        RAISE EXCEPTION 'idem_citus_distribute: colocate_with must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    keys := pg_catalog.format('%s.idempotency_keys', s)::pg_catalog.regclass;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'idem_citus_distribute: Citus is not installed in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Put citus first in shared_preload_libraries (''citus,idempotency''), CREATE EXTENSION '
                         'citus, add the workers, distribute the business tables, then call this again.';
    END IF;
    EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO is_coordinator;
    IF NOT is_coordinator THEN
        RAISE EXCEPTION 'idem_citus_distribute must run on the Citus coordinator'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- Partitioned storage keeps its rows in a local partitioned twin that Citus cannot co-locate by scope.
    -- The mode as idem_storage_mode() reads it, from the catalog (no call by name): range partitions besides the
    -- default one.
    storage_mode := CASE WHEN EXISTS (
            SELECT FROM pg_catalog.pg_inherits i
            WHERE i.inhparent OPERATOR(pg_catalog.=) twin AND NOT i.inhdetachpending
              AND i.inhrelid OPERATOR(pg_catalog.<>) ALL (SELECT p.partdefid FROM pg_catalog.pg_partitioned_table p
                                                         WHERE p.partrelid OPERATOR(pg_catalog.=) twin))
        THEN 'partitioned' ELSE 'table' END;
    IF storage_mode OPERATOR(pg_catalog.<>) 'table' THEN
        RAISE EXCEPTION 'idem_citus_distribute: partitioned storage is not supported on Citus'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Switch back first: SELECT idem_set_storage(''table'').';
    END IF;

    -- The business table: distributed by hash, by a column of scope's type and collation.
    EXECUTE 'SELECT p.partmethod::pg_catalog.text, p.repmodel::pg_catalog.text, p.colocationid,'
            '       pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)'
            ' FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1'
        INTO business_method, business_replication, business_colocation, business_column USING colocate_with;
    IF business_method IS NULL THEN
        RAISE EXCEPTION 'idem_citus_distribute: % is not distributed by Citus', colocate_with
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = pg_catalog.format('Distribute it by its tenant column first: '
                                           'SELECT create_distributed_table(%L, ''<tenant column>'').', colocate_with);
    END IF;
    IF business_method OPERATOR(pg_catalog.<>) 'h' THEN
        RAISE EXCEPTION 'idem_citus_distribute: % is a % table, not distributed by a tenant column', colocate_with,
                        CASE WHEN business_replication OPERATOR(pg_catalog.=) 't' THEN 'reference'
                             WHEN business_colocation OPERATOR(pg_catalog.<>) 0 THEN 'single-shard'
                             ELSE 'Citus local' END
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'Keys are claimed on the one node that holds their tenant''s rows; a reference or local '
                           'table has no such node, and keys beside it would commit apart from it.',
                  HINT = 'Pass a table distributed with create_distributed_table(table, tenant column).';
    END IF;
    SELECT a.atttypid, a.attcollation INTO column_type, column_collation
    FROM pg_catalog.pg_attribute a
    WHERE a.attrelid OPERATOR(pg_catalog.=) colocate_with AND a.attname OPERATOR(pg_catalog.=) business_column;
    SELECT a.attcollation INTO scope_collation
    FROM pg_catalog.pg_attribute a
    WHERE a.attrelid OPERATOR(pg_catalog.=) keys AND a.attname OPERATOR(pg_catalog.=) 'scope';
    IF column_type OPERATOR(pg_catalog.<>) 'pg_catalog.text'::pg_catalog.regtype
       OR column_collation OPERATOR(pg_catalog.<>) scope_collation THEN
        RAISE EXCEPTION 'idem_citus_distribute: %.% is % COLLATE %, but idempotency_keys.scope is text COLLATE "C"',
                        colocate_with, business_column, pg_catalog.format_type(column_type, NULL),
                        coalesce((SELECT pg_catalog.quote_ident(c.collname::text) FROM pg_catalog.pg_collation c
                                  WHERE c.oid OPERATOR(pg_catalog.=) column_collation), 'none')
            USING ERRCODE = 'datatype_mismatch',
                  DETAIL = 'Citus co-locates tables only when their distribution columns have one type and '
                           'collation: the same tenant then hashes to the same shard in both.',
                  HINT = pg_catalog.format('Make the tenant column text COLLATE "C" and pass the tenant as the '
                                           'scope: SELECT undistribute_table(%L); ALTER TABLE %s ALTER COLUMN %I '
                                           'TYPE text COLLATE "C"; SELECT create_distributed_table(%L, %L); then '
                                           'call idem_citus_distribute(%L) again.',
                                           colocate_with, colocate_with, business_column, colocate_with,
                                           business_column, colocate_with);
    END IF;

    EXECUTE 'SELECT p.partmethod::pg_catalog.text, p.colocationid FROM pg_catalog.pg_dist_partition p'
            ' WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1'
        INTO keys_method, keys_colocation USING keys;
    IF keys_method IS NOT NULL AND (keys_method OPERATOR(pg_catalog.<>) 'h'
                                    OR keys_colocation OPERATOR(pg_catalog.<>) business_colocation) THEN
        RAISE EXCEPTION 'idem_citus_distribute: idempotency_keys is already in Citus''s metadata, not co-located with %',
                        colocate_with
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Citus refuses to undistribute a table that an extension owns.',
                  HINT = 'Keep one tenant layout for all business tables, or start from a fresh CREATE EXTENSION idempotency.';
    END IF;

    IF keys_method IS NULL THEN
        -- The strongest lock first: distributing and then truncating the local rows would otherwise upgrade
        -- this transaction's lock while the sweeper upgrades its own (a deadlock, seen in the tests).
        EXECUTE pg_catalog.format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', keys);
        -- Every unscoped key hashes to one shard, so one node takes all of them.
        EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM %s WHERE scope OPERATOR(pg_catalog.=) $1', keys)
            INTO unscoped USING ''::text;
        IF unscoped OPERATOR(pg_catalog.>) 0 THEN
            RAISE WARNING 'idem_citus_distribute: % stored keys have no scope; all unscoped keys land on one shard',
                          unscoped
                USING HINT = 'Pass the tenant (the value of the business table''s distribution column) as scope.';
        END IF;
        EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''scope'', colocate_with => $2)'
            USING keys, colocate_with::text;
        -- The rows were copied into the shards; left in the coordinator's shell they would only mislead.
        EXECUTE 'SELECT pg_catalog.truncate_local_data_after_distributing_table($1)' USING keys;
    END IF;

    -- Every function that takes a scope as input runs on the node of that scope's shard, also inside a
    -- transaction block (force_delegation). Not the ones returning a scope: Citus 14.0.1 crashes a backend that
    -- calls a function force-delegated by an output parameter in a transaction block.
    FOR fn IN
        SELECT p.oid::pg_catalog.regprocedure
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_depend d ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                                   AND d.objid OPERATOR(pg_catalog.=) p.oid
                                   AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                                   AND d.deptype OPERATOR(pg_catalog.=) 'e'
        JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
                                      AND e.extname OPERATOR(pg_catalog.=) 'idempotency'
        WHERE p.proargmodes IS NULL AND 'scope' OPERATOR(pg_catalog.=) ANY (p.proargnames)
        ORDER BY p.proname, p.oid
    LOOP
        EXECUTE 'SELECT pg_catalog.create_distributed_function($1, ''scope'', colocate_with => $2,'
                ' force_delegation => true)'
            USING fn, keys::text;
        delegated := delegated OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN pg_catalog.format('idempotency_keys distributed by scope, co-located with %s; %s functions delegated by scope',
                             colocate_with, delegated);
END
$$;

REVOKE ALL ON FUNCTION @extschema@.idem_citus_distribute(pg_catalog.regclass) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_citus_distribute(pg_catalog.regclass) IS
    'Citus: distributes idempotency_keys by scope, co-located with the given tenant table, and delegates every '
    'function taking a scope to the node of its shard.';

-- The counters of every node (idem_stats is this node's), one row per node as jsonb, on a Citus coordinator.
CREATE OR REPLACE FUNCTION @extschema@.idem_citus_stats(OUT node text, OUT stats jsonb)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s text := (SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
               WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency');
    remote record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'idem_citus_stats: Citus is not installed in this database'
            USING ERRCODE = 'feature_not_supported', HINT = 'Read idem_stats on a single node.';
    END IF;
    FOR remote IN EXECUTE
        'SELECT n.nodename, n.nodeport, r.success, r.result FROM pg_catalog.run_command_on_all_nodes($1) r'
        ' JOIN pg_catalog.pg_dist_node n ON n.nodeid OPERATOR(pg_catalog.=) r.nodeid ORDER BY n.groupid'
        USING pg_catalog.format('SELECT pg_catalog.row_to_json(t) FROM %s.idem_stats t', s)
    LOOP
        node := pg_catalog.format('%s:%s', remote.nodename, remote.nodeport);
        stats := CASE WHEN remote.success THEN remote.result::jsonb
                      ELSE pg_catalog.jsonb_build_object('error', remote.result) END;
        RETURN NEXT;
    END LOOP;
END
$$;

COMMENT ON FUNCTION @extschema@.idem_citus_stats() IS
    'Citus: idem_stats of every node of the cluster, one jsonb row per node.';

-- Fencing numbers across a shard move. A lease's fencing number comes from the sequence of the node that holds its
-- scope's shard; a shard moved to another node continues from that node's sequence, which may be behind. Called on
-- the coordinator before each move, this puts the target node's sequence a billion past the largest value on any
-- node: the source would have to grant that many leases during the move for a number to go backwards. Only ever
-- forward (setval to a lower value would hand out numbers twice); returns the target's value afterwards.
CREATE OR REPLACE FUNCTION @extschema@.idem_citus_fencing_before_move(target_node_name text, target_node_port integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s text := (SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
               WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency');
    seq text;
    failed text;
    highest bigint;
    result text;
    ok boolean;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'idem_citus_fencing_before_move: Citus is not installed in this database'
            USING ERRCODE = 'feature_not_supported';
    END IF;
    EXECUTE 'SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_dist_node WHERE nodename OPERATOR(pg_catalog.=) $1'
            ' AND nodeport OPERATOR(pg_catalog.=) $2 AND isactive)'
        INTO ok USING target_node_name, target_node_port;
    IF ok THEN
        RAISE EXCEPTION 'idem_citus_fencing_before_move: %:% is not an active node of this cluster',
                        target_node_name, target_node_port
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the target node of citus_move_shard_placement as it is in pg_dist_node.';
    END IF;
    seq := pg_catalog.format('%s.idempotency_fencing_numbers', s);
    EXECUTE 'SELECT pg_catalog.max(r.result::bigint), pg_catalog.string_agg(r.result, ''; '') FILTER (WHERE NOT r.success)'
            ' FROM pg_catalog.run_command_on_all_nodes($1) r'
        INTO highest, failed
        USING pg_catalog.format('SELECT last_value FROM %s', seq);
    IF failed IS NOT NULL THEN
        RAISE EXCEPTION 'idem_citus_fencing_before_move: reading the fencing numbers of every node failed: %', failed
            USING ERRCODE = 'connection_failure';
    END IF;
    highest := highest OPERATOR(pg_catalog.+) 1000000000;
    EXECUTE 'SELECT r.success, r.result FROM pg_catalog.master_run_on_worker(ARRAY[$1], ARRAY[$2], ARRAY[$3], false) r'
        INTO ok, result
        USING target_node_name, target_node_port,
              pg_catalog.format('SELECT COALESCE((SELECT pg_catalog.setval(%L, %s) FROM %s'
                                ' WHERE last_value OPERATOR(pg_catalog.<) %s), (SELECT last_value FROM %s))',
                                seq, highest, seq, highest, seq);
    IF NOT ok THEN
        RAISE EXCEPTION 'idem_citus_fencing_before_move: advancing the fencing numbers of %:% failed: %',
                        target_node_name, target_node_port, result
            USING ERRCODE = 'connection_failure';
    END IF;
    RETURN result::bigint;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.idem_citus_fencing_before_move(text, integer) FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_citus_fencing_before_move(text, integer) IS
    'Citus: before citus_move_shard_placement to this node, puts its fencing numbers past those of every node, so a '
    'moved lease''s numbers keep increasing.';
