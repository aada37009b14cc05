-- The attack suites' SQL-level cases (issue 40 item 7), run against both editions: objects planted where the
-- functions could find them, settings a caller picks, another tenant, a role without grants, catalog markings,
-- bad bytes. The same requests (sql/include/attack_battery.sql) give the same answers and store the same rows
-- with and without each of them; search_path_safety, lease_rls, in_flight, bad_input and isolation
-- scopes_isolated cover the rest.
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
CREATE TABLE attack_fencing (n serial, scope text, fencing bigint);
-- The fencing sequence's position, given back at the end (caches.sql shows it).
CREATE TABLE attack_sequence AS SELECT last_value, is_called FROM idempotency_fencing_numbers;
-- The edition's routines: schema public's idem_* (the extension's, or the plain script's).
CREATE VIEW attack_routines AS
    SELECT p.oid, p.proname, p.prokind, p.prosecdef, p.proconfig, l.lanname
    FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
    WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%';

-- 1. Catalog: nothing runs with its owner's rights, and every SQL and PL/pgSQL routine pins its search_path but
-- the managed edition's pg_cron sweep, a procedure that commits (managed/DIFFERENCES.md); C functions qualify
-- every name they use.
SELECT count(*) AS security_definer FROM attack_routines WHERE prosecdef;
SELECT coalesce(array_agg(proname::text || '/' || prokind::text), '{}') <@ ARRAY['idem_managed_sweep/p']
    AS only_the_sweep_unpinned
FROM attack_routines
WHERE lanname <> 'c' AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (proconfig), false);

-- 2. The requests without any attack: the answers every run below must give again.
\set scope base
\i :abs_srcdir/sql/include/attack_battery.sql
DROP TABLE pg_temp.attack_lease;

