-- The SQL API contract: names, signatures, result columns, markings, privileges. It runs against both editions
-- (issue 40): the C edition, and the managed edition installed through pg_tle (an extension) or by its plain
-- script (no extension: its objects are those of schema public that belong to no extension). Where they differ,
-- the difference is one listed in managed/DIFFERENCES.md, and the assertion says which edition expects what.
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(155);

CREATE TEMP TABLE contract_edition AS SELECT
    (SELECT l.lanname = 'c' FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
     WHERE p.oid = 'public.idem_claim(text, text, interval, text)'::regprocedure) AS c,
    EXISTS (SELECT FROM pg_extension WHERE extname = 'idempotency') AS extension;
-- The edition's functions and procedures: the extension's members, or, under the plain script, every routine of
-- schema public that is no extension's member (pgTAP's are pgtap's).
CREATE TEMP VIEW contract_procs AS
    SELECT p.* FROM pg_proc p
    WHERE EXISTS (SELECT FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                  WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
                    AND e.extname = 'idempotency')
       OR (NOT (SELECT extension FROM contract_edition) AND p.pronamespace = 'public'::regnamespace
           AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                             AND d.deptype = 'e'));
SELECT cmp_ok((SELECT count(*)::int FROM contract_procs), '>=', 30,
              'the edition''s routines are found (' || CASE WHEN (SELECT c FROM contract_edition) THEN 'C edition'
              WHEN (SELECT extension FROM contract_edition) THEN 'managed edition, pg_tle'
              ELSE 'managed edition, plain script' END || ')');

-- Functions and their argument types.
SELECT has_function('public', 'idem_claim', ARRAY['text', 'text', 'interval', 'text']);
SELECT has_function('public', 'idem_complete', ARRAY['text', 'integer', 'jsonb', 'jsonb', 'text']);
SELECT has_function('public', 'idem_release', ARRAY['text', 'text']);
SELECT has_function('public', 'idem_hash', ARRAY['text']);
SELECT has_function('public', 'idem_hash', ARRAY['bytea']);
SELECT has_function('public', 'idem_hash', ARRAY['jsonb']);

-- Return types.
SELECT function_returns('public', 'idem_claim', ARRAY['text', 'text', 'interval', 'text'], 'idem_claim_result');
SELECT function_returns('public', 'idem_complete', ARRAY['text', 'integer', 'jsonb', 'jsonb', 'text'], 'boolean');
SELECT function_returns('public', 'idem_release', ARRAY['text', 'text'], 'boolean');
SELECT function_returns('public', 'idem_hash', ARRAY['jsonb'], 'text');

-- Parameter names are part of the contract: clients call by name.
SELECT is(
    (SELECT proargnames FROM pg_proc WHERE oid = 'public.idem_claim(text, text, interval, text)'::regprocedure),
    ARRAY['key', 'request_hash', 'ttl', 'scope'],
    'idem_claim parameter names');
SELECT is(
    (SELECT array_agg(attname::text || ' ' || format_type(atttypid, atttypmod) ORDER BY attnum) FROM pg_attribute
     WHERE attrelid = 'public.idem_claim_result'::regclass AND attnum > 0 AND NOT attisdropped),
    ARRAY['outcome text', 'http_status integer', 'response_body jsonb', 'response_headers jsonb',
          'expires_at timestamp with time zone'],
    'idem_claim result columns, in order');
SELECT is(
    (SELECT proargnames FROM pg_proc
     WHERE oid = 'public.idem_complete(text, integer, jsonb, jsonb, text)'::regprocedure),
    ARRAY['key', 'http_status', 'response_body', 'response_headers', 'scope'],
    'idem_complete parameter names');
SELECT is(
    (SELECT proargnames FROM pg_proc WHERE oid = 'public.idem_release(text, text)'::regprocedure),
    ARRAY['key', 'scope'],
    'idem_release parameter names');
SELECT results_eq(
    $$SELECT outcome, http_status FROM idem_claim(key => 'named', request_hash => idem_hash('x'),
                                                   ttl => interval '1 minute', scope => 'named-scope')$$,
    $$VALUES ('claimed'::text, NULL::integer)$$,
    'idem_claim is callable with named arguments');
SELECT lives_ok(
    $$SELECT idem_complete(key => 'named', http_status => 200, response_body => '{}',
                           response_headers => '{}', scope => 'named-scope')$$,
    'idem_complete is callable with named arguments');

