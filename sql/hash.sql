-- idem_hash: lowercase hex SHA-256 of text, bytea and canonical jsonb.
SELECT idem_hash('abc');
SELECT idem_hash(''::text);
SELECT idem_hash('\x616263'::bytea) = idem_hash('abc') AS bytea_equals_text;
-- Agrees with PostgreSQL's own sha256().
SELECT idem_hash(repeat('x', 100000)) = encode(sha256(convert_to(repeat('x', 100000), 'UTF8')), 'hex') AS agrees_with_sha256;
-- Key order and white space do not change a jsonb hash; values do.
SELECT idem_hash('{"a":1,"b":2}'::jsonb) = idem_hash('{ "b": 2, "a": 1 }'::jsonb) AS order_and_space_ignored;
SELECT idem_hash('{"amount":100}'::jsonb) = idem_hash('{"amount":999999}'::jsonb) AS tampered_equal;
SELECT idem_hash('{"a":[1,2]}'::jsonb) = idem_hash('{"a":[2,1]}'::jsonb) AS array_order_kept;
-- NULL in, NULL out, like sha256().
SELECT idem_hash(NULL::text) IS NULL AS null_text, idem_hash(NULL::jsonb) IS NULL AS null_jsonb;
-- An untyped literal resolves to the text variant.
SELECT idem_hash('abc') = idem_hash('abc'::text) AS literal_is_text;