-- 3. Planted objects, first on the caller's search_path: every routine of the edition again in schema attack, with
-- the catalog functions the edition's bodies call and the ones a key store would (time, digests, locks,
-- settings, sequences), and the comparison, concatenation and arithmetic operators of the types it handles; each
-- warns when called. In pg_temp, which every pinned search_path still holds, a table, view or sequence of each
-- name the edition has, the key tables holding forged rows of the battery's keys.
-- A new session, so that every function of the edition is compiled under them (PL/pgSQL compiles a function once a
-- session and keeps the types it looked up).
\c -
CREATE SCHEMA attack;
CREATE FUNCTION attack.warn(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'attack: % called', what;
END $$;
CREATE FUNCTION attack.checked(what text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'attack: a value of domain % made', what;
    RETURN true;
END $$;
DO $plant$
DECLARE
    f record;
    made int := 0;
    body text;
BEGIN
    FOR f IN
        SELECT p.oid, p.proname, p.prokind, pg_catalog.pg_get_function_arguments(p.oid) AS args,
               pg_catalog.pg_get_function_result(p.oid) AS result, p.proretset, p.proallargtypes IS NOT NULL AS outs
        FROM pg_catalog.pg_proc p
        WHERE (p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%')
           OR (p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind = 'f'
               AND (p.proname IN ('now', 'clock_timestamp', 'statement_timestamp', 'transaction_timestamp',
                                  'sha256', 'md5', 'encode', 'decode', 'hashtext', 'hashtextextended',
                                  'pg_try_advisory_xact_lock', 'pg_advisory_xact_lock', 'pg_try_advisory_lock',
                                  'set_config', 'current_setting', 'gen_random_uuid', 'nextval', 'currval',
                                  'setval', 'length', 'octet_length', 'convert_to', 'convert_from', 'lower',
                                  'upper', 'btrim', 'jsonb_build_object', 'to_jsonb', 'date_bin', 'pg_sleep',
                                  'quote_ident', 'quote_literal', 'left', 'substr', 'strpos', 'replace',
                                  'regexp_match', 'jsonb_typeof', 'pg_backend_pid', 'txid_current',
                                  'pg_current_xact_id', 'to_regclass', 'make_interval', 'date_trunc')
                    OR EXISTS (SELECT FROM pg_catalog.pg_proc b
                               WHERE b.pronamespace = 'public'::regnamespace AND b.proname LIKE 'idem\_%'
                                 AND b.prosrc ~ ('\m' || p.proname || '\('))))
    LOOP
        body := CASE WHEN f.prokind = 'p' THEN 'PERFORM attack.warn(%L);'
                     WHEN f.proretset OR f.outs OR f.result = 'void' THEN 'PERFORM attack.warn(%L); RETURN;'
                     ELSE 'PERFORM attack.warn(%L); RETURN NULL;' END;
        BEGIN
            EXECUTE pg_catalog.format('CREATE %s attack.%I(%s) %s LANGUAGE plpgsql AS %L',
                CASE WHEN f.prokind = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, f.proname, f.args,
                CASE WHEN f.prokind = 'p' THEN '' ELSE 'RETURNS ' || f.result END,
                'BEGIN ' || pg_catalog.format(body, f.proname || '(' || f.args || ')') || ' END');
            made := made + 1;
        EXCEPTION WHEN OTHERS THEN
            NULL;  -- polymorphic and internal signatures cannot be written in PL/pgSQL: not planted
        END;
    END LOOP;
    -- Operators.
    FOR f IN
        SELECT o.oid, o.oprname, o.oprleft::regtype AS l, o.oprright::regtype AS r, o.oprresult::regtype AS res
        FROM pg_catalog.pg_operator o
        WHERE o.oprnamespace = 'pg_catalog'::regnamespace AND o.oprkind = 'b'
          AND o.oprname IN ('=', '<>', '<', '>', '<=', '>=', '||', '+', '-', '->', '->>', '?', '@>', '~', '~~')
          AND o.oprleft IN ('text'::regtype, 'bytea'::regtype, 'timestamptz'::regtype, 'interval'::regtype,
                            'bigint'::regtype, 'integer'::regtype, 'uuid'::regtype, 'jsonb'::regtype,
                            'boolean'::regtype, 'name'::regtype, 'oid'::regtype, 'tid'::regtype)
          AND o.oprright NOT IN ('anyelement'::regtype, 'anynonarray'::regtype, 'anyarray'::regtype)
    LOOP
        EXECUTE pg_catalog.format('CREATE FUNCTION attack.op_%s(%s, %s) RETURNS %s LANGUAGE plpgsql AS %L',
            f.oid, f.l, f.r, f.res,
            pg_catalog.format('BEGIN PERFORM attack.warn(%L); RETURN NULL; END', f.l || ' ' || f.oprname || ' ' || f.r));
        EXECUTE pg_catalog.format('CREATE OPERATOR attack.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = attack.op_%s)',
            f.oprname, f.l, f.r, f.oid);
        made := made + 1;
    END LOOP;
    -- Types: a domain of each name a body could look up (the keywords' types, such as integer and interval, are
    -- pg_catalog's whatever the search_path), its check warning whenever a value is made one of it.
    FOR f IN
        SELECT t.n, CASE WHEN t.n = 'record' THEN 'int4' ELSE t.n END AS base
        FROM unnest(ARRAY['text', 'bytea', 'uuid', 'jsonb', 'json', 'tid', 'timestamptz', 'int4', 'int8', 'bool',
                          'float8', 'name', 'oid', 'regclass', 'numeric', 'record']) AS t(n)
    LOOP
        EXECUTE pg_catalog.format('CREATE DOMAIN attack.%I AS pg_catalog.%I CHECK (attack.checked(%L) OR VALUE IS NULL)',
                                  f.n, f.base, f.n);
        made := made + 1;
    END LOOP;
    -- pg_temp: each relation's name.
    FOR f IN
        SELECT c.relname, c.relkind FROM pg_catalog.pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
          AND (c.relname LIKE 'idempotency\_%' OR c.relname LIKE 'idem\_%')
    LOOP
        IF f.relkind = 'S' THEN
            EXECUTE pg_catalog.format('CREATE TEMP SEQUENCE %I', f.relname);
        ELSE
            EXECUTE pg_catalog.format('CREATE TEMP TABLE %I (LIKE public.%I)', f.relname, f.relname);
        END IF;
        made := made + 1;
    END LOOP;
    -- In the edition's own schema: an overload of each routine taking text, with varchar where it takes text,
    -- that a call between the edition's routines would reach if it passed other types than it declares.
    FOR f IN
        SELECT p.proname, p.prokind, pg_catalog.pg_get_function_arguments(p.oid) AS args,
               pg_catalog.pg_get_function_result(p.oid) AS result, p.proretset,
               p.proallargtypes IS NOT NULL AS outs
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
          AND 'text'::regtype = ANY (p.proargtypes::oid[])
    LOOP
        body := CASE WHEN f.prokind = 'p' THEN 'PERFORM attack.warn(%L);'
                     WHEN f.proretset OR f.outs OR f.result = 'void' THEN 'PERFORM attack.warn(%L); RETURN;'
                     ELSE 'PERFORM attack.warn(%L); RETURN NULL;' END;
        BEGIN
            EXECUTE pg_catalog.format('CREATE %s public.%I(%s) %s LANGUAGE plpgsql AS %L',
                CASE WHEN f.prokind = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, f.proname,
                regexp_replace(f.args, '\mtext\M', 'varchar', 'g'),
                CASE WHEN f.prokind = 'p' THEN '' ELSE 'RETURNS ' || f.result END,
                'BEGIN ' || pg_catalog.format(body, 'public overload of ' || f.proname) || ' END');
            made := made + 1;
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
    END LOOP;
    RAISE NOTICE 'planted: %', CASE WHEN made > 150 THEN 'more than 150 objects' ELSE made::text END;
END
$plant$;
INSERT INTO pg_temp.idempotency_keys (expires_at, created_at, http_status, scope, key, request_hash, response_body,
                                      response_headers, response_content_type, response_bytes)
SELECT now() + interval '1 day', now(), 299, 'evil', k, decode(idem_hash(h), 'hex'), '"forged"', '{}', 'text/forged',
       '\x666f72676564'
FROM (VALUES ('pay', 'a'), ('ride', 'r'), ('gone', 'g'), ('held', 'h'), ('old', 'o')) v(k, h);
INSERT INTO pg_temp.idempotency_keys (expires_at, created_at, http_status, scope, key, request_hash,
                                      response_content_type, response_bytes)
SELECT now() + interval '1 day', now(), 299, 'evil', 'page',
       decode(idem_fingerprint('POST', '/pages', 'q=1', 'application/json', '{"n": 1.50}'), 'hex'), 'text/forged',
       '\x666f72676564';
INSERT INTO pg_temp.idempotency_tombstones SELECT now(), scope, key, request_hash FROM pg_temp.idempotency_keys;
SELECT count(*) AS forged_rows FROM pg_temp.idempotency_keys;

-- The managed edition's sweep reads its pace from a placeholder setting a session may set (the C edition's is the
-- server's, refused here): set, so that the sweep reads it.
DO $$
BEGIN
    PERFORM set_config('idempotency.cleanup_keys_per_second', '0', false);
EXCEPTION WHEN OTHERS THEN
    NULL;
END $$;
SET search_path = attack, pg_temp, pg_catalog, public;
\set scope evil
\i :abs_srcdir/sql/include/attack_battery.sql
RESET search_path;
DROP TABLE pg_temp.attack_lease;
-- The overloads go: they are no member of schema attack.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT p.oid::regprocedure AS routine, p.prokind FROM pg_proc p
             WHERE p.pronamespace = 'public'::regnamespace AND p.prosrc LIKE '%attack.warn%'
    LOOP
        EXECUTE format('DROP %s %s', CASE WHEN r.prokind = 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, r.routine);
    END LOOP;
END $$;
-- The planted objects hold what they held.
SELECT count(*) AS forged_rows_left, count(*) FILTER (WHERE http_status = 299) AS still_forged
FROM pg_temp.idempotency_keys;
SELECT count(*) AS temp_tombstones FROM pg_temp.idempotency_tombstones;
SELECT last_value AS temp_sequence_untouched FROM pg_temp.idempotency_fencing_numbers;

-- 4. Settings a caller picks, set before any function of the edition is first called in the session (PL/pgSQL
-- compiles a function once per session, under the settings of that moment): how values print and parse, the
-- planner's choices, the empty search_path, PL/pgSQL's own options.
\c -
SET DateStyle = 'SQL, DMY';
SET TimeZone = 'Pacific/Chatham';
SET IntervalStyle = 'sql_standard';
SET bytea_output = 'escape';
SET extra_float_digits = -15;
SET standard_conforming_strings = off;
SET escape_string_warning = off;
SET array_nulls = off;
SET transform_null_equals = on;
SET default_tablespace = pg_global;
SET lc_monetary = 'C.utf8';
SET lc_numeric = 'C.utf8';
SET lc_time = 'C.utf8';
SET search_path = '';
SET plpgsql.variable_conflict = use_column;
SET plpgsql.extra_errors = 'all';
SET session_replication_role = replica;
SET xmloption = document;
\set scope settings
\i :abs_srcdir/sql/include/attack_battery.sql
\c -
SET enable_indexscan = off;
SET enable_indexonlyscan = off;
SET enable_bitmapscan = off;
SET enable_seqscan = off;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_partition_pruning = off;
SET plan_cache_mode = force_generic_plan;
-- force_parallel_mode is debug_parallel_query from PostgreSQL 16 on.
SELECT pg_catalog.set_config(CASE WHEN pg_catalog.current_setting('server_version_num')::int >= 160000
                                  THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'on', false) AS forced;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET jit = on;
SET jit_above_cost = 0;
SET from_collapse_limit = 1;
SET join_collapse_limit = 1;
SET default_transaction_isolation = 'read committed';
\set scope planner
\i :abs_srcdir/sql/include/attack_battery.sql
\c -

-- Every run stored the same rows (their scopes aside), each kept for the same time.
SELECT key, count(*) AS runs,
       count(DISTINCT (http_status, response_body::text, response_headers::text, encode(request_hash, 'hex'),
                       response_content_type, encode(response_bytes, 'hex'), recovery_point,
                       recovery_state::text, lease_until IS NULL, lease_token IS NULL)) AS distinct_rows,
       max(expires_at - created_at) - min(expires_at - created_at) < interval '1 minute' AS same_lifetime
FROM idempotency_keys GROUP BY key ORDER BY key;
SELECT count(*) AS not_in_a_run FROM idempotency_keys WHERE scope NOT IN ('base', 'evil', 'settings', 'planner');
-- Fencing numbers: above the clock's microseconds since 2000, and rising run after run.
SELECT scope, fencing >= (extract(epoch FROM statement_timestamp() - interval '1 hour'
                                  - timestamptz '2000-01-01 00:00+00') * 1000000)::bigint AS above_the_clock,
       fencing > coalesce(lag(fencing) OVER (ORDER BY n), 0) AS rising
FROM attack_fencing ORDER BY n;
SET client_min_messages = warning;
DROP SCHEMA attack CASCADE;
RESET client_min_messages;

-- 5. Another tenant: the same key in its scope is its own; it cannot complete, release, checkpoint, extend or
-- complete the lease of a key of another scope, nor see it in flight.
BEGIN;
SELECT outcome, http_status FROM idem_claim('pay', idem_hash('a'), scope => 'intruder');
SELECT left(sqlstate_of($$SELECT idem_complete('pay', 200, NULL, NULL, 'base')$$), 5) AS complete_other;
SELECT left(sqlstate_of($$SELECT idem_release('pay', 'base')$$), 5) AS release_other;
ROLLBACK;
CREATE TEMP TABLE held AS
SELECT lease_token FROM idem_lease('tenant-lease', idem_hash('t'), interval '1 min', scope => 'base');
SELECT left(sqlstate_of($$SELECT idem_checkpoint('tenant-lease', (SELECT lease_token FROM held), 'p', '{}', 'intruder')$$), 5)
    AS checkpoint_other;
SELECT left(sqlstate_of($$SELECT idem_lease_extend('tenant-lease', (SELECT lease_token FROM held), interval '1 min', 'intruder')$$), 5)
    AS extend_other;
SELECT left(sqlstate_of($$SELECT idem_lease_complete('tenant-lease', (SELECT lease_token FROM held), 200, '{}', NULL, 'intruder')$$), 5)
    AS complete_lease_other;
SELECT left(sqlstate_of($$SELECT idem_lease_release('tenant-lease', (SELECT lease_token FROM held), 'intruder')$$), 5)
    AS release_lease_other;
SELECT outcome, http_status FROM idem_lease('tenant-lease', idem_hash('t'), interval '1 min', scope => 'intruder');
SELECT scope, key, http_status, lease_until IS NOT NULL AS leased FROM idempotency_keys
WHERE key = 'tenant-lease' ORDER BY scope;

-- 6. A role without grants: 42501 for every function that reads or writes the keys or is for the owner, and
-- nothing changes; the hashes are everyone's.
CREATE TEMP TABLE before AS SELECT * FROM idempotency_keys;
CREATE ROLE attack_nobody NOLOGIN;
GRANT SELECT ON held TO attack_nobody;
SET ROLE attack_nobody;
SELECT left(sqlstate_of($$SELECT idem_claim('pay', idem_hash('a'), scope => 'base')$$), 5) AS claim;
SELECT left(sqlstate_of($$SELECT idem_claim('new', idem_hash('a'), scope => 'base')$$), 5) AS claim_new;
SELECT left(sqlstate_of($$SELECT idem_claim_wait('new', idem_hash('a'), interval '0', scope => 'base')$$), 5) AS claim_wait;
SELECT left(sqlstate_of($$SELECT idem_claim_request('page', 'base', 'POST', '/pages', 'q=1', 'application/json', '{"n": 1.50}')$$), 5)
    AS claim_request;
SELECT left(sqlstate_of($$SELECT idem_lease('new', idem_hash('a'), interval '1 min', scope => 'base')$$), 5) AS lease;
SELECT left(sqlstate_of($$SELECT idem_lease_complete('tenant-lease', (SELECT lease_token FROM held), 200, '{}', NULL, 'base')$$), 5)
    AS lease_complete;
SELECT left(sqlstate_of($$SELECT idem_lease_release('tenant-lease', (SELECT lease_token FROM held), 'base')$$), 5)
    AS lease_release;
SELECT left(sqlstate_of($$SELECT * FROM idem_keys_in_flight()$$), 5) AS keys_in_flight;
SELECT left(sqlstate_of($$SELECT idem_cleanup()$$), 5) AS cleanup;
SELECT left(sqlstate_of($$SELECT idem_set_storage('partitioned')$$), 5) AS set_storage;
SELECT left(sqlstate_of($$SELECT idem_stats_reset()$$), 5) AS stats_reset;
SELECT left(sqlstate_of($$SELECT * FROM idem_stats$$), 5) AS stats;
SELECT left(sqlstate_of($$SELECT count(*) FROM idempotency_keys$$), 5) AS read_keys;
SELECT left(sqlstate_of($$SELECT count(*) FROM idempotency_tombstones$$), 5) AS read_tombstones;
SELECT coalesce((SELECT left(sqlstate_of('CALL public.idem_managed_sweep()'), 5)
                 WHERE to_regprocedure('public.idem_managed_sweep()') IS NOT NULL), '42501') AS managed_sweep;
SELECT idem_hash('a') = idem_hash('a'::bytea) AS hashes_for_all;
RESET ROLE;
SELECT (SELECT count(*) FROM idempotency_keys) AS rows_now, (SELECT count(*) FROM before) AS rows_before,
       NOT EXISTS (SELECT * FROM idempotency_keys EXCEPT SELECT * FROM before) AS unchanged;
DROP TABLE before, held;
DROP ROLE attack_nobody;

-- 7. Row level security (README, "Security"): a tenant naming another tenant's scope cannot read its responses (its
-- claims do not see them, its completion fails with 42501), nor list its lease in flight; the rows stay.
CREATE ROLE attack_tenant NOLOGIN;
GRANT SELECT, INSERT, UPDATE ON idempotency_keys TO attack_tenant;
ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY attack_tenant ON idempotency_keys USING (scope = current_setting('app.tenant'));
SET ROLE attack_tenant;
SET app.tenant = 'alice';
BEGIN;
SELECT outcome FROM idem_claim('rls', idem_hash('a'), scope => 'alice');
SELECT idem_complete('rls', 201, '"alice''s"', NULL, 'alice');
COMMIT;
BEGIN;
SELECT outcome FROM idem_claim_request('rls-bytes', 'alice', 'POST', '/p', NULL, 'text/plain', 'x');
SELECT idem_complete_request('rls-bytes', 'alice', 201, 'text/plain', NULL, 'alice''s bytes');
COMMIT;
SELECT outcome, response_body FROM idem_claim('rls', idem_hash('a'), scope => 'alice');
SELECT outcome FROM idem_lease('rls-lease', idem_hash('l'), interval '1 min', scope => 'alice');
SET app.tenant = 'bob';
SELECT count(*) AS rows_bob_sees FROM idempotency_keys;
BEGIN;
SELECT outcome, response_body FROM idem_claim('rls', idem_hash('a'), scope => 'alice');
SELECT left(sqlstate_of($$SELECT idem_complete('rls', 200, '"bob''s"', NULL, 'alice')$$), 5) AS complete_alices;
ROLLBACK;
BEGIN;
SELECT outcome, body FROM idem_claim_request('rls-bytes', 'alice', 'POST', '/p', NULL, 'text/plain', 'x');
SELECT left(sqlstate_of($$SELECT idem_complete_request('rls-bytes', 'alice', 200, 'text/plain', NULL, 'bob''s')$$), 5)
    AS complete_request_alices;
ROLLBACK;
SELECT left(sqlstate_of($$SELECT idem_lease('rls-lease', idem_hash('l'), interval '1 min', scope => 'alice')$$), 5)
    AS lease_alices;
SELECT count(*) AS alices_in_flight_for_bob FROM idem_keys_in_flight() WHERE scope = 'alice';
RESET ROLE;
RESET app.tenant;
SELECT key, http_status, response_body, convert_from(response_bytes, 'UTF8') AS bytes, lease_until IS NOT NULL AS leased
FROM idempotency_keys WHERE scope = 'alice' ORDER BY key;
DROP POLICY attack_tenant ON idempotency_keys;
ALTER TABLE idempotency_keys NO FORCE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys DISABLE ROW LEVEL SECURITY;
REVOKE ALL ON idempotency_keys FROM attack_tenant;
DROP ROLE attack_tenant;

-- 8. Bad bytes: what the server cannot hold as text never reaches a function (22021); request bodies of any bytes
-- are hashed or refused with a documented SQLSTATE; every refusal writes nothing.
SELECT left(sqlstate_of($$SELECT idem_claim(convert_from('\x6bc0af', 'UTF8'), idem_hash('x'))$$), 5) AS overlong_utf8_key;
SELECT left(sqlstate_of($$SELECT idem_claim('k', idem_hash('x'), NULL, convert_from('\x73ff', 'UTF8'))$$), 5) AS invalid_utf8_scope;
SELECT left(sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', '\xff'::bytea)$$), 5) AS json_body_invalid_utf8;
SELECT left(sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', '\x7b2261223a22c0af227d'::bytea)$$), 5) AS json_body_overlong_utf8;
SELECT left(sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', '\x7b2261223a2200227d'::bytea)$$), 5) AS json_body_raw_nul;
SELECT left(sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', convert_to('{"a": "\u0000"}', 'UTF8'))$$), 5) AS json_body_escaped_nul;
SELECT idem_fingerprint('POST', '/p', NULL, 'application/octet-stream', '\x00ffc0af00'::bytea) AS bytes_body_any_bytes;
SELECT left(sqlstate_of($$SELECT idem_claim_request('nul', '', 'POST', '/p', NULL, 'application/json', '\x7b2261223a2200227d'::bytea)$$), 5)
    AS claim_request_raw_nul;
SELECT left(sqlstate_of($$SELECT idem_claim_request(repeat('k', 256), '', 'POST', '/p', NULL, NULL, NULL)$$), 5) AS overlong_key;
SELECT left(sqlstate_of($$SELECT idem_claim_request('k', repeat('s', 256), 'POST', '/p', NULL, NULL, NULL)$$), 5) AS overlong_scope;
SELECT left(sqlstate_of($$SELECT idem_lease(repeat('k', 256), idem_hash('x'), interval '1 min')$$), 5) AS overlong_lease_key;
SELECT left(sqlstate_of($$SELECT idem_lease('k', idem_hash('x'), interval '1 min', scope => repeat('s', 100000))$$), 5)
    AS huge_scope;
SELECT left(sqlstate_of($$SELECT idem_claim(repeat('k', 1000000), idem_hash('x'))$$), 5) AS huge_key;
SELECT left(sqlstate_of($$SELECT idem_fingerprint('POST', '/p', NULL, 'application/json', convert_to(repeat('[', 100000), 'UTF8'))$$), 5)
    AS json_nested_too_deep;
BEGIN;
SELECT outcome FROM idem_claim_request('ct', '', 'POST', '/p', NULL, NULL, NULL);
SELECT left(sqlstate_of($$SELECT idem_complete_request('ct', '', 200, E'text/plain\r\nSet-Cookie: a=b', NULL, NULL)$$), 5)
    AS content_type_with_crlf;
SELECT left(sqlstate_of($$SELECT idem_complete_request('ct', '', 200, 'text/plain', '[1]', NULL)$$), 5)
    AS headers_not_an_object;
ROLLBACK;
SELECT count(*) AS rows_written FROM idempotency_keys WHERE key IN ('nul', 'ct', 'k') OR length(key) > 255;

DROP VIEW attack_routines;
SELECT setval('idempotency_fencing_numbers', last_value, is_called) IS NOT NULL AS sequence_given_back
FROM attack_sequence;
DROP TABLE attack_fencing, attack_sequence;
DROP FUNCTION sqlstate_of(text);
TRUNCATE idempotency_keys;
