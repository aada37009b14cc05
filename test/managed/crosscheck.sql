-- The managed edition's digests against the C edition's (issue 40): run by scripts/test-managed.sh in a database
-- of each edition, whose outputs must be equal byte for byte. A corpus made by setseed and random() (the same
-- rows in both databases of one server): JSON bodies spelled every way JSON allows (numbers, escapes, surrogate
-- pairs, repeated keys, nesting, white space), bodies that are not JSON under content types that are not JSON,
-- every content-type spelling the fingerprint tells apart, queries with and without '?', and the same values
-- through idem_hash(text), idem_hash(bytea), idem_hash(jsonb) and idem_hash(jsonb, text[]).
-- One line per row: i|idem_fingerprint|idem_hash(text)|idem_hash(bytea)|idem_hash(jsonb)|idem_hash(jsonb, exclude).
\set QUIET on
SELECT setseed(0.4242) \g /dev/null

CREATE FUNCTION pg_temp.pick(variadic options text[]) RETURNS text LANGUAGE sql VOLATILE AS
$$ SELECT options[1 + floor(random() * array_length(options, 1))::int] $$;

CREATE FUNCTION pg_temp.ws() RETURNS text LANGUAGE sql VOLATILE AS
$$ SELECT pg_temp.pick('', '', '', ' ', E'\n', E'\t', E'\r\n') $$;

CREATE FUNCTION pg_temp.gen_value(depth int) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    kind int := floor(random() * (CASE WHEN depth >= 4 THEN 4 ELSE 6 END))::int;
    parts text[] := '{}';
BEGIN
    CASE kind
        WHEN 0 THEN
            RETURN pg_temp.pick('', '-') || pg_temp.pick('0', '1', '42', '123456789012345678901234567890')
                || pg_temp.pick('', '.0', '.50', '.125', '.000') || pg_temp.pick('', 'e2', 'E-3', 'e+21', 'e-0');
        WHEN 1 THEN
            RETURN '"' || pg_temp.pick('', 'a', 'é', '中', '😀', '\"', '\\', '\/', '\n', '\t', '\u0001', '\u00e9',
                                       '\ud83d\ude00', '\u2028', E'\u00a0', ' x ') || pg_temp.pick('', 'b', '\r') || '"';
        WHEN 2 THEN RETURN pg_temp.pick('true', 'false', 'null');
        WHEN 3 THEN RETURN pg_temp.pick('0', '-0', '1e400', '0.1', '100');
        WHEN 4 THEN
            FOR i IN 1 .. floor(random() * 4)::int LOOP
                parts := parts || (pg_temp.ws() || pg_temp.gen_value(depth + 1) || pg_temp.ws());
            END LOOP;
            RETURN '[' || array_to_string(parts, ',') || ']';
        ELSE
            FOR i IN 1 .. floor(random() * 5)::int LOOP
                parts := parts || (pg_temp.ws() || pg_temp.pick('"a"', '"b"', '"aa"', '"é"', '"\u00e9"', '""',
                                                                '"amount"', '"a"') || ':' || pg_temp.ws()
                                   || pg_temp.gen_value(depth + 1));
            END LOOP;
            RETURN '{' || array_to_string(parts, ',') || '}';
    END CASE;
END $$;

CREATE TEMP TABLE corpus AS
SELECT i, pg_temp.ws() || pg_temp.gen_value(0) || pg_temp.ws() AS json_body,
       pg_temp.pick('POST', 'PUT', 'post', 'DELETE', '', E'P\tOST') AS method,
       pg_temp.pick('/payments', '/', '/a b', '/"q"', '/back\slash', '/é/中', E'/tab\there', E'/ctl\u0001') AS path,
       pg_temp.pick(NULL, '', '?', '?a=1', 'a=1&b=2', '?é=中', '??x') AS query,
       pg_temp.pick(NULL, 'application/json', 'Application/JSON; charset=utf-8', ' application/json ',
                    'application/problem+json', 'application/vnd.api+JSON', 'a/+json', '/x+json', 'text/plain',
                    E' Text/Plain ;\tcharset=UTF-8 ', 'application/x-www-form-urlencoded', '',
                    'multipart/form-data; boundary=XyZ', 'application/jsonx', E'\tapplication/json;') AS content_type,
       pg_temp.pick('raw', 'json', 'json', 'null', 'empty', 'binary') AS body_kind
FROM generate_series(1, 3000) i;

-- A body for each row: the JSON text, or bytes that are not JSON (only under a content type that is not JSON,
-- where the fingerprint reads them as bytes: a JSON content type with a body that is not JSON is an error in both
-- editions, checked by sql/fingerprint.sql).
CREATE TEMP TABLE bodies AS
SELECT c.*,
       CASE WHEN body_kind = 'null' AND (content_type IS NULL OR NOT json_type) THEN NULL
            WHEN body_kind = 'empty' AND (content_type IS NULL OR NOT json_type) THEN '\x'::bytea
            WHEN body_kind = 'binary' AND NOT json_type THEN decode(md5(i::text) || '00ff80', 'hex')
            WHEN body_kind = 'raw' AND NOT json_type THEN convert_to('a=1&b=' || i || ' é', 'UTF8')
            ELSE convert_to(json_body, 'UTF8') END AS body
FROM (SELECT c.*, (content_type IS NULL OR lower(btrim(split_part(content_type, ';', 1), E' \t')) ~ '^(application/json|[^/]+/.+[+]json)$')
                  AS json_type FROM corpus c) c;

SELECT b.i,
       idem_fingerprint(b.method, b.path, b.query, b.content_type, b.body),
       idem_hash(b.json_body),
       idem_hash(convert_to(b.json_body, 'UTF8')),
       idem_hash(b.json_body::jsonb),
       CASE WHEN jsonb_typeof(b.json_body::jsonb) = 'object'
            THEN idem_hash(b.json_body::jsonb, ARRAY['a', 'amount', 'é']) END
FROM bodies b
ORDER BY b.i;
