-- Lease mode (1.1): a handler that calls an external payment provider, with two recovery points.
--
-- The rocket-rides story: POST /rides charges the rider at a payment provider, stores the ride, sends a
-- receipt e-mail and answers 201. The provider call and the e-mail cannot be rolled back and must not run
-- inside an open transaction, so the key is held by a lease instead of a transaction:
--
--   started         idem_lease answered claimed with no recovery point: charge the rider at the provider
--   charge_created  the ride row and the charge id are committed with idem_checkpoint: send the receipt
--   finished        idem_lease_complete stores the 201; every retry replays it
--
-- A retry that takes over a lapsed lease resumes at the last recovery point: after 'charge_created' it never
-- calls the provider again. Before it, it does call the provider again, with the same provider idempotency key,
-- and the provider answers with the first charge (that is the provider's own idempotency, which this file
-- simulates with the table provider_charges).
--
-- Run it with psql in a database that has the extension at version 1.1 (it takes about 3 seconds):
--   psql -X -d mydb -f examples/lease_handler.sql
-- It creates the tables rides, provider_charges and mailer_messages and the functions below.

\set ON_ERROR_STOP 1
\pset footer off
SET client_min_messages = notice;

-- The external services, simulated. Each statement that calls them runs outside any transaction of the
-- handler, exactly where a real HTTP call would go.
CREATE TABLE provider_charges (
    idempotency_key text PRIMARY KEY,              -- the provider's Idempotency-Key: one charge per key
    charge_id       text NOT NULL DEFAULT 'ch_' || substr(md5(random()::text), 1, 10),
    amount_cents    bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
-- POST https://provider.example/v1/charges with Idempotency-Key: a retry gets the first charge back.
CREATE FUNCTION provider_charge(p_idempotency_key text, p_amount_cents bigint) RETURNS text
LANGUAGE sql AS $$
    INSERT INTO provider_charges (idempotency_key, amount_cents) VALUES (p_idempotency_key, p_amount_cents)
    ON CONFLICT (idempotency_key) DO NOTHING;
    SELECT charge_id FROM provider_charges WHERE idempotency_key = p_idempotency_key;
$$;

CREATE TABLE mailer_messages (
    idempotency_key text PRIMARY KEY,              -- the mailer de-duplicates on it too
    recipient       text NOT NULL,
    body            text NOT NULL
);
-- Sends the message unless one with this key was sent; true when it sent it now.
CREATE FUNCTION mailer_send(p_idempotency_key text, p_recipient text, p_body text) RETURNS boolean
LANGUAGE sql AS $$
    WITH sent AS (INSERT INTO mailer_messages VALUES (p_idempotency_key, p_recipient, p_body)
                  ON CONFLICT (idempotency_key) DO NOTHING RETURNING 1)
    SELECT count(*) = 1 FROM sent;
$$;

-- The application's own table.
CREATE TABLE rides (
    id              bigserial PRIMARY KEY,
    account         text NOT NULL,
    idempotency_key text NOT NULL,
    amount_cents    bigint NOT NULL,
    charge_id       text NOT NULL,
    receipt_sent    boolean NOT NULL DEFAULT false,
    UNIQUE (account, idempotency_key)
);

-- ride_begin: the first call of every attempt, in a transaction of its own (one statement in autocommit).
-- action tells the caller what to do next:
--   'charge'        (started)        call the provider, then ride_advance(..., 'charge_created', ...)
--   'send_receipt'  (charge_created) send the receipt, then ride_advance(..., 'finished', ...)
--   'answer'        replay, mismatch or in_progress: answer status, body, headers (and Retry-After)
CREATE FUNCTION ride_begin(p_key text, p_account text, p_body jsonb, p_lease interval DEFAULT '30 seconds',
                           p_wait interval DEFAULT NULL,
                           OUT action text, OUT lease_token uuid, OUT status int, OUT body jsonb,
                           OUT headers jsonb, OUT retry_after int, OUT charge_id text, OUT ride_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
    l idem_lease_result;
BEGIN
    SELECT * INTO l FROM idem_lease(p_key, idem_hash(p_body), p_lease, scope => p_account, wait => p_wait);
    IF l.outcome <> 'claimed' THEN
        action := 'answer';
        status := l.http_status;
        body := CASE WHEN l.outcome = 'replay' THEN l.response_body
                     ELSE jsonb_build_object('error', l.outcome) END;
        headers := CASE WHEN l.outcome = 'replay'
                        THEN coalesce(l.response_headers, '{}') || '{"Idempotent-Replayed": "true"}' END;
        -- in_progress: a lease says when it runs out; a key held by a transaction has no lease_until (1 s).
        IF l.outcome = 'in_progress' THEN
            retry_after := greatest(1, coalesce(ceil(extract(epoch FROM l.lease_until - clock_timestamp()))::int, 1));
        END IF;
        RETURN;
    END IF;
    lease_token := l.lease_token;
    IF l.recovery_point IS NULL THEN                   -- started: a new key, or a takeover before the checkpoint
        action := 'charge';
    ELSIF l.recovery_point = 'charge_created' THEN     -- a takeover after the checkpoint: never charge again
        action := 'send_receipt';
        charge_id := l.recovery_state->>'charge_id';
        ride_id := (l.recovery_state->>'ride_id')::bigint;
    ELSE
        RAISE EXCEPTION 'unknown recovery point %', l.recovery_point;
    END IF;
END $$;

-- ride_advance: records one step, with its local writes, in a transaction of its own.
--   'charge_created'  state {"charge_id": ...}: inserts the ride and records the recovery point together
--   'finished'        state {"ride_id": ...}: marks the receipt sent and stores the 201
--   'failed'          state {"status": 402 or 503, "error": ...}: stores a 4xx; a 5xx releases the lease
-- A stale lease token (another attempt took the key over) raises SQLSTATE 55000 and nothing is written:
-- the caller stops working on the request.
CREATE FUNCTION ride_advance(p_key text, p_account text, p_token uuid, p_step text, p_state jsonb,
                             OUT status int, OUT body jsonb, OUT ride_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r rides;
BEGIN
    -- The idem_* call comes first in each step: a stale attempt stops there, before any other work.
    CASE p_step
    WHEN 'charge_created' THEN
        ride_id := nextval(pg_get_serial_sequence('rides', 'id'));
        PERFORM idem_checkpoint(p_key, p_token, 'charge_created',
                                jsonb_build_object('charge_id', p_state->>'charge_id', 'ride_id', ride_id),
                                scope => p_account);
        INSERT INTO rides (id, account, idempotency_key, amount_cents, charge_id)
        VALUES (ride_id, p_account, p_key, (p_state->>'amount_cents')::bigint, p_state->>'charge_id');
    WHEN 'finished' THEN
        SELECT * INTO STRICT r FROM rides WHERE id = (p_state->>'ride_id')::bigint;
        ride_id := r.id;
        status := 201;
        body := jsonb_build_object('ride_id', r.id, 'charge_id', r.charge_id, 'amount_cents', r.amount_cents);
        PERFORM idem_lease_complete(p_key, p_token, status, body,
                                    jsonb_build_object('Location', '/rides/' || r.id), scope => p_account);
        UPDATE rides SET receipt_sent = true WHERE id = r.id;
    WHEN 'failed' THEN
        -- A 4xx (card declined: 402) is stored and replayed; a 5xx is not: the lease ends at once, the
        -- recovery point stays, and idem_lease_complete returns false.
        status := (p_state->>'status')::int;
        body := jsonb_build_object('error', p_state->>'error');
        PERFORM idem_lease_complete(p_key, p_token, status, body, scope => p_account);
    END CASE;
END $$;

\echo
\echo == 1. A request that runs through: started -> charge_created -> finished, then a retry replays
SELECT action, lease_token FROM ride_begin('ride-1', 'acct_1', '{"amount_cents": 2000}') \gset
\echo action = :action
SELECT provider_charge('ride-1', 2000) AS charge_id \gset
SELECT ride_id FROM ride_advance('ride-1', 'acct_1', :'lease_token', 'charge_created',
                                 jsonb_build_object('charge_id', :'charge_id', 'amount_cents', 2000)) \gset
SELECT mailer_send('ride-1', 'rider@example.com', 'Your ride: ' || :'charge_id') AS sent;
SELECT status, body FROM ride_advance('ride-1', 'acct_1', :'lease_token', 'finished',
                                      jsonb_build_object('ride_id', :ride_id));
-- The retry: replay, with the stored 201; nothing is charged or sent again.
SELECT action, status, body, headers FROM ride_begin('ride-1', 'acct_1', '{"amount_cents": 2000}');
-- Another body with the same key: 422.
SELECT action, status, body FROM ride_begin('ride-1', 'acct_1', '{"amount_cents": 9999}');

\echo
\echo == 2. A double click while the lease is held: 409 at once, Retry-After from lease_until
SELECT action, lease_token FROM ride_begin('ride-2', 'acct_1', '{"amount_cents": 1500}') \gset
SELECT action, status, retry_after FROM ride_begin('ride-2', 'acct_1', '{"amount_cents": 1500}');
SELECT provider_charge('ride-2', 1500) AS charge_id \gset
SELECT ride_id FROM ride_advance('ride-2', 'acct_1', :'lease_token', 'charge_created',
                                 jsonb_build_object('charge_id', :'charge_id', 'amount_cents', 1500)) \gset
SELECT mailer_send('ride-2', 'rider@example.com', 'Your ride: ' || :'charge_id') AS sent;
SELECT status FROM ride_advance('ride-2', 'acct_1', :'lease_token', 'finished', jsonb_build_object('ride_id', :ride_id));

\echo
\echo == 3. Attempt A charges, then dies before its checkpoint; attempt B takes over at 'started'
SELECT lease_token AS token_a FROM ride_begin('ride-3', 'acct_1', '{"amount_cents": 700}', '1 second') \gset
SELECT provider_charge('ride-3', 700) AS charge_a \gset
-- ... A's process is killed here. Its lease runs out after 1 second.
SELECT pg_sleep(1.2);
SELECT action, lease_token AS token_b FROM ride_begin('ride-3', 'acct_1', '{"amount_cents": 700}') \gset
\echo action = :action
-- B calls the provider again with the same key: the provider answers with A's charge, it does not charge twice.
SELECT provider_charge('ride-3', 700) AS charge_b \gset
SELECT :'charge_a' = :'charge_b' AS same_charge;
SELECT ride_id FROM ride_advance('ride-3', 'acct_1', :'token_b', 'charge_created',
                                 jsonb_build_object('charge_id', :'charge_b', 'amount_cents', 700)) \gset
-- A comes back to life (it was only paused) and tries to record its step: ERROR 55000, nothing is written,
-- and A stops working on the request.
\set ON_ERROR_STOP 0
\set VERBOSITY verbose
SELECT ride_advance('ride-3', 'acct_1', :'token_a', 'charge_created',
                    '{"charge_id": "ch_stale", "amount_cents": 700}');
\set VERBOSITY default
\set ON_ERROR_STOP 1
SELECT mailer_send('ride-3', 'rider@example.com', 'Your ride: ' || :'charge_b') AS sent;
SELECT status, body FROM ride_advance('ride-3', 'acct_1', :'token_b', 'finished', jsonb_build_object('ride_id', :ride_id));

\echo
\echo == 4. Attempt A dies after its checkpoint; attempt B resumes at 'charge_created' and never charges
SELECT lease_token AS token_a FROM ride_begin('ride-4', 'acct_1', '{"amount_cents": 900}', '1 second') \gset
SELECT provider_charge('ride-4', 900) AS charge_a \gset
SELECT ride_id FROM ride_advance('ride-4', 'acct_1', :'token_a', 'charge_created',
                                 jsonb_build_object('charge_id', :'charge_a', 'amount_cents', 900)) \gset
-- ... A dies before sending the receipt.
SELECT pg_sleep(1.2);
SELECT action, lease_token AS token_b, charge_id, ride_id FROM ride_begin('ride-4', 'acct_1', '{"amount_cents": 900}') \gset
\echo action = :action, charge_id = :charge_id, ride_id = :ride_id
SELECT mailer_send('ride-4', 'rider@example.com', 'Your ride: ' || :'charge_id') AS sent;
SELECT status, body FROM ride_advance('ride-4', 'acct_1', :'token_b', 'finished', jsonb_build_object('ride_id', :ride_id));

\echo
\echo == 5. The provider is down: a 503 is not stored, the lease ends at once, the retry starts again
SELECT lease_token FROM ride_begin('ride-5', 'acct_1', '{"amount_cents": 300}') \gset
-- provider_charge() timed out or answered 503: nothing to record but the failure.
SELECT status, body FROM ride_advance('ride-5', 'acct_1', :'lease_token', 'failed',
                                      '{"status": 503, "error": "provider unavailable"}');
SELECT action, lease_token FROM ride_begin('ride-5', 'acct_1', '{"amount_cents": 300}') \gset
\echo action = :action
SELECT provider_charge('ride-5', 300) AS charge_id \gset
SELECT ride_id FROM ride_advance('ride-5', 'acct_1', :'lease_token', 'charge_created',
                                 jsonb_build_object('charge_id', :'charge_id', 'amount_cents', 300)) \gset
SELECT mailer_send('ride-5', 'rider@example.com', 'Your ride: ' || :'charge_id') AS sent;
SELECT status FROM ride_advance('ride-5', 'acct_1', :'lease_token', 'finished', jsonb_build_object('ride_id', :ride_id));

\echo
\echo == The books: one charge, one ride and one receipt per key
SELECT c.idempotency_key, count(DISTINCT c.charge_id) AS charges, count(DISTINCT r.id) AS rides,
       count(DISTINCT m.idempotency_key) AS receipts, bool_and(r.charge_id = c.charge_id) AS ride_has_the_charge
FROM provider_charges c
LEFT JOIN rides r ON r.idempotency_key = c.idempotency_key
LEFT JOIN mailer_messages m ON m.idempotency_key = c.idempotency_key
GROUP BY c.idempotency_key ORDER BY 1;
SELECT leases, lease_takeovers, checkpoints, stale_tokens FROM idem_stats;
