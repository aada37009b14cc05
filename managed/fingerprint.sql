-- The managed edition: idem_fingerprint, the request fingerprint of 1.3, byte for byte the C edition's
-- (src/core/fingerprint.cpp, core_api.cpp):
-- * JSON (a content type application/json or */*+json, or none with a non-empty body): SHA-256 of
--   {"body": <body::jsonb's text>, "path": <path>[, "query": <query>], "method": <method>}, the text jsonb
--   prints for jsonb_build_object('method', m, 'path', p[, 'query', q], 'body', body::jsonb); a body that is not
--   JSON fails as body::jsonb does (22P02; 22021 when not UTF-8).
-- * anything else: SHA-256 of the tag 'idempotency fingerprint 1.3 bytes\n', then method, path, query, the
--   content type (trimmed of spaces and tabs, its media type lower-cased) and the body, each as a 64-bit
--   big-endian length and its bytes.
-- A query's leading '?' is dropped; a NULL query, content type or body is an empty one (a NULL content type with
-- a body reads it as JSON). to_json(text) escapes a string as the core does (escape_json).
CREATE FUNCTION @extschema@.idem_fingerprint(
    method text,
    path text,
    query text,
    content_type text,
    body bytea)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := COALESCE(query, '');
    media text;
BEGIN
    IF method IS NULL THEN
        RAISE EXCEPTION 'idempotency method must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF path IS NULL THEN
        RAISE EXCEPTION 'idempotency path must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.starts_with(q, '?') THEN
        q := pg_catalog.substr(q, 2);
    END IF;
    body := COALESCE(body, E'\\x'::pg_catalog.bytea);
    IF content_type IS NULL THEN
        media := CASE WHEN pg_catalog.length(body) OPERATOR(pg_catalog.>) 0 THEN 'application/json' ELSE '' END;
    ELSE
        media := pg_catalog.lower(pg_catalog.btrim(pg_catalog.split_part(content_type, ';', 1), E' \t') COLLATE "C");
    END IF;
    IF media OPERATOR(pg_catalog.=) 'application/json'
       OR media OPERATOR(pg_catalog.~) '^[^/]+/.+[+]json$' THEN
        RETURN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
            '{"body": ' OPERATOR(pg_catalog.||)
            pg_catalog.jsonb_out(pg_catalog.convert_from(body, 'UTF8')::pg_catalog.jsonb)::pg_catalog.text
            OPERATOR(pg_catalog.||) ', "path": ' OPERATOR(pg_catalog.||) pg_catalog.to_json(path)::pg_catalog.text
            OPERATOR(pg_catalog.||) CASE WHEN q OPERATOR(pg_catalog.=) '' THEN ''
                                         ELSE ', "query": ' OPERATOR(pg_catalog.||)
                                              pg_catalog.to_json(q)::pg_catalog.text END
            OPERATOR(pg_catalog.||) ', "method": ' OPERATOR(pg_catalog.||) pg_catalog.to_json(method)::pg_catalog.text
            OPERATOR(pg_catalog.||) '}', 'SQL_ASCII')), 'hex');
    END IF;
    IF content_type IS NOT NULL THEN
        -- The media type lower-cased (ASCII only), the parameters as sent, all trimmed of spaces and tabs.
        content_type := pg_catalog.btrim(content_type, E' \t');
        content_type := CASE WHEN pg_catalog.strpos(content_type, ';') OPERATOR(pg_catalog.>) 0
                             THEN pg_catalog.lower(pg_catalog.split_part(content_type, ';', 1) COLLATE "C")
                                  OPERATOR(pg_catalog.||)
                                  pg_catalog.substr(content_type, pg_catalog.strpos(content_type, ';'))
                             ELSE pg_catalog.lower(content_type COLLATE "C") END;
    END IF;
    RETURN pg_catalog.encode(pg_catalog.sha256(
        E'\\x6964656d706f74656e63792066696e6765727072696e7420312e332062797465730a'::pg_catalog.bytea
        OPERATOR(pg_catalog.||) @extschema@.idem_managed_framed(pg_catalog.convert_to(method, 'SQL_ASCII'))
        OPERATOR(pg_catalog.||) @extschema@.idem_managed_framed(pg_catalog.convert_to(path, 'SQL_ASCII'))
        OPERATOR(pg_catalog.||) @extschema@.idem_managed_framed(pg_catalog.convert_to(q, 'SQL_ASCII'))
        OPERATOR(pg_catalog.||) @extschema@.idem_managed_framed(pg_catalog.convert_to(COALESCE(content_type, ''),
                                                                                      'SQL_ASCII'))
        OPERATOR(pg_catalog.||) @extschema@.idem_managed_framed(body)), 'hex');
END
$$;

-- A part of the bytes form: its length as 8 bytes big-endian, then its bytes.
CREATE FUNCTION @extschema@.idem_managed_framed(part bytea)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
RETURN pg_catalog.int8send(pg_catalog.length(part)::pg_catalog.int8) OPERATOR(pg_catalog.||) part;
