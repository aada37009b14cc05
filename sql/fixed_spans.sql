-- 1.4: a ttl, lease or wait is a fixed duration, as extract(epoch) counts it: a day is 24 hours, a month 30 days,
-- a year (12 months) 365.25 days, whatever the caller's TimeZone. Before 1.4 days and months were added on the
-- calendar of the session's TimeZone: '1 day' lasted 23 or 25 hours across a DST change, and two callers with
-- different TimeZone settings got different expiries for the same ttl. The clock cannot be set here, so the
-- checks that failed before on every date are those with '1 year' (365 or 366 calendar days, never 365.25); those
-- with '1 mon' failed on most dates (the calendar month from now is 28, 29 or 31 days unless the month ahead has
-- 30); those across TimeZones failed only when a DST change fell within the span.
TRUNCATE idempotency_keys;
SET TimeZone = 'America/New_York';

BEGIN;
-- now() is the transaction's start: the spans are exact.
SELECT expires_at - now() AS span, extract(epoch FROM expires_at - now()) AS seconds
FROM idem_claim('s-year', idem_hash('a'), '1 year');
SELECT expires_at - now() AS span, extract(epoch FROM expires_at - now()) AS seconds
FROM idem_claim('s-mon', idem_hash('a'), '1 mon');
SELECT expires_at - now() AS span, extract(epoch FROM expires_at - now()) AS seconds
FROM idem_claim('s-mix', idem_hash('a'), '1 year 1 mon 1 day 1 hour');
SELECT expires_at - now() AS span FROM idem_claim_wait('s-wait', idem_hash('a'), '1 s', '1 day');
-- The same ttl under other TimeZones in the same transaction (the same now()): the same instant.
CREATE TEMP TABLE expiries (tz text, expires_at timestamptz);
INSERT INTO expiries SELECT 'America/New_York', expires_at FROM idem_claim('s-tz-1', idem_hash('a'), '2 mon 1 day');
SET LOCAL TimeZone = 'UTC';
INSERT INTO expiries SELECT 'UTC', expires_at FROM idem_claim('s-tz-2', idem_hash('a'), '2 mon 1 day');
SET LOCAL TimeZone = 'Australia/Lord_Howe';
INSERT INTO expiries SELECT 'Australia/Lord_Howe', expires_at FROM idem_claim('s-tz-3', idem_hash('a'), '2 mon 1 day');
SET LOCAL TimeZone = 'Asia/Kolkata';
INSERT INTO expiries SELECT 'Asia/Kolkata', expires_at FROM idem_claim('s-tz-4', idem_hash('a'), '2 mon 1 day');
SELECT tz, expires_at = now() + interval '5270400 seconds' AS now_plus_61_days FROM expiries ORDER BY tz;
ROLLBACK;

-- The limits hold on the fixed duration: a ttl of 3650 days (119 months are 3617.25); 120 months are 3652.5.
BEGIN;
SELECT outcome, expires_at - now() AS span FROM idem_claim('s-max', idem_hash('a'), '3650 days');
SELECT outcome, expires_at - now() AS span FROM idem_claim('s-max-2', idem_hash('a'), '119 mon 32 days 18 hours');
ROLLBACK;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
SELECT sqlstate_of($$SELECT idem_claim('s-long', idem_hash('a'), '120 mon')$$);
SELECT sqlstate_of($$SELECT idem_claim('s-long', idem_hash('a'), '10 years')$$);
-- A lease of at most 365 days: '12 mon' is 365.25, '11 mon 35 days 1 second' one second more than 365 days.
SELECT sqlstate_of($$SELECT idem_lease('s-long', idem_hash('a'), '12 mon')$$);
SELECT sqlstate_of($$SELECT idem_lease('s-long', idem_hash('a'), '11 mon 35 days 1 second')$$);
-- A month and minus 30 days is zero, a year and minus 365 days a quarter day.
SELECT sqlstate_of($$SELECT idem_claim('s-zero', idem_hash('a'), '1 mon -30 days')$$);
SELECT sqlstate_of($$SELECT idem_lease('s-zero', idem_hash('a'), '1 mon -30 days')$$);
SELECT sqlstate_of($$SELECT idem_claim_wait('s-zero', idem_hash('a'), '1 day -86401 seconds')$$);
SELECT sqlstate_of($$SELECT idem_claim_wait('s-zero', idem_hash('a'), '1 day 1 second')$$);
SELECT count(*) AS stored FROM idempotency_keys;

-- A lease runs on the clock: its end is the clock at the call plus 30 days (read before and after it, in
-- statements of their own), and the key outlives it by the ttl, 30 days as well. A calendar month from now would
-- be a day or more off on most dates; within_margin only says the call did not take an hour.
CREATE TEMP TABLE clock_marks (before timestamptz, after timestamptz);
INSERT INTO clock_marks (before) VALUES (clock_timestamp());
CREATE TEMP TABLE lease_spans AS SELECT * FROM idem_lease('s-lease', idem_hash('a'), '1 mon', '1 mon');
UPDATE clock_marks SET after = clock_timestamp();
SELECT outcome,
       lease_until >= before + interval '2592000 seconds' AND lease_until <= after + interval '2592000 seconds'
           AS lease_is_30_days,
       after - before < interval '1 hour' AS within_margin,
       expires_at - lease_until AS ttl_after_lease
FROM lease_spans, clock_marks;
TRUNCATE clock_marks;
INSERT INTO clock_marks (before) VALUES (clock_timestamp());
CREATE TEMP TABLE extended AS SELECT idem_lease_extend('s-lease', lease_token, '1 mon') AS until FROM lease_spans;
UPDATE clock_marks SET after = clock_timestamp();
SELECT until >= before + interval '2592000 seconds' AND until <= after + interval '2592000 seconds'
           AS extended_by_30_days,
       after - before < interval '1 hour' AS within_margin
FROM extended, clock_marks;
SELECT idem_lease_release('s-lease', lease_token) FROM lease_spans;

DROP TABLE lease_spans, clock_marks, extended;
DROP FUNCTION sqlstate_of(text);
RESET TimeZone;
TRUNCATE idempotency_keys;
