-- ALTER EXTENSION UPDATE in a session that has used the functions (split from caches.sql, issue 40). The managed
-- edition's first version is 1.4 (managed/DIFFERENCES.md, "No version before 1.4"): this file runs on the C
-- edition only (managed/SUPPORTED).
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
\i :abs_srcdir/sql/include/undated.sql
\i :abs_srcdir/sql/include/caches_functions.sql

-- ALTER EXTENSION UPDATE in the same session: a 1.1 database has no fencing sequence and no bytes columns; after
-- the update to 1.3 the fencing numbers start and a response is stored and replayed as bytes.
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency VERSION '1.1';
SELECT leased('lease at 1.1');
SELECT to_jsonb(l) - 'expires_at' || jsonb_build_object('response_headers', pg_temp.undated(l.response_headers))
       AS replay_at_1_1 FROM idem_lease('lease at 1.1', idem_hash('lease at 1.1'), '1 min') AS l;
SELECT outcome, http_status FROM idem_claim('claim at 1.1', idem_hash('a'));
ALTER EXTENSION idempotency UPDATE TO '1.3';
SELECT to_jsonb(l) - 'expires_at' || jsonb_build_object('response_headers', pg_temp.undated(l.response_headers))
       AS replay_at_1_3 FROM idem_lease('lease at 1.1', idem_hash('lease at 1.1'), '1 min') AS l;
SELECT leased('lease at 1.3');
SELECT request('request at 1.3');
SELECT key, http_status, response_body, response_content_type, convert_from(response_bytes, 'UTF8') AS bytes
FROM idempotency_keys WHERE key IN ('lease at 1.3', 'request at 1.3') ORDER BY key;

-- As the other files expect it.
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
DROP FUNCTION request(text, text);
DROP FUNCTION leased(text, text);
DROP FUNCTION sqlstate_of(text);
