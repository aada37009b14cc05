-- Rule key-lifetime (1.4, issue 41): every answer of idem_claim_request and idem_lease carries the key's expiry
-- in its headers, Idempotency-Key-Expires, an RFC 9110 IMF-fixdate in GMT written by the server, whatever the
-- session's DateStyle, TimeZone and lc_time; a replay says the first answer's date; the stored headers never
-- hold it; the 1.0 functions answer as before.
TRUNCATE idempotency_keys;
-- Settings another role can choose: none changes the date.
SET DateStyle = 'SQL, DMY';
SET TimeZone = 'Asia/Kolkata';
DO $$
DECLARE
    candidate text;
BEGIN
    -- another locale for lc_time when one is installed (nothing changes if none is)
    FOREACH candidate IN ARRAY ARRAY['de_DE.UTF-8', 'de_DE.utf8', 'fr_FR.UTF-8', 'fr_FR.utf8', 'es_ES.UTF-8'] LOOP
        BEGIN
            PERFORM set_config('lc_time', candidate, false);
            EXIT;
        EXCEPTION WHEN invalid_parameter_value OR feature_not_supported THEN
            NULL;
        END;
    END LOOP;
END
$$;
-- The reference: an HTTP-date of a timestamp, with to_char's non-localized patterns in UTC.
CREATE FUNCTION http_date(ts timestamptz) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT to_char(ts AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS "GMT"')
$$;
CREATE FUNCTION expiry_of(k text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT http_date(expires_at) FROM idempotency_keys WHERE key = k
$$;
CREATE TEMP TABLE first_answer (key text PRIMARY KEY, headers jsonb);

-- claimed: only the member, the claim's expiry (transaction start + ttl, truncated to the second).
BEGIN;
INSERT INTO first_answer
SELECT 'pay-1', (idem_claim_request('pay-1', '', 'POST', '/payments', NULL, 'application/json', '{"a": 1}',
                                    interval '1 day 2 hours')).headers;
SELECT headers = jsonb_build_object('Idempotency-Key-Expires', http_date(transaction_timestamp() + interval '1 day 2 hours'))
       AS claimed_says_its_expiry,
       headers->>'Idempotency-Key-Expires' ~ '^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT$'
       AS imf_fixdate
FROM first_answer WHERE key = 'pay-1';
-- The handler's own headers, one of them spelling the member in another case: stored as given.
SELECT idem_complete_request('pay-1', '', 201, 'application/json',
                             '{"Location": "/payments/1", "idempotency-key-expires": "forged"}', '{"id": 1}');
COMMIT;
SELECT response_headers FROM idempotency_keys WHERE key = 'pay-1';
SELECT expiry_of('pay-1') = (SELECT headers->>'Idempotency-Key-Expires' FROM first_answer WHERE key = 'pay-1')
       AS row_expiry_is_the_first_answers;

-- replay: the stored headers with the member, the same date as the first answer; the server's wins over the
-- stored one of the same name in any case.
SELECT (c).outcome, (c).headers - 'Idempotency-Key-Expires' AS stored_part,
       (c).headers->>'Idempotency-Key-Expires' = (SELECT headers->>'Idempotency-Key-Expires' FROM first_answer
                                                  WHERE key = 'pay-1') AS same_date_as_first
FROM (SELECT idem_claim_request('pay-1', '', 'POST', '/payments', NULL, 'application/json', '{"a":1}') AS c) s;
-- under other settings too
SET TimeZone = 'America/St_Johns';
SET DateStyle = 'German';
SELECT (idem_claim_request('pay-1', '', 'POST', '/payments', NULL, 'application/json', '{"a":1}')).headers
       ->>'Idempotency-Key-Expires' = expiry_of('pay-1') AS same_under_other_settings;
SET DateStyle = 'SQL, DMY';
SET TimeZone = 'Asia/Kolkata';
-- the stored row still holds only what was completed
SELECT response_headers FROM idempotency_keys WHERE key = 'pay-1';

-- mismatch: the existing key's expiry.
SELECT (c).outcome, (c).http_status, (c).headers = jsonb_build_object('Idempotency-Key-Expires', expiry_of('pay-1'))
       AS says_the_keys_expiry
FROM (SELECT idem_claim_request('pay-1', '', 'POST', '/payments', NULL, 'application/json', '{"a": 2}') AS c) s;

-- in_progress within the claiming transaction: no row is visible yet, no header.
BEGIN;
SELECT (idem_claim_request('pay-2', '', 'POST', '/payments', NULL, NULL, '{}')).outcome;
SELECT (c).outcome, (c).headers FROM (SELECT idem_claim_request('pay-2', '', 'POST', '/payments', NULL, NULL, '{}') AS c) s;
ROLLBACK;

-- A replay of a key stored without headers: only the member; its date, the row's.
BEGIN;
SELECT (idem_claim_request('bare', '', 'DELETE', '/p', NULL, NULL, NULL)).outcome;
SELECT idem_complete_request('bare', '', 204, NULL, NULL, NULL);
COMMIT;
SELECT (c).outcome, (c).headers = jsonb_build_object('Idempotency-Key-Expires', expiry_of('bare')) AS only_the_member
FROM (SELECT idem_claim_request('bare', '', 'DELETE', '/p', NULL, NULL, NULL) AS c) s;

-- A key stored by a 1.0 client (idem_complete, jsonb): the replay through idem_claim_request gets it too.
BEGIN;
SELECT outcome, response_headers FROM idem_claim('old', idem_fingerprint('POST', '/o', NULL, NULL, '{}'));
SELECT idem_complete('old', 200, '{"ok": true}', '{"X-Old": "1"}');
COMMIT;
SELECT (c).headers - 'Idempotency-Key-Expires' AS stored_part,
       (c).headers->>'Idempotency-Key-Expires' = expiry_of('old') AS dated
FROM (SELECT idem_claim_request('old', '', 'POST', '/o', NULL, NULL, '{}') AS c) s;

-- The 1.0 functions are unchanged: no member on claimed, the stored headers as stored on replay.
BEGIN;
SELECT outcome, response_headers, expires_at = transaction_timestamp() + interval '24 hours' AS expiry
FROM idem_claim('v10', idem_hash('x'));
ROLLBACK;
SELECT outcome, response_headers FROM idem_claim('old', idem_fingerprint('POST', '/o', NULL, NULL, '{}'));
SELECT outcome, response_headers FROM idem_claim_wait('old', idem_fingerprint('POST', '/o', NULL, NULL, '{}'), '0 s');
SELECT outcome, response_headers FROM idem_claim('pay-1', idem_hash('other'));

-- Lease mode: idem_lease's response_headers, the same outcomes.
CREATE TEMP TABLE held (key text PRIMARY KEY, token uuid, headers jsonb, expires_at timestamptz);
INSERT INTO held SELECT 'ride-1', lease_token, response_headers, expires_at
FROM idem_lease('ride-1', idem_fingerprint('POST', '/rides', NULL, NULL, '{}'), '1 min');
SELECT headers = jsonb_build_object('Idempotency-Key-Expires', http_date(expires_at)) AS claimed_says_its_expiry,
       http_date(expires_at) = expiry_of('ride-1') AS as_stored
FROM held WHERE key = 'ride-1';
-- held by its worker: in_progress with the lease row's expiry (a committed row)
SELECT outcome, response_headers = jsonb_build_object('Idempotency-Key-Expires', expiry_of('ride-1')) AS dated
FROM idem_lease('ride-1', idem_fingerprint('POST', '/rides', NULL, NULL, '{}'), '1 min');
SELECT (c).outcome, (c).headers = jsonb_build_object('Idempotency-Key-Expires', expiry_of('ride-1')) AS dated
FROM (SELECT idem_claim_request('ride-1', '', 'POST', '/rides', NULL, NULL, '{}') AS c) s;
-- mismatch
SELECT outcome, response_headers = jsonb_build_object('Idempotency-Key-Expires', expiry_of('ride-1')) AS dated
FROM idem_lease('ride-1', idem_hash('other'), '1 min');
SELECT idem_lease_complete_request('ride-1', '', (SELECT token FROM held WHERE key = 'ride-1'), 201,
                                   'application/json', '{"Location": "/rides/1"}', '{"ride": 1}');
-- replay: the stored headers and the row's expiry
SELECT outcome, response_headers - 'Idempotency-Key-Expires' AS stored_part,
       response_headers->>'Idempotency-Key-Expires' = expiry_of('ride-1') AS dated
FROM idem_lease('ride-1', idem_fingerprint('POST', '/rides', NULL, NULL, '{}'), '1 min');
SELECT response_headers FROM idempotency_keys WHERE key = 'ride-1';

RESET DateStyle;
RESET TimeZone;
RESET lc_time;
DROP FUNCTION http_date(timestamptz), expiry_of(text);

-- leave no key behind for the next test
TRUNCATE idempotency_keys;