-- Volatility: the key functions change state; hashes are pure.
SELECT volatility_is('public', 'idem_claim', ARRAY['text', 'text', 'interval', 'text'], 'volatile');
SELECT volatility_is('public', 'idem_complete', ARRAY['text', 'integer', 'jsonb', 'jsonb', 'text'], 'volatile');
SELECT volatility_is('public', 'idem_release', ARRAY['text', 'text'], 'volatile');
SELECT volatility_is('public', 'idem_hash', ARRAY['text'], 'immutable');
SELECT volatility_is('public', 'idem_hash', ARRAY['bytea'], 'immutable');
SELECT volatility_is('public', 'idem_hash', ARRAY['jsonb'], 'immutable');

-- Parallel markings.
SELECT is(
    (SELECT array_agg(DISTINCT proparallel) FROM pg_proc
     WHERE proname IN ('idem_claim', 'idem_complete', 'idem_release')),
    ARRAY['u']::"char"[], 'claim, complete and release are PARALLEL UNSAFE');
SELECT is(
    (SELECT array_agg(DISTINCT proparallel) FROM pg_proc WHERE proname = 'idem_hash'),
    ARRAY['s']::"char"[], 'idem_hash is PARALLEL SAFE');

-- No SECURITY DEFINER anywhere: every function runs with the caller's rights.
SELECT isnt_definer('public', 'idem_claim', ARRAY['text', 'text', 'interval', 'text']);
SELECT isnt_definer('public', 'idem_complete', ARRAY['text', 'integer', 'jsonb', 'jsonb', 'text']);
SELECT isnt_definer('public', 'idem_release', ARRAY['text', 'text']);
SELECT is(
    (SELECT count(*)::int FROM contract_procs p WHERE p.prosecdef),
    0, 'no function of the extension is SECURITY DEFINER');

-- Hashes are STRICT (NULL in, NULL out); the key functions are not (NULL is an error, not a silent NULL).
SELECT is(
    (SELECT array_agg(proisstrict ORDER BY oid) FROM pg_proc WHERE proname = 'idem_hash'),
    ARRAY[true, true, true, true], 'idem_hash is STRICT');
SELECT is(
    (SELECT bool_or(proisstrict) FROM pg_proc WHERE proname IN ('idem_claim', 'idem_complete', 'idem_release')),
    false, 'claim, complete and release are not STRICT');

-- The table.
SELECT has_table('public', 'idempotency_keys', 'table idempotency_keys exists');
SELECT columns_are('public', 'idempotency_keys',
    ARRAY['expires_at', 'created_at', 'http_status', 'scope', 'key', 'request_hash',
          'response_headers', 'response_body', 'lease_until', 'lease_token', 'recovery_point', 'recovery_state',
          'response_content_type', 'response_bytes', 'fencing_number']);
SELECT col_type_is('public', 'idempotency_keys', 'lease_token', 'uuid', 'lease_token is uuid');
SELECT col_is_null('public', 'idempotency_keys', 'lease_until', 'lease_until is nullable');
SELECT col_hasnt_default('public', 'idempotency_keys', 'lease_until', 'lease_until has no default (the fast path relies on it)');
SELECT columns_are('public', 'idempotency_keys_partitioned',
    ARRAY['expires_at', 'created_at', 'http_status', 'scope', 'key', 'request_hash',
          'response_headers', 'response_body', 'lease_until', 'lease_token', 'recovery_point', 'recovery_state',
          'response_content_type', 'response_bytes', 'fencing_number'],
    'the partitioned table has the same columns in the same order');
SELECT col_type_is('public', 'idempotency_keys', 'scope', 'text', 'scope is text');
SELECT col_type_is('public', 'idempotency_keys', 'key', 'text', 'key is text');
SELECT col_type_is('public', 'idempotency_keys', 'request_hash', 'bytea', 'request_hash is bytea');
SELECT col_type_is('public', 'idempotency_keys', 'response_body', 'jsonb', 'response_body is jsonb');
SELECT col_type_is('public', 'idempotency_keys', 'response_headers', 'jsonb', 'response_headers is jsonb');
SELECT col_type_is('public', 'idempotency_keys', 'expires_at', 'timestamp with time zone', 'expires_at is timestamp with time zone');
SELECT col_not_null('public', 'idempotency_keys', 'expires_at', 'expires_at is NOT NULL');
SELECT col_not_null('public', 'idempotency_keys', 'request_hash', 'request_hash is NOT NULL');
SELECT col_is_pk('public', 'idempotency_keys', ARRAY['key', 'scope'], 'the primary key is (key, scope)');
SELECT is(
    (SELECT array_agg(collname ORDER BY attnum) FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
     WHERE attrelid = 'public.idempotency_keys'::regclass AND attname IN ('scope', 'key')),
    ARRAY['C']::name[] || ARRAY['C']::name[], 'scope and key compare bytewise (COLLATE "C")');

