-- idempotency 1.3 -> 1.4: hardening 3, partitioned storage at table speed, tombstones and the 1.4 features.
-- The Makefile appends extension/functions.sql and extension/citus.sql (the SQL-language functions, as the
-- install script defines them), so an updated database and a fresh install define them from the same text.
-- Nothing here drops a view, function, table, type or sequence a user may have granted on or built on
-- (extension/README.md, "What an update step may not do"; test/tap/176_update_keeps_grants.pl checks it).
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.4'" to load this file. \quit
