-- idempotency 1.2 -> 1.3: maintenance that no session setting or planted name can bend, and the lean request.
-- The Makefile appends extension/functions.sql and extension/citus.sql (the SQL-language functions, as the
-- install script defines them), so an updated database and a fresh install define them from the same text.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.3'" to load this file. \quit

