-- The managed edition: partitioned storage (src/partitions.c). So far idem_partitions(), which
-- idem_storage_mode() reads: the range partitions of idempotency_keys_partitioned, lowest first, with their bounds
-- read back from the catalog's text of them under this function's own DateStyle and TimeZone (fixed below), so
-- the same values under every session's settings. Making, dropping and switching are not written yet.
CREATE FUNCTION @extschema@.idem_partitions(
    OUT partition_name name, OUT lower_bound timestamptz, OUT upper_bound timestamptz)
RETURNS SETOF record
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET DateStyle = 'ISO, YMD'
SET TimeZone = 'UTC'
SET IntervalStyle = 'postgres'
AS $$
    SELECT b.relname, b.bounds[1]::pg_catalog.timestamptz, b.bounds[2]::pg_catalog.timestamptz
    FROM (SELECT c.relname,
                 pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                                         '^FOR VALUES FROM \(''([^'']+)''\) TO \(''([^'']+)''\)$') AS bounds
          FROM pg_catalog.pg_inherits i
          JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
          WHERE i.inhparent OPERATOR(pg_catalog.=) '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass
            AND NOT i.inhdetachpending) b
    WHERE b.bounds IS NOT NULL
    ORDER BY 2
$$;
