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
