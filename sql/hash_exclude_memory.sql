-- idem_hash(jsonb, exclude): at most 256 exclude paths (22023 past it), and memory proportional to the payload,
-- not to payload x paths. The backend's peak resident size (VmHWM in /proc/self/status, Linux) is read before
-- and after hashing a 0.6 MB payload with 200 paths that each remove a field: 1.2 kept one copy per path (about
-- 120 MB here, 240 MB with its text form); now at most a few copies are alive at once.
\set VERBOSITY terse
CREATE TEMP TABLE payload AS
SELECT pg_catalog.jsonb_object_agg('k' || i, pg_catalog.md5(i::text) || pg_catalog.md5((-i)::text)
                                              || pg_catalog.md5((i * 7)::text)) AS doc
FROM pg_catalog.generate_series(1, 5000) i;
SELECT pg_catalog.pg_column_size(doc) > 500000 AS payload_over_half_a_megabyte FROM payload;
SELECT pg_catalog.octet_length(doc::text) > 500000 AS text_over_half_a_megabyte FROM payload;

-- The growth of the backend's peak memory.
CREATE FUNCTION pg_temp.peak_kb() RETURNS bigint LANGUAGE sql AS $$
    SELECT (pg_catalog.regexp_match(pg_catalog.pg_read_file('/proc/self/status'), 'VmHWM:\s+(\d+) kB'))[1]::bigint
$$;
SELECT pg_temp.peak_kb() AS before_kb \gset
SELECT pg_catalog.length(idem_hash(doc, ARRAY(SELECT 'k' || i FROM pg_catalog.generate_series(1, 200) i)))
FROM payload;
SELECT pg_temp.peak_kb() - :before_kb AS grown_kb \gset
-- Fails on 1.2 (about 120,000 kB).
SELECT :grown_kb < 32768 AS peak_grew_less_than_32_mb;

-- The cap.
SELECT pg_catalog.length(idem_hash(doc, ARRAY(SELECT 'k' || i FROM pg_catalog.generate_series(1, 256) i)))
FROM payload;
SELECT idem_hash(doc, ARRAY(SELECT 'k' || i FROM pg_catalog.generate_series(1, 257) i)) FROM payload;
SELECT idem_hash('{}'::jsonb, pg_catalog.array_fill('a'::text, ARRAY[100000]));
-- Still the same hash as removing the fields by hand.
SELECT idem_hash(doc, ARRAY(SELECT 'k' || i FROM pg_catalog.generate_series(1, 200) i))
     = idem_hash(doc - ARRAY(SELECT 'k' || i FROM pg_catalog.generate_series(1, 200) i)) AS same_hash
FROM payload;