-- Privileges: PUBLIC has nothing on the table; the functions are executable by anyone.
SELECT table_privs_are('public', 'idempotency_keys', 'public', ARRAY[]::text[],
                       'PUBLIC has no privilege on idempotency_keys');
SELECT function_privs_are('public', 'idem_claim', ARRAY['text', 'text', 'interval', 'text'], 'public',
                          ARRAY['EXECUTE']);
SELECT function_privs_are('public', 'idem_hash', ARRAY['text'], 'public', ARRAY['EXECUTE']);

-- The extension owns its objects and pg_dump keeps the keys.
-- The plain script makes no extension: its tables are no extension's members, and pg_dump dumps them as tables.
SELECT CASE WHEN (SELECT extension FROM contract_edition) THEN is(
    (SELECT extconfig FROM pg_extension WHERE extname = 'idempotency'),
    ARRAY['public.idempotency_keys'::regclass::oid, 'public.idempotency_keys_partitioned_default'::regclass::oid,
          'public.idempotency_fencing_numbers'::regclass::oid, 'public.idempotency_tombstones'::regclass::oid],
    'the keys of both storage modes, the fencing numbers'' position and the tombstones are dumped by pg_dump')
    ELSE is(
    (SELECT count(*)::int FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.deptype = 'e'
       AND d.objid IN ('public.idempotency_keys'::regclass, 'public.idempotency_keys_partitioned_default'::regclass,
                       'public.idempotency_fencing_numbers'::regclass, 'public.idempotency_tombstones'::regclass)),
    0, 'the plain script: the keys, the fencing numbers'' position and the tombstones are plain tables pg_dump dumps')
    END;
SELECT is(
    (SELECT extrelocatable FROM pg_extension WHERE extname = 'idempotency'),
    CASE WHEN (SELECT extension FROM contract_edition) THEN false END,
    'the extension is not relocatable (its functions find the table in its own schema; the plain script makes none)');

-- Expiry and storage functions.
SELECT has_function('public', 'idem_cleanup', ARRAY[]::text[]);
SELECT function_returns('public', 'idem_cleanup', ARRAY[]::text[], 'bigint');
SELECT has_function('public', 'idem_set_storage', ARRAY['text', 'interval']);
SELECT function_returns('public', 'idem_set_storage', ARRAY['text', 'interval'], 'text');
SELECT has_function('public', 'idem_premake_partitions', ARRAY[]::text[]);
SELECT has_function('public', 'idem_drop_expired_partitions', ARRAY[]::text[]);
SELECT has_view('public', 'idem_stats', 'view idem_stats exists');
SELECT columns_are('public', 'idem_stats',
    ARRAY['shared', 'claims', 'replays', 'in_progress', 'mismatches', 'completions_stored', 'released_5xx',
          'releases', 'keys_removed', 'partitions_created', 'partitions_dropped', 'last_sweep_database',
          'last_sweep_started_at', 'last_sweep_duration_ms', 'last_sweep_removed', 'last_error',
          'last_error_database', 'last_error_at', 'stats_reset_at',
          'leases', 'lease_takeovers', 'checkpoints', 'stale_tokens', 'waits', 'sweeps_blocked']);
SELECT has_table('public', 'idempotency_keys_partitioned', 'the partitioned storage table exists');
SELECT is((SELECT relkind FROM pg_class WHERE oid = 'public.idempotency_keys_partitioned'::regclass),
          'p'::"char", 'idempotency_keys_partitioned is range-partitioned');

-- Maintenance functions are for the owner, not for every role.
SELECT function_privs_are('public', 'idem_cleanup', ARRAY[]::text[], 'public', ARRAY[]::text[]);
SELECT function_privs_are('public', 'idem_set_storage', ARRAY['text', 'interval'], 'public', ARRAY[]::text[]);
SELECT function_privs_are('public', 'idem_stats_reset', ARRAY[]::text[], 'public', ARRAY[]::text[]);
SELECT table_privs_are('public', 'idempotency_keys_partitioned', 'public', ARRAY[]::text[],
                       'PUBLIC has no privilege on idempotency_keys_partitioned');

