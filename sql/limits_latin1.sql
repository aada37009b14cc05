-- Key characters in a LATIN1 database (split from limits.sql, issue 40). The file makes a database of its own and
-- runs CREATE EXTENSION there; the managed edition is installed in each database by its own step (pg_tle's
-- registration or the plain script: managed/DIFFERENCES.md, "Installed in each database"), so this file runs
-- on the C edition only (managed/SUPPORTED).
-- Key characters in a LATIN1 database: C1 controls are bytes 80..9F there, and are refused as in UTF-8.
SELECT current_database() AS regress_db \gset
CREATE DATABASE idem_limits_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;
\c idem_limits_latin1
SET client_encoding = 'UTF8';
CREATE EXTENSION idempotency;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
SELECT sqlstate_of($$SELECT idem_claim(U&'next\0085line', idem_hash('a'))$$);
SELECT sqlstate_of($$SELECT idem_claim(U&'csi\009b', idem_hash('a'))$$);
SELECT sqlstate_of($$SELECT idem_claim('k', idem_hash('a'), scope => U&'tenant\0080')$$);
SELECT sqlstate_of($$SELECT idem_claim(U&'caf\00e9-\00c2', idem_hash('a'))$$);
SELECT sqlstate_of($$SELECT idem_claim(E'tab\there', idem_hash('a'))$$);
SELECT count(*) AS rows_written FROM idempotency_keys;
\c :regress_db
DROP DATABASE idem_limits_latin1;
