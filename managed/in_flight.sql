-- The managed edition: keys in flight (src/in_flight.c, src/in_flight_list.c). The C edition publishes every
-- backend's transactional claims in shared memory; a managed server offers nothing that names them. A claim in
-- flight writes no row (its row is written when it completes), and the one trace other sessions can see is its
-- advisory lock in pg_locks: a 64-bit hash of (scope, key), from which the key cannot be read back. So
-- idem_keys_in_flight_claims() lists this session's own claims only (the transaction's claim map,
-- idempotency_managed.claims), with since the transaction's start (the map keeps no time of its own, so that the
-- claim stays cheap); managed/DIFFERENCES.md says so.
CREATE FUNCTION @extschema@.idem_keys_in_flight_claims(
    OUT scope text, OUT key text, OUT pid integer, OUT since timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    relation regclass := CASE WHEN @extschema@.idem_managed_partitioned()
                              THEN '@extschema@.idempotency_keys_partitioned'::pg_catalog.regclass
                              ELSE '@extschema@.idempotency_keys'::pg_catalog.regclass END;
    claims jsonb := COALESCE(NULLIF(pg_catalog.current_setting('idempotency_managed.claims', true), ''),
                             '{}')::pg_catalog.jsonb;
    scopes text[];
    keys text[];
    sinces timestamptz[];
    filter text;
BEGIN
    -- What SELECT on the active key table would check: the privilege (42501), and row_security = off where
    -- policies would apply (42501): an empty read as the caller raises either with PostgreSQL's own message.
    EXECUTE pg_catalog.format('SELECT FROM %s LIMIT 0', relation);
    SELECT pg_catalog.array_agg(pg_catalog.split_part(c.id, E'\x1f', 1) ORDER BY c.id),
           pg_catalog.array_agg(pg_catalog.substr(c.id, pg_catalog.strpos(c.id, E'\x1f') OPERATOR(pg_catalog.+) 1)
                                ORDER BY c.id),
           pg_catalog.array_agg(pg_catalog.transaction_timestamp())
    INTO scopes, keys, sinces
    FROM pg_catalog.jsonb_object_keys(claims) AS c(id);
    IF scopes IS NULL THEN
        RETURN;
    END IF;
    IF NOT pg_catalog.row_security_active(relation) THEN
        RETURN QUERY SELECT u.scope, u.key, pg_catalog.pg_backend_pid(), u.since
                     FROM ROWS FROM (pg_catalog.unnest(scopes), pg_catalog.unnest(keys), pg_catalog.unnest(sinces))
                          AS u(scope, key, since);
        RETURN;
    END IF;
    -- Row level security: the table's SELECT policies on a row made of the claim's scope, key and since (as
    -- created_at), every other column NULL, as the C edition applies them (src/in_flight_list.c): the
    -- permissive SELECT (or ALL) policies that apply to the user ORed, the restrictive ones ANDed; none
    -- permissive: nothing.
    SELECT CASE WHEN pg_catalog.bool_or(p.polpermissive) THEN pg_catalog.format(
             'SELECT e.scope, e.key, pg_catalog.pg_backend_pid(), e.since FROM ROWS FROM (pg_catalog.unnest($1),'
             ' pg_catalog.unnest($2), pg_catalog.unnest($3)) AS e(scope, key, since)'
             ' WHERE EXISTS (SELECT FROM (SELECT %s) AS %I WHERE (%s)%s)',
             (SELECT pg_catalog.string_agg(
                  CASE a.attname WHEN 'scope' THEN 'e.scope' WHEN 'key' THEN 'e.key'
                                 WHEN 'created_at' THEN 'e.since' ELSE 'NULL' END
                  OPERATOR(pg_catalog.||) '::' OPERATOR(pg_catalog.||) pg_catalog.format_type(a.atttypid, a.atttypmod)
                  OPERATOR(pg_catalog.||) COALESCE((SELECT pg_catalog.format(' COLLATE %I.%I', cn.nspname, c.collname)
                       FROM pg_catalog.pg_collation c JOIN pg_catalog.pg_namespace cn
                            ON cn.oid OPERATOR(pg_catalog.=) c.collnamespace
                       WHERE c.oid OPERATOR(pg_catalog.=) a.attcollation), '')
                  OPERATOR(pg_catalog.||) ' AS ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(a.attname),
                  ', ' ORDER BY a.attnum)
              FROM pg_catalog.pg_attribute a
              WHERE a.attrelid OPERATOR(pg_catalog.=) relation AND a.attnum OPERATOR(pg_catalog.>) 0
                AND NOT a.attisdropped),
             (SELECT c.relname FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) relation),
             pg_catalog.string_agg('(' OPERATOR(pg_catalog.||) pg_catalog.pg_get_expr(p.polqual, p.polrelid)
                                   OPERATOR(pg_catalog.||) ')', ' OR ') FILTER (WHERE p.polpermissive),
             COALESCE(pg_catalog.string_agg(' AND (' OPERATOR(pg_catalog.||)
                                   pg_catalog.pg_get_expr(p.polqual, p.polrelid) OPERATOR(pg_catalog.||) ')', '')
                      FILTER (WHERE NOT p.polpermissive), ''))
           END
    INTO filter
    FROM pg_catalog.pg_policy p
    WHERE p.polrelid OPERATOR(pg_catalog.=) relation AND p.polqual IS NOT NULL
      AND p.polcmd OPERATOR(pg_catalog.=) ANY ('{r,*}'::"char"[])
      AND EXISTS (SELECT FROM pg_catalog.unnest(p.polroles) AS r(role)
                  WHERE CASE WHEN r.role OPERATOR(pg_catalog.=) 0 THEN true
                             ELSE pg_catalog.pg_has_role(r.role, 'USAGE') END);
    IF filter IS NOT NULL THEN
        RETURN QUERY EXECUTE filter USING scopes, keys, sinces;
    END IF;
END
$$;

-- The C edition's idem_keys_in_flight_rest() finds its schema through pg_extension (absent under the plain
-- script) and asks the other Citus nodes; here: the live leases of the active key table, read as the caller.
CREATE FUNCTION @extschema@.idem_keys_in_flight_rest(
    OUT scope text, OUT key text, OUT pid integer, OUT since timestamptz,
    OUT lease_until timestamptz, OUT holder text)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF @extschema@.idem_managed_partitioned() THEN
        RETURN QUERY
            SELECT k.scope::pg_catalog.text, k.key::pg_catalog.text, NULL::pg_catalog.int4, k.created_at,
                   k.lease_until, 'lease'::pg_catalog.text
            FROM @extschema@.idempotency_keys_partitioned k
            WHERE k.http_status IS NULL AND k.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
              AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();
    ELSE
        RETURN QUERY
            SELECT k.scope::pg_catalog.text, k.key::pg_catalog.text, NULL::pg_catalog.int4, k.created_at,
                   k.lease_until, 'lease'::pg_catalog.text
            FROM @extschema@.idempotency_keys k
            WHERE k.http_status IS NULL AND k.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
              AND k.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();
    END IF;
END
$$;