-- Every SQL or PL/pgSQL function pins its search_path; C functions qualify every name they use.
SELECT is(
-- The managed edition's one exception, listed in managed/DIFFERENCES.md: the pg_cron sweep, a procedure that commits
-- after each batch, which PostgreSQL refuses in a routine with a SET clause.
    (SELECT array_agg(p.proname::text || '/' || p.prokind::text ORDER BY p.proname) FROM contract_procs p
     JOIN pg_language l ON l.oid = p.prolang
     WHERE l.lanname <> 'c'
       AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)),
    CASE WHEN NOT (SELECT c FROM contract_edition) THEN ARRAY['idem_managed_sweep/p'] END,
    'every non-C function of the extension has SET search_path = pg_catalog, pg_temp (managed: but the sweep procedure)');

-- Settings exist with their documented defaults. The C edition's library defines them; the managed edition's are
-- placeholders, unset until SET (managed/DIFFERENCES.md), and its functions apply the same defaults.
SELECT is(current_setting('idempotency.ttl', true), CASE WHEN (SELECT c FROM contract_edition) THEN '1d' END,
          'idempotency.ttl defaults to 24h (the managed edition: an unset placeholder)');
SELECT is(current_setting('idempotency.mismatch_status', true),
          CASE WHEN (SELECT c FROM contract_edition) THEN '422' END,
          'idempotency.mismatch_status defaults to 422 (the managed edition: an unset placeholder)');
SELECT is((SELECT outcome FROM idem_claim('pgtap-defaults', idem_hash('a'))), 'claimed',
          'a key claimed without a ttl');
SELECT is(idem_complete('pgtap-defaults', 201, '{}', '{}'), true, 'and completed');
SELECT is((SELECT expires_at - created_at FROM idempotency_keys WHERE key = 'pgtap-defaults' AND scope = ''),
          interval '1 day', 'is kept for idempotency.ttl''s default, 24h, in both editions');
SELECT results_eq($$SELECT outcome, http_status FROM idem_claim('pgtap-defaults', idem_hash('b'))$$,
                  $$VALUES ('mismatch'::text, 422)$$,
                  'another request hash answers idempotency.mismatch_status''s default, 422, in both editions');


-- 1.1: lease mode and the bounded wait, under names of their own (the 1.0 signatures stay as they were).
SELECT has_function('public', 'idem_lease', ARRAY['text', 'text', 'interval', 'interval', 'text', 'interval']);
SELECT function_returns('public', 'idem_lease', ARRAY['text', 'text', 'interval', 'interval', 'text', 'interval'],
                        'idem_lease_result');
SELECT has_function('public', 'idem_lease_extend', ARRAY['text', 'uuid', 'interval', 'text']);
SELECT function_returns('public', 'idem_lease_extend', ARRAY['text', 'uuid', 'interval', 'text'], 'timestamp with time zone');
SELECT has_function('public', 'idem_checkpoint', ARRAY['text', 'uuid', 'text', 'jsonb', 'text']);
SELECT has_function('public', 'idem_lease_complete', ARRAY['text', 'uuid', 'integer', 'jsonb', 'jsonb', 'text']);
SELECT function_returns('public', 'idem_lease_complete', ARRAY['text', 'uuid', 'integer', 'jsonb', 'jsonb', 'text'], 'boolean');
SELECT has_function('public', 'idem_lease_release', ARRAY['text', 'uuid', 'text']);
SELECT has_function('public', 'idem_hash', ARRAY['jsonb', 'text[]']);
SELECT has_function('public', 'idem_claim_wait', ARRAY['text', 'text', 'interval', 'interval', 'text']);
SELECT function_returns('public', 'idem_claim_wait', ARRAY['text', 'text', 'interval', 'interval', 'text'], 'idem_claim_result');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_claim'), 1,
          'idem_claim has one signature: untyped calls from 1.0 clients stay unambiguous');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_complete'), 1,
          'idem_complete has one signature');
SELECT is((SELECT extversion FROM pg_extension WHERE extname = 'idempotency'),
          CASE WHEN (SELECT extension FROM contract_edition) THEN '1.4' END,
          'a fresh install is at 1.4 (the plain script makes no extension)');

