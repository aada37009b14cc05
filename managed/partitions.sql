-- The managed edition: partitioned storage (src/partitions.c). idem_partitions(), which idem_storage_mode() reads:
-- the range partitions of idempotency_keys_partitioned, lowest first, with their bounds read back from the
-- catalog's text of them under this function's own DateStyle and TimeZone (fixed below), so the same values under
-- every session's settings. Then making them ahead, dropping the expired ones, and switching the storage mode,
-- as the C edition does; the pg_cron sweep (cleanup.sql) calls the upkeep as the background worker does.
-- A SQL-standard body, bound when created, as every SQL function of the C edition (pgTAP api_contract).
CREATE FUNCTION @extschema@.idem_partitions(
    OUT partition_name name, OUT lower_bound timestamptz, OUT upper_bound timestamptz)
RETURNS SETOF record
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET DateStyle = 'ISO, YMD'
SET TimeZone = 'UTC'
SET IntervalStyle = 'postgres'
BEGIN ATOMIC
    SELECT b.relname, b.bounds[1]::pg_catalog.timestamptz, b.bounds[2]::pg_catalog.timestamptz
    FROM (SELECT c.relname,
                 pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                                         E'^FOR VALUES FROM \\(''([^'']+)''\\) TO \\(''([^'']+)''\\)$') AS bounds
          FROM pg_catalog.pg_inherits i
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
          WHERE i.inhparent OPERATOR(pg_catalog.=) '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass
            AND NOT i.inhdetachpending) b
    WHERE b.bounds IS NOT NULL
    ORDER BY 2;
END;

-- The C edition's idem_create_partition (PL/pgSQL there too) finds its schema through pg_extension, which the
-- plain script does not have: the same function, naming @extschema@.
CREATE FUNCTION @extschema@.idem_create_partition(lower_bound timestamptz, upper_bound timestamptz)
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
    schema_oid oid := '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid;
    s text := (SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_namespace n
               WHERE n.oid OPERATOR(pg_catalog.=) schema_oid);
    parent oid := '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass::pg_catalog.oid;
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
    -- Claims read the default partition; attaching locks it ACCESS EXCLUSIVE. Take that lock first, waiting at
    -- most idempotency.partition_lock_timeout, so that no claim still in flight can add a row to the range
    -- between the move and the attach.
    PERFORM pg_catalog.set_config('lock_timeout', @extschema@.idem_managed_partition_lock_timeout(), true);
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

-- idempotency.partition_lock_timeout (100ms by default), the lock_timeout of each partition step.
CREATE FUNCTION @extschema@.idem_managed_partition_lock_timeout()
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN COALESCE(NULLIF(pg_catalog.btrim(
    pg_catalog.current_setting('idempotency.partition_lock_timeout', true)), ''), '100ms');

-- Whether the storage mode is partitioned: idempotency_keys_partitioned has a partition beside its default one.
CREATE FUNCTION @extschema@.idem_managed_partitioned()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN EXISTS (SELECT FROM pg_catalog.pg_inherits i
               WHERE i.inhparent OPERATOR(pg_catalog.=) '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass
                 AND NOT i.inhdetachpending
                 AND i.inhrelid OPERATOR(pg_catalog.<>)
                     '@extschema@.idempotency_keys_partitioned_default'::pg_catalog.regclass);

-- idempotency.ttl as an interval for the partitions' horizon (1 day when unset), as the C edition reads it.
CREATE FUNCTION @extschema@.idem_managed_partition_ttl()
RETURNS interval
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET IntervalStyle = 'postgres'
RETURN COALESCE(NULLIF(pg_catalog.btrim(pg_catalog.current_setting('idempotency.ttl', true)), ''),
                '1d')::pg_catalog.interval;

-- Partitions ahead of time (src/partitions.c, partitions_premake): from the newest partition's upper bound (or
-- the current partition's start, after a long pause) up to now() + idempotency.ttl + two partitions, each of the
-- newest partition's width. Each is made in a subtransaction whose lock_timeout is
-- idempotency.partition_lock_timeout, tried again after a pause (20 ms times the try) while the default
-- partition is busy, up to 10 tries; still busy, or failing otherwise: logged, left for the next sweep.
CREATE FUNCTION @extschema@.idem_premake_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = 0
SET DateStyle = 'ISO, YMD'
SET IntervalStyle = 'postgres'
SET TimeZone = 'UTC'
AS $$
DECLARE
    newest record;
    width interval;
    lower_b timestamptz;
    horizon timestamptz;
    created integer := 0;
    tries integer;
    done boolean;
