-- What a backend remembers between calls about where the key table is (split from caches.sql and fast_path.sql,
-- issue 40): the C edition looks for it, per call, in the schema of the calling function, by name, and forgets
-- what it remembered when the table or its schema is renamed or the extension made again. The managed edition
-- names its tables through the schema it was created in (managed/DIFFERENCES.md, "The key table is named
-- through the schema it was created in"), so this file runs on the C edition only (managed/SUPPORTED).
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
\i :abs_srcdir/sql/include/undated.sql
\i :abs_srcdir/sql/include/caches_functions.sql
SELECT request('first'), leased('lease-first');

-- The schema of the calling function: a member function moved to another schema looks for the key table there,
-- and finds none (42P01), though this backend met the function before.
CREATE SCHEMA idem_elsewhere;
ALTER FUNCTION idem_claim_request(text, text, text, text, text, text, bytea, interval) SET SCHEMA idem_elsewhere;
SELECT sqlstate_of($$SELECT idem_elsewhere.idem_claim_request('moved', '', 'POST', '/p', NULL, NULL, NULL)$$);
ALTER FUNCTION idem_elsewhere.idem_claim_request(text, text, text, text, text, text, bytea, interval) SET SCHEMA public;
SELECT request('moved back');

-- The table's OID is remembered per backend, and forgotten when the table is renamed.
BEGIN;
ALTER TABLE idempotency_keys RENAME TO idempotency_keys_renamed;
SELECT sqlstate_of($$SELECT idem_claim('renamed', idem_hash('renamed'))$$);
ROLLBACK;

-- The extension's schema renamed: the statements (lease mode) name the new name.
DROP EXTENSION idempotency;
CREATE SCHEMA idem_s;
CREATE EXTENSION idempotency SCHEMA idem_s;
SELECT request('in s', 'idem_s'), leased('lease in s', 'idem_s');
ALTER SCHEMA idem_s RENAME TO idem_r;
SELECT request('renamed', 'idem_r'), leased('lease renamed', 'idem_r');

-- DROP and CREATE EXTENSION in the same session: new functions, table, index and sequence; the fencing numbers
-- start again from the new sequence.
DROP EXTENSION idempotency;
DROP SCHEMA idem_r;
CREATE EXTENSION idempotency;
SELECT request('made again'), leased('lease made again');

DROP SCHEMA idem_elsewhere;
DROP FUNCTION request(text, text);
DROP FUNCTION leased(text, text);
DROP FUNCTION sqlstate_of(text);