-- 1.1: keys in flight, for operators. Both run as the caller (privileges and row level security of the key
-- table apply inside), so PUBLIC may execute them.
SELECT has_function('public', 'idem_keys_in_flight', ARRAY[]::text[]);
SELECT has_function('public', 'idem_keys_in_flight_claims', ARRAY[]::text[]);
SELECT is(
    (SELECT array_agg(a.n || ' ' || format_type(a.t, NULL) ORDER BY a.o)
     FROM pg_proc p, unnest(p.proargnames, p.proallargtypes, p.proargmodes) WITH ORDINALITY AS a(n, t, m, o)
     WHERE p.oid = 'public.idem_keys_in_flight()'::regprocedure AND a.m = 'o'),
    ARRAY['scope text', 'key text', 'pid integer', 'since timestamp with time zone',
          'lease_until timestamp with time zone', 'holder text'],
    'idem_keys_in_flight result columns, in order');
SELECT is(
    (SELECT array_agg(a.n || ' ' || format_type(a.t, NULL) ORDER BY a.o)
     FROM pg_proc p, unnest(p.proargnames, p.proallargtypes, p.proargmodes) WITH ORDINALITY AS a(n, t, m, o)
     WHERE p.oid = 'public.idem_keys_in_flight_claims()'::regprocedure AND a.m = 'o'),
    ARRAY['scope text', 'key text', 'pid integer', 'since timestamp with time zone'],
    'idem_keys_in_flight_claims result columns, in order');
SELECT volatility_is('public', 'idem_keys_in_flight', ARRAY[]::text[], 'volatile');
SELECT function_privs_are('public', 'idem_keys_in_flight', ARRAY[]::text[], 'public', ARRAY['EXECUTE']);
SELECT function_privs_are('public', 'idem_keys_in_flight_claims', ARRAY[]::text[], 'public', ARRAY['EXECUTE']);

-- 1.2: nothing bound by name at call time, counters for operators only, fencing numbers.
SELECT is(
    (SELECT array_agg(p.proname::text ORDER BY p.proname) FROM contract_procs p
     WHERE p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'sql') AND p.prosqlbody IS NULL),
    NULL, 'every SQL-language function has a BEGIN ATOMIC body, bound when created');
-- The managed edition's bodies name the schema they were created in (managed/DIFFERENCES.md: a renamed schema is
-- not followed), since the plain script has no pg_extension row to find it by: none looks the extension up but
-- the Citus helpers (Citus is not for the plain script).
SELECT CASE WHEN (SELECT c FROM contract_edition) THEN is(
    (SELECT array_agg(p.proname::text ORDER BY p.proname) FROM contract_procs p
     WHERE p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')
       AND (p.prosrc LIKE '%public.%' OR p.prosrc NOT LIKE '%pg_catalog.pg_extension e%')),
    NULL, 'no PL/pgSQL body names the schema; each finds it by OID through pg_extension')
    ELSE is(
    (SELECT array_agg(p.proname::text ORDER BY p.proname) FROM contract_procs p
     WHERE p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')
       AND p.prosrc ~ 'extname[^;]*''idempotency'''),
    ARRAY['idem_citus_distribute', 'idem_citus_fencing_before_move', 'idem_citus_stats'],
    'the managed edition: no PL/pgSQL body but the Citus helpers'' looks the extension up in pg_extension')
    END;
SELECT is(
    (SELECT array_agg(p.proname::text || '/' || p.prokind::text ORDER BY p.proname) FROM contract_procs p
     WHERE p.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'c')
       AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)),
    CASE WHEN NOT (SELECT c FROM contract_edition) THEN ARRAY['idem_managed_sweep/p'] END,
    'every SQL and PL/pgSQL function pins search_path to pg_catalog, pg_temp (managed: but the sweep procedure)');
-- The managed edition is written in trusted languages only (issue 40): nothing a managed service refuses.
SELECT is(
    (SELECT array_agg(DISTINCT l.lanname::text ORDER BY l.lanname::text) FROM contract_procs p
     JOIN pg_language l ON l.oid = p.prolang),
    CASE WHEN (SELECT c FROM contract_edition) THEN ARRAY['c', 'plpgsql', 'sql'] ELSE ARRAY['plpgsql', 'sql'] END,
    'the languages of the edition''s routines (managed: SQL and PL/pgSQL only)');