BEGIN
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        RAISE EXCEPTION 'cannot execute idem_premake_partitions() in a read-only transaction'
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    -- The newest partition is never dropped, so its width is always known; none: table storage.
    SELECT p.lower_bound, p.upper_bound INTO newest
    FROM @extschema@.idem_partitions() p ORDER BY p.upper_bound DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    width := newest.upper_bound OPERATOR(pg_catalog.-) newest.lower_bound;
    IF width OPERATOR(pg_catalog.<=) interval '0' THEN
        RETURN 0;
    END IF;
    -- No claim can expire in the past: after a long pause, start again at the current partition.
    lower_b := GREATEST(newest.upper_bound,
                        pg_catalog.date_bin(width, pg_catalog.now(), timestamptz '2000-01-01 00:00:00+00'));
    horizon := pg_catalog.now() OPERATOR(pg_catalog.+) @extschema@.idem_managed_partition_ttl()
               OPERATOR(pg_catalog.+) (width OPERATOR(pg_catalog.*) 2);
    WHILE lower_b OPERATOR(pg_catalog.<) horizon LOOP
        done := false;
        tries := 1;
        LOOP
            BEGIN
                PERFORM @extschema@.idem_create_partition(lower_b, lower_b OPERATOR(pg_catalog.+) width);
                done := true;
            EXCEPTION
                WHEN lock_not_available THEN
                    IF tries OPERATOR(pg_catalog.>=) 10 THEN
                        -- Claims in flight held the default partition at every try.
                        RAISE LOG 'idempotency: the default partition was busy at each of % tries; making partitions at the next sweep', tries;
                        RETURN created;
                    END IF;
                WHEN OTHERS THEN
                    RAISE LOG 'idempotency: could not make the partition from %: % (SQLSTATE %); trying again at the next sweep',
                        lower_b, SQLERRM, SQLSTATE;
                    RETURN created;
            END;
            EXIT WHEN done;
            PERFORM pg_catalog.pg_sleep(tries OPERATOR(pg_catalog.*) 0.02);
            tries := tries OPERATOR(pg_catalog.+) 1;
        END LOOP;
        lower_b := lower_b OPERATOR(pg_catalog.+) width;
        created := created OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN created;
END
$$;

-- One step of a partition's drop, in the caller's subtransaction: 'count' counts its rows (under ACCESS SHARE on
-- the partition alone, which no claim waits for; the rows expired before the transaction began and no claim
-- writes an expired row, so the count stays true until the drop); 'drop' locks the parent and then the partition
-- (DROP TABLE's order) and drops it. Either answers NULL when it is no longer a partition of ours. Its
-- lock_timeout is idempotency.partition_lock_timeout.
CREATE FUNCTION @extschema@.idem_managed_partition_step(step text, partition oid)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    parent oid := '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass::pg_catalog.oid;
    keys bigint;
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', @extschema@.idem_managed_partition_lock_timeout(), true);
    IF step OPERATOR(pg_catalog.=) 'drop' THEN
        EXECUTE pg_catalog.format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', parent::pg_catalog.regclass);
    END IF;
    -- Its name of now (the regclass prints it qualified: search_path is pg_catalog alone).
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_inherits i
                   WHERE i.inhrelid OPERATOR(pg_catalog.=) partition AND i.inhparent OPERATOR(pg_catalog.=) parent) THEN
        RETURN NULL;
    END IF;
    IF step OPERATOR(pg_catalog.=) 'drop' THEN
        EXECUTE pg_catalog.format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', partition::pg_catalog.regclass);
        EXECUTE pg_catalog.format('DROP TABLE %s', partition::pg_catalog.regclass);
        RETURN 0;
    END IF;
    EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM ONLY %s', partition::pg_catalog.regclass) INTO keys;
    -- 1.4: with tombstones on, its expired completed keys become tombstones before the drop takes the parent.
    PERFORM @extschema@.idem_managed_bury_partition(partition::pg_catalog.regclass);
    RETURN keys;
