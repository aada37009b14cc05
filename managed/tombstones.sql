-- The managed edition: tombstones (1.4, issue 41; src/tombstones.c and the tombstone steps of src/claim.c and
-- src/cleanup.c). A completed key whose response expired less than idempotency.tombstone_ttl ago answers
-- 'expired' (410) in every claim function, as its expired row (not swept yet) or its tombstone shows; the sweep
-- turns the expired completed rows it deletes into tombstones in the same statement, then deletes the
-- tombstones past the ttl (all of them once it is 0) at the same pace. A lease that ran out without a
-- completion is taken over, never remembered.

-- now() - idempotency.tombstone_ttl, or NULL while it is 0 (the default): tombstones off. The setting is read
-- as the C edition's: a number is seconds, a time with its unit ('30d', '10min') is read by interval input and
-- rounded to seconds; a value that is no time, or outside 0 .. 3650 days, is refused (22023) here, when read (a
-- placeholder setting takes any text at SET: managed/DIFFERENCES.md).
CREATE FUNCTION @extschema@.idem_managed_tombstone_since()
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    setting text := pg_catalog.btrim(pg_catalog.current_setting('idempotency.tombstone_ttl', true));
    seconds numeric;
BEGIN
    IF setting IS NULL OR setting OPERATOR(pg_catalog.=) '' OR setting OPERATOR(pg_catalog.=) '0' THEN
        RETURN NULL;
    END IF;
    BEGIN
        seconds := pg_catalog.round(EXTRACT(epoch FROM setting::pg_catalog.interval));
    EXCEPTION WHEN data_exception THEN
        RAISE EXCEPTION 'invalid value for parameter "idempotency.tombstone_ttl": "%"', setting
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A time in seconds, units accepted (''30d''), from 0 to 3650 days; 0 turns tombstones off.';
    END;
    IF seconds OPERATOR(pg_catalog.<) 0 OR seconds OPERATOR(pg_catalog.>) 315360000 THEN
        RAISE EXCEPTION '% s is outside the valid range for parameter "idempotency.tombstone_ttl" (0 .. 315360000)',
            seconds USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF seconds OPERATOR(pg_catalog.=) 0 THEN
        RETURN NULL;
    END IF;
    RETURN pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => seconds::pg_catalog.float8);
END
$$;

-- The claim's probe, for a key with no row its claim could read (src/tombstones.c): when its response expired,
-- if after since; else NULL. Read as the caller (its SELECT right on the tombstones, row level security), with
-- the claim statement's snapshot. In partitioned storage the claim reads live rows only: an expired completed
-- row not dropped or swept yet is looked for here too.
CREATE FUNCTION @extschema@.idem_managed_tombstone(key text, scope text, since timestamptz, partitioned boolean)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    expired_at timestamptz;
BEGIN
    SELECT t.expired_at INTO expired_at
    FROM @extschema@.idempotency_tombstones t
    WHERE t.key OPERATOR(pg_catalog.=) idem_managed_tombstone.key
      AND t.scope OPERATOR(pg_catalog.=) idem_managed_tombstone.scope
      AND t.expired_at OPERATOR(pg_catalog.>) since;
    IF NOT FOUND AND partitioned THEN
        SELECT k.expires_at INTO expired_at
        FROM @extschema@.idempotency_keys_partitioned k
        WHERE k.key OPERATOR(pg_catalog.=) idem_managed_tombstone.key
          AND k.scope OPERATOR(pg_catalog.=) idem_managed_tombstone.scope
          AND k.expires_at OPERATOR(pg_catalog.>) since
          AND k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
          AND k.http_status IS NOT NULL
        LIMIT 1;
    END IF;
    RETURN expired_at;
END
$$;

-- Whether a sweep goes on to the tombstones after the keys: while tombstones are on, or while any are left on
-- disk (all of them go once the ttl is 0); with tombstones off and none left the sweep is 1.3's.
CREATE FUNCTION @extschema@.idem_managed_tombstones_swept()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN @extschema@.idem_managed_tombstone_since() IS NOT NULL
        OR pg_catalog.pg_relation_size('@extschema@.idempotency_tombstones'::pg_catalog.regclass)
           OPERATOR(pg_catalog.>) 0;
END
$$;

-- For the drop of an expired partition (src/tombstones.c, tombstones_bury_partition): its completed rows that
-- expired after now() - idempotency.tombstone_ttl become tombstones, in the dropping transaction, before the
-- drop; a lease that ran out is taken over, not remembered. Returns how many were written; 0 while tombstones are
-- off. The managed edition's partition drop (not written yet: managed/SUPPORTED) calls it.
CREATE FUNCTION @extschema@.idem_managed_bury_partition(partition regclass)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    since timestamptz := @extschema@.idem_managed_tombstone_since();
    buried bigint;
BEGIN
    IF since IS NULL THEN
        RETURN 0;
    END IF;
    EXECUTE pg_catalog.format('INSERT INTO @extschema@.idempotency_tombstones (expired_at, scope, key, request_hash)'
        ' SELECT expires_at, scope, key, request_hash FROM %s'
        ' WHERE http_status IS NOT NULL AND expires_at OPERATOR(pg_catalog.>) $1 ON CONFLICT DO NOTHING', partition)
        USING since;
    GET DIAGNOSTICS buried = ROW_COUNT;
    RETURN buried;
END
$$;

REVOKE ALL ON FUNCTION @extschema@.idem_managed_bury_partition(regclass) FROM PUBLIC;
