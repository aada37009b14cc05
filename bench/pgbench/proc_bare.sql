-- proc: the request without idempotency in one call (bench.request_bare).
\set acct random(1, 1000)
\set amt random(1, 100000)
SELECT bench.request_bare(:acct, :amt);