END
$$;

-- Runs a step, again after a pause (20 ms times the try) while it fails for want of a lock, at most 10 tries;
-- NULL (logged) when it could not, or when the partition is gone.
CREATE FUNCTION @extschema@.idem_managed_partition_step_retrying(step text, partition oid, partition_name name)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tries integer := 1;
    answer bigint;
BEGIN
    LOOP
        BEGIN
            answer := @extschema@.idem_managed_partition_step(step, partition);
            RETURN answer;
        EXCEPTION
            WHEN lock_not_available THEN
                IF tries OPERATOR(pg_catalog.>=) 10 THEN
                    RAISE LOG 'idempotency: partition % was busy at each of % tries; dropping it at the next sweep',
                        partition_name, tries;
                    RETURN NULL;
                END IF;
            WHEN OTHERS THEN
                RAISE LOG 'idempotency: could not % partition %: % (SQLSTATE %); dropping it at the next sweep',
                    step, partition_name, SQLERRM, SQLSTATE;
                RETURN NULL;
        END;
        PERFORM pg_catalog.pg_sleep(tries OPERATOR(pg_catalog.*) 0.02);
        tries := tries OPERATOR(pg_catalog.+) 1;
    END LOOP;
END
$$;

-- Drops expired partitions (src/partitions.c, partitions_drop_expired): every partition whose upper bound is at
-- or before the transaction's start, but the newest (it carries the width for the next ones). With limit 0 every
-- one is counted before the first drop (a drop's locks are the transaction's until it ends, and the parent's
-- holds every claim); with a limit (the sweep: 1 a transaction), each just before its drop, and more says
-- whether expired partitions are left.
CREATE FUNCTION @extschema@.idem_managed_drop_expired(lim integer,
    OUT partitions_dropped integer, OUT keys_removed bigint, OUT more boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = 0
SET DateStyle = 'ISO, YMD'
SET IntervalStyle = 'postgres'
SET TimeZone = 'UTC'
AS $$
DECLARE
    expired record;
    oids oid[] := '{}';
    names name[] := '{}';
    counts bigint[] := '{}';
    i integer;
    n integer;
BEGIN
    partitions_dropped := 0;
    keys_removed := 0;
    more := false;
    FOR expired IN
        SELECT c.oid, p.partition_name
        FROM @extschema@.idem_partitions() p
        JOIN pg_catalog.pg_class c ON c.relname OPERATOR(pg_catalog.=) p.partition_name
                                  AND c.relnamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace
        WHERE p.upper_bound OPERATOR(pg_catalog.<=) pg_catalog.now()
          AND p.upper_bound OPERATOR(pg_catalog.<) (SELECT pg_catalog.max(q.upper_bound)
                                                    FROM @extschema@.idem_partitions() q)
        ORDER BY p.lower_bound
    LOOP
        oids := oids OPERATOR(pg_catalog.||) expired.oid;
        names := names OPERATOR(pg_catalog.||) expired.partition_name;
        counts := counts OPERATOR(pg_catalog.||) NULL::bigint;
    END LOOP;
    n := pg_catalog.cardinality(oids);
    IF lim OPERATOR(pg_catalog.<=) 0 THEN
        FOR i IN 1 .. n LOOP
            counts[i] := @extschema@.idem_managed_partition_step_retrying('count', oids[i], names[i]);
        END LOOP;
    END IF;
    FOR i IN 1 .. n LOOP
        IF lim OPERATOR(pg_catalog.>) 0 AND partitions_dropped OPERATOR(pg_catalog.>=) lim THEN
            more := true;
            EXIT;
        END IF;
        IF lim OPERATOR(pg_catalog.>) 0 THEN
            counts[i] := @extschema@.idem_managed_partition_step_retrying('count', oids[i], names[i]);
        END IF;
        CONTINUE WHEN counts[i] IS NULL;
        IF @extschema@.idem_managed_partition_step_retrying('drop', oids[i], names[i]) IS NOT NULL THEN
            partitions_dropped := partitions_dropped OPERATOR(pg_catalog.+) 1;
            keys_removed := keys_removed OPERATOR(pg_catalog.+) counts[i];
        END IF;
    END LOOP;
END
$$;

-- The C edition's idem_drop_expired_partitions(): every expired partition counted, then dropped, in the caller's
-- transaction (call it alone in one: the drops' locks last until it ends).
CREATE FUNCTION @extschema@.idem_drop_expired_partitions(OUT partitions_dropped integer, OUT keys_removed bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    IF pg_catalog.current_setting('transaction_read_only')::pg_catalog.bool THEN
        RAISE EXCEPTION 'cannot execute idem_drop_expired_partitions() in a read-only transaction'
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    partitions_dropped := 0;
    keys_removed := 0;
    IF NOT @extschema@.idem_managed_partitioned() THEN
        RETURN;
    END IF;
    r := @extschema@.idem_managed_drop_expired(0);
    partitions_dropped := r.partitions_dropped;
    keys_removed := r.keys_removed;
END
$$;

-- Switches the storage mode, moving every live key (src/partitions.c, idem_set_storage): the same checks,
-- SQLSTATEs, messages and answers.
CREATE FUNCTION @extschema@.idem_set_storage(mode text, partition_interval interval DEFAULT interval '1 day')
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET DateStyle = 'ISO, YMD'
SET TimeZone = 'UTC'
AS $$
DECLARE
    ttl_setting text := COALESCE(pg_catalog.current_setting('idempotency.ttl', true), '1d');
    ttl interval;
    partitioned boolean;
    existing record;
    have_last boolean;
    last_upper timestamptz;
    lower_b timestamptz;
    upper_b timestamptz;
    horizon timestamptz;
    moved bigint := 0;
    already boolean := false;
BEGIN
    ttl := ttl_setting::pg_catalog.interval;
    IF mode IS NULL OR partition_interval IS NULL THEN
        RAISE EXCEPTION 'idem_set_storage: mode and partition_interval must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF mode OPERATOR(pg_catalog.<>) 'table' AND mode OPERATOR(pg_catalog.<>) 'partitioned' THEN
        RAISE EXCEPTION 'idem_set_storage: unknown storage mode "%"', mode
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''table'' or ''partitioned''.';
    END IF;
    partitioned := mode OPERATOR(pg_catalog.=) 'partitioned';
    IF partition_interval OPERATOR(pg_catalog.<) interval '1 minute'
       OR pg_catalog.date_part('year', partition_interval) OPERATOR(pg_catalog.<>) 0
       OR pg_catalog.date_part('month', partition_interval) OPERATOR(pg_catalog.<>) 0 THEN
        RAISE EXCEPTION 'idem_set_storage: partition_interval must be at least 1 minute and have no months or years'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The move reads with a snapshot taken after the locks are granted; a transaction snapshot taken before them
    -- would miss keys completed while waiting, and TRUNCATE would lose them.
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION 'idem_set_storage must run in a READ COMMITTED transaction'
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    -- Every claim reads every partition (the key does not tell which): keep them few.
    IF partitioned AND (ttl OPERATOR(pg_catalog.+) partition_interval OPERATOR(pg_catalog.*) 2)
                       OPERATOR(pg_catalog./) 64 OPERATOR(pg_catalog.>) partition_interval THEN
        RAISE EXCEPTION 'idem_set_storage: partition_interval % is too small for idempotency.ttl %',
            partition_interval, ttl_setting
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'At most 64 partitions may cover idempotency.ttl plus two partitions.';
    END IF;
    -- A distributed key table (idem_citus_distribute) has one layout: hash shards by scope.
    IF partitioned AND EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p'
                ' WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1)'
            INTO already USING '@extschema@.idempotency_keys'::pg_catalog.regclass;
        IF already THEN
            RAISE EXCEPTION 'idem_set_storage: partitioned storage is not supported for keys distributed by Citus'
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Citus shards idempotency_keys by scope; expired keys are swept shard by shard.';
        END IF;
    END IF;

    -- idempotency_keys first: claims and lease changes read the storage mode once their statement on that table
    -- holds its lock (managed/claim.sql), so one that waited for the switch reads the new mode.
    LOCK TABLE @extschema@.idempotency_keys IN ACCESS EXCLUSIVE MODE;
    LOCK TABLE @extschema@.idempotency_keys_partitioned IN ACCESS EXCLUSIVE MODE;

    -- Tenants separated by row level security on one table must stay separated on the other.
    IF EXISTS (
        SELECT FROM pg_catalog.pg_class source, pg_catalog.pg_class target
        WHERE source.oid OPERATOR(pg_catalog.=) (CASE WHEN partitioned
                  THEN '@extschema@.idempotency_keys'::pg_catalog.regclass
                  ELSE '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass END)
          AND target.oid OPERATOR(pg_catalog.=) (CASE WHEN partitioned
                  THEN '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass
                  ELSE '@extschema@.idempotency_keys'::pg_catalog.regclass END)
          AND ((source.relrowsecurity AND NOT target.relrowsecurity)
               OR (source.relforcerowsecurity AND NOT target.relforcerowsecurity)
               OR (SELECT pg_catalog.count(*) FROM pg_catalog.pg_policy p
                   WHERE p.polrelid OPERATOR(pg_catalog.=) source.oid)
                  OPERATOR(pg_catalog.>)
                  (SELECT pg_catalog.count(*) FROM pg_catalog.pg_policy p
                   WHERE p.polrelid OPERATOR(pg_catalog.=) target.oid))) THEN
        RAISE EXCEPTION 'idem_set_storage: row level security on the current table is missing on the other one'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Enable (and force) row level security and create the same policies on both '
                         'idempotency_keys and idempotency_keys_partitioned, then switch.';
    END IF;

    SELECT pg_catalog.max(p.upper_bound), pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 INTO last_upper, have_last
    FROM @extschema@.idem_partitions() p;
    already := false;
    IF partitioned THEN
        -- Partitions of the new width from the current one (or after the last existing one) onwards.
        lower_b := CASE WHEN have_last THEN last_upper
                        ELSE pg_catalog.date_bin(partition_interval, pg_catalog.now(),
                                                 timestamptz '2000-01-01 00:00:00+00') END;
        horizon := pg_catalog.now() OPERATOR(pg_catalog.+) ttl
                   OPERATOR(pg_catalog.+) (partition_interval OPERATOR(pg_catalog.*) 2);
        LOOP
            upper_b := lower_b OPERATOR(pg_catalog.+) partition_interval;
            PERFORM @extschema@.idem_create_partition(lower_b, upper_b);
            lower_b := upper_b;
            EXIT WHEN lower_b OPERATOR(pg_catalog.>=) horizon;
        END LOOP;
        IF have_last THEN
            already := true;
        ELSE
            INSERT INTO @extschema@.idempotency_keys_partitioned
            SELECT * FROM @extschema@.idempotency_keys k WHERE k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now();
            GET DIAGNOSTICS moved = ROW_COUNT;
            TRUNCATE @extschema@.idempotency_keys;
        END IF;
    ELSIF NOT have_last THEN
        already := true;
    ELSE
        INSERT INTO @extschema@.idempotency_keys
        SELECT * FROM @extschema@.idempotency_keys_partitioned k WHERE k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now();
        GET DIAGNOSTICS moved = ROW_COUNT;
        FOR existing IN SELECT p.partition_name FROM @extschema@.idem_partitions() p LOOP
            EXECUTE pg_catalog.format('DROP TABLE @extschema@.%I', existing.partition_name);
        END LOOP;
        TRUNCATE @extschema@.idempotency_keys_partitioned_default;
    END IF;

    IF partitioned AND already THEN
        RETURN pg_catalog.format('partitioned: new partitions of %s', partition_interval);
    ELSIF partitioned THEN
        RETURN pg_catalog.format('partitioned: %s live keys moved, partitions of %s', moved, partition_interval);
    ELSIF already THEN
        RETURN 'table: already';
    END IF;
    RETURN pg_catalog.format('table: %s live keys moved', moved);
END
$$;

-- The upkeep's steps are the table owner's (the sweep's), as idem_premake_partitions and
-- idem_drop_expired_partitions are: nobody else needs them (and their statements check the caller's rights anyway).
REVOKE ALL ON FUNCTION @extschema@.idem_managed_partition_step(text, oid) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_managed_partition_step_retrying(text, oid, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_managed_drop_expired(integer) FROM PUBLIC;