SELECT function_privs_are('public', 'idem_stats_read', ARRAY[]::text[], 'public', ARRAY[]::text[],
                          'idem_stats_read() is not executable by PUBLIC');
SELECT function_privs_are('public', 'idem_stats_read', ARRAY[]::text[], 'pg_monitor', ARRAY['EXECUTE']);
SELECT table_privs_are('public', 'idem_stats', 'pg_monitor', ARRAY['SELECT']);
SELECT is(
    (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
     WHERE a.attrelid = (SELECT typrelid FROM pg_type WHERE typname = 'idem_lease_result')
       AND a.attname = 'fencing_number'),
    'bigint', 'idem_lease returns a bigint fencing_number');
SELECT is(
    (SELECT array_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum) FROM pg_attribute a
     WHERE a.attrelid = (SELECT typrelid FROM pg_type WHERE typname = 'idem_lease_result') AND a.attnum > 9),
    ARRAY['fencing_number bigint', 'response_content_type text', 'response_bytes bytea'],
    'idem_lease_result ends with fencing_number (1.2), then the replay''s content type and bytes (1.3)');

-- 1.3: the partitions' upkeep in C, with bounds read as values; the maintenance functions pin search_path too.
SELECT function_lang_is('public', 'idem_partitions', ARRAY[]::text[],
                        (SELECT CASE WHEN c THEN 'c' ELSE 'sql' END FROM contract_edition)::name);
SELECT function_lang_is('public', 'idem_premake_partitions', ARRAY[]::text[],
                        (SELECT CASE WHEN c THEN 'c' ELSE 'plpgsql' END FROM contract_edition)::name);
SELECT function_lang_is('public', 'idem_drop_expired_partitions', ARRAY[]::text[],
                        (SELECT CASE WHEN c THEN 'c' ELSE 'plpgsql' END FROM contract_edition)::name);
SELECT volatility_is('public', 'idem_partitions', ARRAY[]::text[], 'stable');
SELECT volatility_is('public', 'idem_premake_partitions', ARRAY[]::text[], 'volatile');
SELECT volatility_is('public', 'idem_drop_expired_partitions', ARRAY[]::text[], 'volatile');
SELECT ok(NOT EXISTS (SELECT FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef
                  AND p.proname IN ('idem_partitions', 'idem_premake_partitions', 'idem_drop_expired_partitions',
                                    'idem_create_partition', 'idem_set_storage')),
          'the maintenance functions are not SECURITY DEFINER');
SELECT is((SELECT pg_catalog.array_agg(p.proname::text ORDER BY p.proname) FROM pg_proc p
           WHERE p.pronamespace = 'public'::regnamespace
             AND p.proname IN ('idem_partitions', 'idem_premake_partitions', 'idem_drop_expired_partitions')
             AND 'search_path=pg_catalog, pg_temp' = ANY (p.proconfig)),
          ARRAY['idem_drop_expired_partitions', 'idem_partitions', 'idem_premake_partitions'],
          'the 1.3 C maintenance functions pin search_path');
SELECT is((SELECT p.proconfig FROM pg_proc p
           WHERE p.oid = 'public.idem_create_partition(timestamptz, timestamptz)'::regprocedure),
          ARRAY['search_path=pg_catalog, pg_temp', 'lock_timeout=0', 'DateStyle=ISO, YMD', 'IntervalStyle=postgres',
                'TimeZone=UTC', 'default_tablespace='],
          'idem_create_partition pins the settings that print or place what it makes');

-- 1.3: no function calls another function of the extension by name. idem_set_storage is in C (idem_create_partition
-- by OID), idem_keys_in_flight has an SQL-standard body bound to its two parts by OID; a PL/pgSQL body names a
-- function of the extension only in the SQL it sends to the other nodes of a Citus cluster.
SELECT function_lang_is('public', 'idem_set_storage', ARRAY['text', 'interval'],
                        (SELECT CASE WHEN c THEN 'c' ELSE 'plpgsql' END FROM contract_edition)::name);
SELECT isnt_strict('public', 'idem_set_storage', ARRAY['text', 'interval']);
SELECT volatility_is('public', 'idem_set_storage', ARRAY['text', 'interval'], 'volatile');
SELECT is((SELECT p.proconfig FROM pg_proc p WHERE p.oid = 'public.idem_set_storage(text, interval)'::regprocedure),
          ARRAY['search_path=pg_catalog, pg_temp', 'DateStyle=ISO, YMD', 'TimeZone=UTC'],
          'idem_set_storage pins search_path, DateStyle and TimeZone');
