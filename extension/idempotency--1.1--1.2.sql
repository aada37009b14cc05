-- idempotency 1.1 -> 1.2: fencing numbers, nothing bound by name at call time, limits enforced.
-- The Makefile appends extension/functions.sql (the SQL-language functions, as the install script defines them).
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.2'" to load this file. \quit

-- The partitioned twin's lease columns get the comments a fresh install copies from idempotency_keys.
COMMENT ON COLUMN @extschema@.idempotency_keys_partitioned.lease_until IS
    'Lease mode: the lease runs until then; afterwards the next claim takes the key over. NULL for a completed key.';
COMMENT ON COLUMN @extschema@.idempotency_keys_partitioned.lease_token IS
    'Lease mode: fencing token of the current holder; only it may extend, checkpoint, complete or release.';
COMMENT ON COLUMN @extschema@.idempotency_keys_partitioned.recovery_point IS
    'Lease mode: the last step the holder recorded with idem_checkpoint; a takeover resumes there.';
COMMENT ON COLUMN @extschema@.idempotency_keys_partitioned.recovery_state IS
    'Lease mode: the state recorded with the recovery point (for example the external charge id).';

-- Fencing numbers: see the install script.
ALTER TYPE @extschema@.idem_lease_result ADD ATTRIBUTE fencing_number bigint;
CREATE SEQUENCE @extschema@.idempotency_fencing_numbers AS bigint;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_fencing_numbers', '');
REVOKE ALL ON SEQUENCE @extschema@.idempotency_fencing_numbers FROM PUBLIC;
COMMENT ON SEQUENCE @extschema@.idempotency_fencing_numbers IS
    'Fencing numbers of idem_lease grants; read only by the extension''s C code.';

-- idem_hash(jsonb, text[]) moves into C: its PL/pgSQL body called idem_hash(jsonb) by name.
CREATE OR REPLACE FUNCTION @extschema@.idem_hash(payload jsonb, exclude text[])
RETURNS text
AS 'MODULE_PATHNAME', 'idem_hash_jsonb_exclude'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- The counters are for operators: the owner, pg_monitor, and whoever they grant both to.
REVOKE ALL ON FUNCTION @extschema@.idem_stats_read() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_read() TO pg_monitor;
GRANT SELECT ON @extschema@.idem_stats TO pg_monitor;
