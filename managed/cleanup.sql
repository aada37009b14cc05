-- The managed edition: expiry (src/cleanup.c). One batch deletes at most cleanup_batch_size expired keys from a
-- range of at most that many heap pages (a TID range scan that carries on where the last batch stopped, so a
-- sweep reads every page once); it waits at most 20 ms for a row a transaction is replacing right now and then
-- passes locked rows by (SKIP LOCKED), so the sweep gives way, never the request. A table locked by another
-- session for 200 ms ends the sweep with 55P03. idem_cleanup() runs every batch in the caller's transaction, as in
-- the C edition; the procedure idem_managed_sweep() commits after each batch and paces them
-- (idempotency.cleanup_keys_per_second), as the background worker does: what pg_cron runs.
-- In partitioned storage the sweep first makes partitions ahead and drops the expired ones (partitions.sql), then
-- deletes from the default partition. 1.4: with idempotency.tombstone_ttl above 0 the expired completed rows a batch
-- deletes become tombstones in the same statement (a partition's, before its drop); after the keys the sweep
-- deletes the tombstones past the ttl (all of them once it is 0) by the same batches and pace
-- (managed/tombstones.sql).

CREATE FUNCTION @extschema@.idem_managed_cleanup_batch(
    batch_size integer, from_tid tid, tombstones boolean,
    OUT removed bigint, OUT next_tid tid, OUT finished boolean, OUT pages bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '200ms'
AS $$
DECLARE
    -- The table by its name of now: a renamed one is 42P01 with the C edition's message.
    relation_name text := CASE WHEN tombstones THEN 'idempotency_tombstones'
                               WHEN @extschema@.idem_managed_partitioned()
                               THEN 'idempotency_keys_partitioned_default' ELSE 'idempotency_keys' END;
    relation regclass := pg_catalog.to_regclass('@extschema@.' OPERATOR(pg_catalog.||) relation_name);
    -- 1.4: NULL while tombstones are off (refusing a bad idempotency.tombstone_ttl).
    tombstone_since timestamptz := @extschema@.idem_managed_tombstone_since();
    cutoff timestamptz := pg_catalog.now();
    buried text := '';
    blocks bigint;
    from_block bigint := (pg_catalog.ltrim(pg_catalog.split_part(from_tid::pg_catalog.text, ',', 1), '('))::pg_catalog.int8;
    to_block bigint;
    to_tid tid;
    selected bigint;
    last_tid tid;
    column_name text := 'expires_at';
    statement text := 'WITH batch AS MATERIALIZED (SELECT ctid FROM %1$s'
        ' WHERE ctid OPERATOR(pg_catalog.>=) $3 AND ctid OPERATOR(pg_catalog.<) $4'
        ' AND %3$s OPERATOR(pg_catalog.<=) $1 LIMIT $2%2$s),'
        ' gone AS (DELETE FROM %1$s WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM batch))'
        ' AND %3$s OPERATOR(pg_catalog.<=) $1 RETURNING %4$s)%5$s'
        ' SELECT (SELECT pg_catalog.count(*) FROM batch), (SELECT pg_catalog.max(ctid) FROM batch),'
        ' (SELECT pg_catalog.count(*) FROM gone)';
BEGIN
    IF tombstones THEN
        -- Tombstones go idempotency.tombstone_ttl after their key expired (all of them once it is 0).
        column_name := 'expired_at';
        cutoff := COALESCE(tombstone_since, pg_catalog.now());
    ELSIF tombstone_since IS NOT NULL THEN
        -- The rows a key batch deletes that were completed (a status: not a lease that ran out) and expired
        -- after $5 become tombstones in the same statement, so no snapshot sees the key with neither.
        buried := ', buried AS (INSERT INTO @extschema@.idempotency_tombstones (expired_at, scope, key, request_hash)'
            ' SELECT expires_at, scope, key, request_hash FROM gone WHERE http_status IS NOT NULL'
            ' AND expires_at OPERATOR(pg_catalog.>) $5 ON CONFLICT DO NOTHING)';
    END IF;
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        RAISE EXCEPTION 'cannot execute idem_cleanup() in a read-only transaction'
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    IF relation IS NULL THEN
        RAISE EXCEPTION 'idempotency: table %.% is missing from the extension''s schema', '@extschema@', relation_name
            USING ERRCODE = 'undefined_table',
                  HINT = 'Run ALTER EXTENSION idempotency UPDATE, or restore the table''s name.';
    END IF;
    -- The lock the DELETE takes anyway, waited for at most 200 ms (this function's lock_timeout).
    BEGIN
        EXECUTE pg_catalog.format('LOCK TABLE %s IN ROW EXCLUSIVE MODE', relation);
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'idempotency: a key table is locked by another session'
            USING ERRCODE = 'lock_not_available',
                  HINT = 'idem_cleanup() waits at most 200 ms for it; try again later.';
    END;
    blocks := pg_catalog.pg_relation_size(relation) OPERATOR(pg_catalog./)
              pg_catalog.current_setting('block_size')::pg_catalog.int8;
    to_block := from_block OPERATOR(pg_catalog.+) batch_size;
    to_tid := pg_catalog.format('(%s,1)', to_block)::pg_catalog.tid;
    PERFORM pg_catalog.set_config('lock_timeout', '20ms', true);
    BEGIN
        EXECUTE pg_catalog.format(statement, relation, '', column_name,
                                  CASE WHEN buried OPERATOR(pg_catalog.=) '' THEN '1'
                                       ELSE 'expires_at, scope, key, request_hash, http_status' END, buried)
            INTO selected, last_tid, removed USING cutoff, batch_size, from_tid, to_tid, tombstone_since;
    EXCEPTION WHEN lock_not_available THEN
        EXECUTE pg_catalog.format(statement, relation, ' FOR UPDATE SKIP LOCKED', column_name,
                                  CASE WHEN buried OPERATOR(pg_catalog.=) '' THEN '1'
                                       ELSE 'expires_at, scope, key, request_hash, http_status' END, buried)
            INTO selected, last_tid, removed USING cutoff, batch_size, from_tid, to_tid, tombstone_since;
    END;
    IF selected OPERATOR(pg_catalog.=) batch_size THEN
        -- Stopped inside the range: go on right after the last row taken.
        next_tid := pg_catalog.format('(%s,%s)',
                        pg_catalog.ltrim(pg_catalog.split_part(last_tid::pg_catalog.text, ',', 1), '('),
                        pg_catalog.rtrim(pg_catalog.split_part(last_tid::pg_catalog.text, ',', 2), ')')::pg_catalog.int4
                        OPERATOR(pg_catalog.+) 1)::pg_catalog.tid;
        pages := (pg_catalog.ltrim(pg_catalog.split_part(last_tid::pg_catalog.text, ',', 1), '('))::pg_catalog.int8
                 OPERATOR(pg_catalog.-) from_block OPERATOR(pg_catalog.+) 1;
        finished := false;
    ELSE
        next_tid := to_tid;
        pages := batch_size;
        finished := to_block OPERATOR(pg_catalog.>=) blocks;
    END IF;
END
$$;

CREATE FUNCTION @extschema@.idem_managed_cleanup_batch_size()
RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN GREATEST(1, LEAST(10000000, COALESCE(NULLIF(pg_catalog.btrim(
    pg_catalog.current_setting('idempotency.cleanup_batch_size', true)), ''), '200')::pg_catalog.int4));

-- One sweep in the caller's transaction, every batch, unpaced (the C edition's idem_cleanup()).
CREATE FUNCTION @extschema@.idem_cleanup()
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    batch record;
    position tid := '(0,1)';
    total bigint := 0;
    size integer := @extschema@.idem_managed_cleanup_batch_size();
    tombstones boolean := false;
BEGIN
    -- The keys, then (1.4) the tombstones past idempotency.tombstone_ttl, counted with them.
    LOOP
        batch := @extschema@.idem_managed_cleanup_batch(size, position, tombstones);
        total := total OPERATOR(pg_catalog.+) batch.removed;
        position := batch.next_tid;
        IF batch.finished THEN
            EXIT WHEN tombstones OR NOT @extschema@.idem_managed_tombstones_swept();
            tombstones := true;
            position := '(0,1)';
        END IF;
    END LOOP;
    -- Then expired partitions dropped, last, as the C edition's idem_cleanup() does: a drop's lock on the parent
    -- holds partitioned claims until the caller's transaction ends (the pg_cron sweep drops one per transaction).
    IF @extschema@.idem_managed_partitioned() THEN
        total := total OPERATOR(pg_catalog.+) (@extschema@.idem_managed_drop_expired(0)).keys_removed;
    END IF;
    RETURN total;
END
$$;

-- The sweep pg_cron runs: one batch per transaction, paced at idempotency.cleanup_keys_per_second (2000 by
-- default; 0: unpaced), a batch counting its deleted keys or its scanned pages, whichever is more. Call it as the
-- owner of the key table, outside a transaction block:
--   SELECT cron.schedule('idempotency-expiry', '* * * * *', 'CALL idem_managed_sweep()');
-- A procedure that commits cannot have a SET clause: it names everything through pg_catalog and the schema, and
-- its batches run in idem_managed_cleanup_batch, whose search_path is fixed.
CREATE PROCEDURE @extschema@.idem_managed_sweep()
LANGUAGE plpgsql
AS $$
DECLARE
    -- Types named through pg_catalog too: the caller's search_path would find a type of another schema first.
    batch pg_catalog.record;
    position pg_catalog.tid := '(0,1)';
    size pg_catalog.int4 := @extschema@.idem_managed_cleanup_batch_size();
    tombstones pg_catalog.bool := false;
    -- No SET search_path here (the procedure commits), so no operator is left to the caller's: NULLIF would look
    -- its = up there (sql/attack.sql).
    pace_setting pg_catalog.text := pg_catalog.btrim(
        pg_catalog.current_setting('idempotency.cleanup_keys_per_second', true));
    pace pg_catalog.int4 := CASE WHEN pace_setting IS NULL OR pace_setting OPERATOR(pg_catalog.=) '' THEN 2000
                                 ELSE pace_setting::pg_catalog.int4 END;
    upkeep pg_catalog.record;
BEGIN
    -- Partitioned storage's upkeep first, as the worker does: partitions made ahead (in their own transaction),
    -- then expired partitions dropped one per transaction (a drop's locks last until it commits); a partition
    -- that cannot be made or dropped now is logged and left for the next sweep. Nothing in table storage.
    IF @extschema@.idem_managed_partitioned() THEN
        PERFORM @extschema@.idem_premake_partitions();
        COMMIT;
        LOOP
            upkeep := @extschema@.idem_managed_drop_expired(1);
            COMMIT;
            EXIT WHEN NOT upkeep.more;
        END LOOP;
    END IF;
    -- The keys, then (1.4) the tombstones past idempotency.tombstone_ttl, paced alike.
    LOOP
        batch := @extschema@.idem_managed_cleanup_batch(size, position, tombstones);
        position := batch.next_tid;
        COMMIT;
        IF batch.finished THEN
            EXIT WHEN tombstones OR NOT @extschema@.idem_managed_tombstones_swept();
            tombstones := true;
            position := '(0,1)';
        END IF;
        IF pace OPERATOR(pg_catalog.>) 0 THEN
            PERFORM pg_catalog.pg_sleep(GREATEST(batch.removed, batch.pages)::pg_catalog.float8
                                        OPERATOR(pg_catalog./) pace);
        END IF;
    END LOOP;
END
$$;

REVOKE ALL ON PROCEDURE @extschema@.idem_managed_sweep() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_managed_cleanup_batch(integer, tid, boolean) FROM PUBLIC;
