-- The managed edition: idem_hash, in SQL. Each form is SHA-256 of the same bytes as the C edition's
-- (src/hash_sql.c): text and bytea as they are, jsonb as its output text (keys sorted, duplicates removed,
-- spacing fixed). convert_to(..., 'SQL_ASCII') hands back the text's bytes in the server encoding unconverted,
-- as the C functions read them. sha256() is built in since PostgreSQL 11.

CREATE FUNCTION @extschema@.idem_hash(text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
RETURN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to($1, 'SQL_ASCII')), 'hex');

CREATE FUNCTION @extschema@.idem_hash(bytea)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
RETURN pg_catalog.encode(pg_catalog.sha256($1), 'hex');

CREATE FUNCTION @extschema@.idem_hash(jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
RETURN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(pg_catalog.jsonb_out($1)::pg_catalog.text, 'SQL_ASCII')),
                         'hex');

-- payload #- string_to_array(path, '.') for each path, then hashed as idem_hash(jsonb); the same limits and
-- SQLSTATEs as the C edition: more than 256 paths or an empty one 22023, a NULL one 22004.
CREATE FUNCTION @extschema@.idem_hash(payload jsonb, exclude text[])
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer := pg_catalog.cardinality(exclude);
    path text;
BEGIN
    IF n OPERATOR(pg_catalog.>) 256 THEN
        RAISE EXCEPTION 'idempotency exclude paths are limited to %', 256
            USING ERRCODE = 'invalid_parameter_value', DETAIL = pg_catalog.format('%s paths were given.', n);
    END IF;
    FOREACH path IN ARRAY exclude LOOP
        IF path IS NULL THEN
            RAISE EXCEPTION 'idempotency exclude paths must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        IF path OPERATOR(pg_catalog.=) '' THEN
            RAISE EXCEPTION 'idempotency exclude paths must not be empty' USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    FOREACH path IN ARRAY exclude LOOP
        payload := pg_catalog.jsonb_delete_path(payload,
                                                pg_catalog.string_to_array(path COLLATE "C", '.'));
    END LOOP;
    RETURN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(pg_catalog.jsonb_out(payload)::pg_catalog.text,
                                                                     'SQL_ASCII')), 'hex');
END
$$;
