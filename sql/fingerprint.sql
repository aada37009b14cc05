-- idem_fingerprint (1.3, issue 30) against 1.2's composition, evaluated by PostgreSQL itself, over a generated
-- corpus: every request without a query hashes as idem_hash(jsonb_build_object('method', m, 'path', p, 'body',
-- body::jsonb)), and with one as the same object with 'query' added. The corpus (setseed: the same every run)
-- spells numbers every way JSON allows (1.0, 1e2, 1E+2, -0, 0.000, long digit strings, exponents beyond the
-- core's range), writes strings raw and escaped (\uXXXX, surrogate pairs, control characters, \/), repeats
-- keys (the last wins), nests arrays and objects, deeper than the core goes itself, and scatters white space.
-- Any difference is listed, so this fails on a canonicaliser that differs from jsonb in one byte.
SELECT setseed(0.42);

CREATE FUNCTION pg_temp.pick(variadic options text[]) RETURNS text LANGUAGE sql VOLATILE AS
$$ SELECT options[1 + floor(random() * array_length(options, 1))::int] $$;

CREATE FUNCTION pg_temp.ws() RETURNS text LANGUAGE sql VOLATILE AS
$$ SELECT pg_temp.pick('', '', '', ' ', '  ', E'\n', E'\t', E'\r\n', E' \n\t ') $$;

CREATE FUNCTION pg_temp.gen_number() RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    int_part text := pg_temp.pick('0', '1', '7', '10', '42', '100', '123456789', '12345678901234567890123456789');
BEGIN
    RETURN pg_temp.pick('', '', '-') || int_part
        || pg_temp.pick('', '', '.0', '.5', '.50', '.000', '.125', '.0001', '.99999999999999999999')
        || pg_temp.pick('', '', '', 'e2', 'E2', 'e+2', 'E-2', 'e-7', 'e0', 'e-0', 'e21', 'E-21', 'e999', 'e-999',
                        'e1001', 'e-1001', 'e00003');
END $$;

CREATE FUNCTION pg_temp.gen_char() RETURNS text LANGUAGE sql VOLATILE AS $$
SELECT pg_temp.pick('a', 'Z', '0', ' ', '~', '/', 'é', 'ß', '中', '😀', '€', E'\u00a0', E'\u2028', E'\u007f',
                    '\"', '\\', '\/', '\b', '\f', '\n', '\r', '\t', '\u0001', '\u001f', '\u001F', '\u0020',
                    '\u00e9', '\u00E9', '\u4e2d', '\ud83d\ude00', '\uD83D\uDE00', '\u2028', '\uffff', '\u0041')
$$;

CREATE FUNCTION pg_temp.gen_string() RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    s text := '"';
BEGIN
    FOR i IN 1 .. floor(random() * 6)::int LOOP
        s := s || pg_temp.gen_char();
    END LOOP;
    RETURN s || '"';
END $$;

CREATE FUNCTION pg_temp.gen_key() RETURNS text LANGUAGE sql VOLATILE AS $$
SELECT pg_temp.pick('"a"', '"b"', '"aa"', '"ab"', '"ba"', '"é"', '"\u00e9"', '"key"', '""', '"Z"', '"a\u0000b"',
                    '"amount_cents"', '"currency"', '"\n"', '"😀"')
$$;

CREATE FUNCTION pg_temp.gen_value(depth int) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    kind int := floor(random() * (CASE WHEN depth >= 4 THEN 4 ELSE 6 END))::int;
    parts text[] := '{}';
BEGIN
    CASE kind
        WHEN 0 THEN RETURN pg_temp.gen_number();
        WHEN 1 THEN RETURN pg_temp.gen_string();
        WHEN 2 THEN RETURN pg_temp.pick('true', 'false', 'null');
        WHEN 3 THEN RETURN pg_temp.gen_number();
        WHEN 4 THEN
            FOR i IN 1 .. floor(random() * 4)::int LOOP
                parts := parts || (pg_temp.ws() || pg_temp.gen_value(depth + 1) || pg_temp.ws());
            END LOOP;
            RETURN '[' || pg_temp.ws() || array_to_string(parts, ',') || ']';
        ELSE
            FOR i IN 1 .. floor(random() * 5)::int LOOP
                parts := parts || (pg_temp.ws() || pg_temp.gen_key() || pg_temp.ws() || ':' || pg_temp.ws()
                                   || pg_temp.gen_value(depth + 1) || pg_temp.ws());
            END LOOP;
            RETURN '{' || pg_temp.ws() || array_to_string(parts, ',') || '}';
    END CASE;
END $$;

CREATE FUNCTION pg_temp.deep(levels int, leaf text) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT repeat('{"b": 1, "a": [', levels) || leaf || repeat(']}', levels) $$;

-- The corpus: 4000 generated bodies, then the hand-picked edges; those jsonb refuses (\u0000, a number past
-- numeric's range) are left out here and checked for their error below.
CREATE TEMP TABLE corpus AS
SELECT i, pg_temp.ws() || pg_temp.gen_value(0) || pg_temp.ws() AS body,
       pg_temp.pick('POST', 'PUT', 'PATCH', 'post', 'DELETE') AS method,
       pg_temp.pick('/payments', '/rides', '/', '/a b', '/"quoted"', '/back\slash', '/é/中', E'/tab\there',
                    E'/ctl\u0001', '/payments/123') AS path,
       pg_temp.pick('', '', '', 'ref=1', '?ref=2', 'a=1&b=2', 'q="x"', 'é=中') AS query
FROM generate_series(1, 4000) AS i;
INSERT INTO corpus VALUES
    (4001, pg_temp.deep(255, '1'), 'POST', '/deep', ''),
    (4002, pg_temp.deep(256, '1.0'), 'POST', '/deep', ''),
    (4003, pg_temp.deep(300, '"x"'), 'POST', '/deeper', ''),
    (4004, '1e1000', 'POST', '/n', ''),
    (4005, '-0.0e-5', 'POST', '/n', ''),
    (4006, repeat('9', 1001), 'POST', '/n', ''),
    (4007, '0.' || repeat('0', 999) || '1', 'POST', '/n', ''),
    (4008, '{"a": 1, "a": 2, "a": {"a": 3, "a": 4}}', 'POST', '/dup', ''),
    (4009, '"only a string"', 'POST', '/s', ''),
    (4010, '  null  ', 'POST', '/s', ''),
    (4011, '[]', 'POST', '/s', 'x=1'),
    (4012, '{}', 'POST', '/s', '');
DELETE FROM corpus WHERE body LIKE '%\u0000%';
DELETE FROM corpus WHERE body ~ '[eE]1001' OR body ~ '[eE]999';  -- past numeric's range at times: below

SELECT count(*) >= 3500 AS corpus_is_large,
       count(*) FILTER (WHERE body ~ '\\u') > 100 AS has_escapes,
       count(*) FILTER (WHERE body ~ '[eE][+-]?[0-9]') > 100 AS has_exponents,
       count(*) FILTER (WHERE query <> '') > 500 AS has_queries,
       count(*) FILTER (WHERE body ~ $$^\s*[{]$$) > 300 AS has_objects, count(*) FILTER (WHERE body ~ $$^\s*\[$$) > 300 AS has_arrays
FROM corpus;

-- Every case: the fingerprint equals the composition (listed when it does not).
SELECT i, method, path, query, body,
       idem_fingerprint(method, path, query, 'application/json', convert_to(body, 'UTF8')) AS fingerprint,
       idem_hash(CASE WHEN ltrim(query, '?') = ''
                      THEN jsonb_build_object('method', method, 'path', path, 'body', body::jsonb)
                      ELSE jsonb_build_object('method', method, 'path', path, 'query', ltrim(query, '?'),
                                              'body', body::jsonb) END) AS composition
FROM corpus
WHERE idem_fingerprint(method, path, query, 'application/json', convert_to(body, 'UTF8'))
      IS DISTINCT FROM
      idem_hash(CASE WHEN ltrim(query, '?') = ''
                     THEN jsonb_build_object('method', method, 'path', path, 'body', body::jsonb)
                     ELSE jsonb_build_object('method', method, 'path', path, 'query', ltrim(query, '?'),
                                             'body', body::jsonb) END);

-- A NULL content type hashes a body as JSON too (what 1.2 clients did); a JSON media type in any spelling.
SELECT count(*) AS differ_without_content_type
FROM corpus
WHERE idem_fingerprint(method, path, query, NULL, convert_to(body, 'UTF8'))
      <> idem_fingerprint(method, path, query, 'application/json', convert_to(body, 'UTF8'));
SELECT count(DISTINCT idem_fingerprint('POST', '/p', NULL, t, '{"a": 1}')) AS one_hash
FROM unnest(ARRAY['application/json', 'Application/JSON', ' application/json ; charset=utf-8',
                  'application/problem+json', 'application/vnd.api+json', 'application/merge-patch+json']) AS t;

-- The query is part of the fingerprint; a leading '?' and none at all ('' or NULL) are the same.
SELECT idem_fingerprint('POST', '/payments', 'ref=1', 'application/json', '{}')
       <> idem_fingerprint('POST', '/payments', 'ref=2', 'application/json', '{}') AS query_counts,
       idem_fingerprint('POST', '/payments', '?ref=1', 'application/json', '{}')
       = idem_fingerprint('POST', '/payments', 'ref=1', 'application/json', '{}') AS leading_mark_dropped,
       idem_fingerprint('POST', '/payments', '', 'application/json', '{}')
       = idem_fingerprint('POST', '/payments', NULL, 'application/json', '{}') AS empty_is_none;

-- The bytes form: any other content type; the body's bytes count as they are, and so do the content type
-- (media type case aside), method, path and query; it never equals a JSON form.
SELECT idem_fingerprint('POST', '/p', NULL, 'text/plain', '{"a":1}')
       <> idem_fingerprint('POST', '/p', NULL, 'text/plain', '{"a": 1}') AS bytes_count,
       idem_fingerprint('POST', '/p', NULL, 'text/plain', 'x')
       = idem_fingerprint('POST', '/p', NULL, ' TEXT/Plain', 'x') AS media_type_case_ignored,
       idem_fingerprint('POST', '/p', NULL, 'text/plain; charset=utf-8', 'x')
       <> idem_fingerprint('POST', '/p', NULL, 'text/plain', 'x') AS parameters_count,
       idem_fingerprint('POST', '/p', NULL, 'text/plain', '{"a":1}')
       <> idem_fingerprint('POST', '/p', NULL, 'application/json', '{"a":1}') AS forms_differ,
       idem_fingerprint('POST', '/p', NULL, 'application/octet-stream', '\x00ff00'::bytea)
       <> idem_fingerprint('POST', '/p', NULL, 'application/octet-stream', '\x00ff01'::bytea) AS binary_body,
       idem_fingerprint('POST', '/p', 'a=1', 'text/plain', 'x')
       <> idem_fingerprint('POST', '/p', 'a=2', 'text/plain', 'x') AS bytes_query_counts,
       idem_fingerprint('POST', '/ab', NULL, 'text/plain', 'c')
       <> idem_fingerprint('POST', '/a', NULL, 'text/plain', 'bc') AS framed;
-- No content type and no body: the bytes form (an empty body is no JSON); NULL body = empty body.
SELECT idem_fingerprint('DELETE', '/p/1', NULL, NULL, NULL) = idem_fingerprint('DELETE', '/p/1', NULL, NULL, '')
       AS null_body_is_empty;
-- The preimage of the bytes form, spelled out.
SELECT idem_fingerprint('POST', '/p', 'q=1', 'Text/Plain; a=B', 'hi') = encode(sha256(
    convert_to(E'idempotency fingerprint 1.3 bytes\n', 'UTF8')
    || int8send(4) || convert_to('POST', 'UTF8') || int8send(2) || convert_to('/p', 'UTF8')
    || int8send(3) || convert_to('q=1', 'UTF8') || int8send(15) || convert_to('text/plain; a=B', 'UTF8')
    || int8send(2) || convert_to('hi', 'UTF8')), 'hex') AS bytes_form_as_documented;

-- What jsonb refuses, the fingerprint refuses the same way (SQLSTATE and message of body::jsonb).
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
SELECT sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', 'nope')$$);
SELECT sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', '')$$);
SELECT sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, NULL, '{"a":')$$);
SELECT sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', '{"a": 01}')$$);
SELECT sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', convert_to('["\u0000"]', 'UTF8'))$$);
SELECT sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', convert_to('"\ud800"', 'UTF8'))$$);
SELECT sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', '\x22ff22'::bytea)$$);
SELECT sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', '\x2200'::bytea)$$);
SELECT sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', '1e999999999')$$);
SELECT sqlstate_of($$SELECT idem_fingerprint(NULL, '/p', NULL, NULL, '{}')$$);
SELECT sqlstate_of($$SELECT idem_fingerprint('POST', NULL, NULL, NULL, '{}')$$);
-- Numbers past the core's own range: jsonb's answer, whatever it is.
SELECT count(*) AS differ_past_core_range
FROM unnest(ARRAY['1e999', '-2.5E-999', '1e1001', '0e1001', '1.5e-1001']) AS n
WHERE idem_fingerprint('POST', '/n', NULL, NULL, convert_to(n, 'UTF8'))
      <> idem_hash(jsonb_build_object('method', 'POST', 'path', '/n', 'body', n::jsonb));
-- Differential: 5000 byte-level mutations (a byte replaced, inserted or removed, the text cut short) of valid
-- bodies; idem_fingerprint and the 1.2 composition agree on every one: the same hash, or the same SQLSTATE.
SELECT setseed(0.7);
CREATE TEMP TABLE mutated AS
WITH base AS (
    SELECT row_number() OVER () AS n, convert_to(t, 'UTF8') AS b
    FROM unnest(ARRAY['{"a": [1.5e3, "x\u00e9\n", {"b": null, "a": true}], "a": -0}',
                      '[1, 2.50, "\ud83d\ude00", {"k": "v"}, [], {}]', '"str\\\"ing"', '  {"z":1,"y":[{"x":{}}]}  ',
                      '123e-4', 'true']) AS t),
draws AS (
    SELECT i, 1 + floor(random() * 6)::int AS n, floor(random() * 4)::int AS op, floor(random() * 256)::int AS byte,
           random() AS pos
    FROM generate_series(1, 5000) AS i)
SELECT i, CASE op
    WHEN 0 THEN overlay(b PLACING set_byte('\x00'::bytea, 0, byte) FROM 1 + floor(pos * length(b))::int FOR 1)
    WHEN 1 THEN overlay(b PLACING set_byte('\x00'::bytea, 0, byte) FROM 1 + floor(pos * length(b))::int FOR 0)
    WHEN 2 THEN overlay(b PLACING ''::bytea FROM 1 + floor(pos * length(b))::int FOR 1)
    ELSE substr(b, 1, floor(pos * length(b))::int) END AS b
FROM draws JOIN base USING (n);
CREATE FUNCTION pg_temp.agree(b bytea) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    fingerprint text;
    composition text;
BEGIN
    IF length(b) = 0 THEN
        RETURN 'empty: bytes form';
    END IF;
    BEGIN
        fingerprint := idem_fingerprint('POST', '/f', NULL, NULL, b);
    EXCEPTION WHEN OTHERS THEN
        fingerprint := 'ERROR ' || SQLSTATE;
    END;
    BEGIN
        composition := idem_hash(jsonb_build_object('method', 'POST', 'path', '/f',
                                                    'body', convert_from(b, 'UTF8')::jsonb));
    EXCEPTION WHEN OTHERS THEN
        composition := 'ERROR ' || SQLSTATE;
    END;
    RETURN CASE WHEN fingerprint = composition AND fingerprint LIKE 'ERROR%' THEN 'same error'
                WHEN fingerprint = composition THEN 'same hash'
                ELSE 'DIFFERENT: ' || fingerprint || ' / ' || composition END;
END $$;
SELECT count(*) FILTER (WHERE r = 'same hash') > 500 AS many_still_json,
       count(*) FILTER (WHERE r = 'same error') > 500 AS many_broken,
       count(*) FILTER (WHERE r LIKE 'DIFFERENT%') AS different
FROM (SELECT pg_temp.agree(b) AS r FROM mutated) AS s;
DROP FUNCTION sqlstate_of(text);
