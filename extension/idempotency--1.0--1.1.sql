-- idempotency 1.0 -> 1.1.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit
