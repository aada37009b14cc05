-- idempotency 1.3 -> 1.4: hardening 3, partitioned storage at table speed, tombstones and the 1.4 features.
-- The Makefile appends extension/functions.sql and extension/citus.sql (the SQL-language functions, as the
-- install script defines them), so an updated database and a fresh install define them from the same text.
-- Nothing here drops a view, function, table, type or sequence a user may have granted on or built on
-- (extension/README.md, "What an update step may not do"; test/tap/176_update_keeps_grants.pl checks it).
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.4'" to load this file. \quit

-- Fencing numbers that rise per key wherever the database moves (issue 38): each key's row keeps the number of
-- its last grant, so a grant on another server (logical replication, a restored dump, a shard move) hands a
-- higher one even though the sequence did not travel. Added to the twin too: idem_set_storage copies rows with
-- SELECT *, so both tables keep one column order.
ALTER TABLE @extschema@.idempotency_keys ADD COLUMN fencing_number bigint;
ALTER TABLE @extschema@.idempotency_keys_partitioned ADD COLUMN fencing_number bigint;
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