SELECT function_lang_is('public', 'idem_keys_in_flight', ARRAY[]::text[], 'sql');
SELECT has_function('public', 'idem_keys_in_flight_rest', ARRAY[]::text[]);
SELECT function_lang_is('public', 'idem_keys_in_flight_rest', ARRAY[]::text[], 'plpgsql');
SELECT volatility_is('public', 'idem_keys_in_flight_rest', ARRAY[]::text[], 'volatile');
SELECT function_privs_are('public', 'idem_keys_in_flight_rest', ARRAY[]::text[], 'public', ARRAY['EXECUTE']);
SELECT is(
    (SELECT array_agg(a.n || ' ' || format_type(a.t, NULL) ORDER BY a.o)
     FROM pg_proc p, unnest(p.proargnames, p.proallargtypes, p.proargmodes) WITH ORDINALITY AS a(n, t, m, o)
     WHERE p.oid = 'public.idem_keys_in_flight_rest()'::regprocedure AND a.m = 'o'),
    ARRAY['scope text', 'key text', 'pid integer', 'since timestamp with time zone',
          'lease_until timestamp with time zone', 'holder text'],
    'idem_keys_in_flight_rest result columns, in order (those of idem_keys_in_flight)');
SELECT is(
    (SELECT array_agg(d.refobjid::regprocedure::text ORDER BY d.refobjid::regprocedure::text) FROM pg_depend d
     WHERE d.classid = 'pg_proc'::regclass AND d.objid = 'public.idem_keys_in_flight()'::regprocedure
       AND d.refclassid = 'pg_proc'::regclass AND d.deptype = 'n'),
    ARRAY['idem_keys_in_flight_claims()', 'idem_keys_in_flight_rest()'],
    'idem_keys_in_flight is bound by OID to idem_keys_in_flight_claims() and idem_keys_in_flight_rest()');
SELECT is(
    (SELECT array_agg(p.proname::text ORDER BY p.proname) FROM contract_procs p
     WHERE p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')
       AND p.prosrc ~ '%s\.idem_'),
    CASE WHEN (SELECT c FROM contract_edition) THEN ARRAY['idem_citus_stats', 'idem_keys_in_flight_rest']
         ELSE ARRAY['idem_citus_stats'] END,
    'PL/pgSQL bodies name the extension''s objects in dynamic SQL only in what they send to other Citus nodes '
    '(the managed edition''s idem_keys_in_flight_rest lists no other node''s claims: managed/DIFFERENCES.md)');

-- 1.3, the lean request (issue 30): four functions of one signature each (a prepared statement needs no
-- casts), the claim's row type, the bytes columns in both tables.
SELECT has_function('public', 'idem_fingerprint', ARRAY['text', 'text', 'text', 'text', 'bytea']);
SELECT function_returns('public', 'idem_fingerprint', ARRAY['text', 'text', 'text', 'text', 'bytea'], 'text');
SELECT volatility_is('public', 'idem_fingerprint', ARRAY['text', 'text', 'text', 'text', 'bytea'], 'immutable');
SELECT isnt_strict('public', 'idem_fingerprint', ARRAY['text', 'text', 'text', 'text', 'bytea']);
SELECT has_function('public', 'idem_claim_request',
                    ARRAY['text', 'text', 'text', 'text', 'text', 'text', 'bytea', 'interval']);
SELECT function_returns('public', 'idem_claim_request',
                        ARRAY['text', 'text', 'text', 'text', 'text', 'text', 'bytea', 'interval'], 'idem_request_claim');
SELECT volatility_is('public', 'idem_claim_request',
                     ARRAY['text', 'text', 'text', 'text', 'text', 'text', 'bytea', 'interval'], 'volatile');
SELECT has_function('public', 'idem_complete_request', ARRAY['text', 'text', 'integer', 'text', 'jsonb', 'bytea']);
SELECT function_returns('public', 'idem_complete_request', ARRAY['text', 'text', 'integer', 'text', 'jsonb', 'bytea'],
                        'boolean');
SELECT has_function('public', 'idem_lease_complete_request',
                    ARRAY['text', 'text', 'uuid', 'integer', 'text', 'jsonb', 'bytea']);
SELECT function_returns('public', 'idem_lease_complete_request',
                        ARRAY['text', 'text', 'uuid', 'integer', 'text', 'jsonb', 'bytea'], 'boolean');
SELECT volatility_is('public', 'idem_lease_complete_request',
                     ARRAY['text', 'text', 'uuid', 'integer', 'text', 'jsonb', 'bytea'], 'volatile');
SELECT is((SELECT array_agg(proname::text || '/' || pronargs || '/' || pronargdefaults ORDER BY proname) FROM pg_proc
           WHERE proname IN ('idem_fingerprint', 'idem_claim_request', 'idem_complete_request',
                             'idem_lease_complete_request')),
          ARRAY['idem_claim_request/8/1', 'idem_complete_request/6/0', 'idem_fingerprint/5/0',
                'idem_lease_complete_request/7/0'],
          'one signature each; only the claim''s ttl has a default');
SELECT is(
    (SELECT array_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum)
     FROM pg_attribute a WHERE a.attrelid = 'public.idem_request_claim'::regclass AND a.attnum > 0),
    ARRAY['outcome text', 'http_status integer', 'content_type text', 'headers jsonb', 'body bytea'],
    'idem_request_claim fields, in order');
SELECT col_type_is('public', 'idempotency_keys', 'response_content_type', 'text', 'response_content_type is text');
SELECT col_type_is('public', 'idempotency_keys', 'response_bytes', 'bytea', 'response_bytes is bytea');
SELECT col_is_null('public', 'idempotency_keys', 'response_bytes', 'response_bytes is nullable');
SELECT col_hasnt_default('public', 'idempotency_keys', 'response_bytes', 'response_bytes has no default (no rewrite)');
SELECT col_type_is('public', 'idempotency_keys_partitioned', 'response_bytes', 'bytea',
                   'the partitioned table has response_bytes');
SELECT col_type_is('public', 'idempotency_keys_partitioned_default', 'response_content_type', 'text',
                   'its partitions have response_content_type');

-- 1.4 (issue 38): each key row keeps its last fencing number, nullable and without a default (no rewrite, and the
-- direct insert leaves it NULL); a grant's number is above the clock's microseconds since 2000.
SELECT col_type_is('public', 'idempotency_keys', 'fencing_number', 'bigint', 'fencing_number is bigint');
SELECT col_is_null('public', 'idempotency_keys', 'fencing_number', 'fencing_number is nullable');
SELECT col_hasnt_default('public', 'idempotency_keys', 'fencing_number', 'fencing_number has no default');
SELECT col_type_is('public', 'idempotency_keys_partitioned_default', 'fencing_number', 'bigint',
                   'the partitions have fencing_number');
SELECT cmp_ok((SELECT fencing_number FROM idem_lease('pgtap-fence', idem_hash('f'), '1 min')),
              '>=', (extract(epoch FROM statement_timestamp() - timestamptz '2000-01-01 00:00+00') * 1000000)::bigint,
              'a grant''s fencing number is at least the clock in microseconds since 2000');

-- 1.4 (issue 41): tombstones, a compact table of keys whose response expired; 'expired' is a claim outcome.
SELECT has_table('public', 'idempotency_tombstones', 'table idempotency_tombstones exists');
SELECT columns_are('public', 'idempotency_tombstones', ARRAY['expired_at', 'scope', 'key', 'request_hash'],
                   'a tombstone keeps no response');
SELECT col_is_pk('public', 'idempotency_tombstones', ARRAY['key', 'scope'], 'one tombstone per key, as the keys');
SELECT table_privs_are('public', 'idempotency_tombstones', 'public', ARRAY[]::text[],
                       'PUBLIC has no privilege on idempotency_tombstones');
SELECT is(current_setting('idempotency.tombstone_ttl', true),
          CASE WHEN (SELECT c FROM contract_edition) THEN '0' END,
          'tombstones are off by default (the managed edition: an unset placeholder)');
INSERT INTO idempotency_keys (expires_at, created_at, http_status, scope, key, request_hash)
    VALUES (now() - interval '1 minute', now() - interval '1 day', 200, '', 'pgtap-expired', sha256('e'));
SELECT is((SELECT outcome FROM idem_claim('pgtap-expired', idem_hash('e'))), 'claimed',
          'with tombstones off, an expired key is claimed again, not answered expired, in both editions');

SELECT * FROM finish();
ROLLBACK;
