-- POST /payments as one stored function: claim, debit and stored response in a single call, hence in the
-- caller's single transaction. Any error aborts the call and its transaction, which also frees the key for
-- the retry, so there is no cleanup code. Needs the tables of payment_schema.sql.
--   SELECT * FROM post_payment('2f1d...', '{"account": 5, "amount": 15.00, "currency": "USD"}');
CREATE FUNCTION post_payment(p_key text, p_body jsonb,
                             OUT status int, OUT body jsonb, OUT replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    claim   record;
    payment record;
BEGIN
    -- The hash of the jsonb, not of the raw text: whitespace or key order in a retry is no mismatch.
    SELECT * INTO claim FROM idem_claim(p_key, idem_hash(p_body));
    replayed := claim.outcome = 'replay';
    IF claim.outcome <> 'claimed' THEN
        status := claim.http_status;
        body := CASE WHEN replayed THEN claim.response_body
                     ELSE jsonb_build_object('error', claim.outcome) END;
        RETURN;
    END IF;

    INSERT INTO payments (account, amount, currency)
    VALUES ((p_body->>'account')::int, (p_body->>'amount')::numeric, p_body->>'currency')
    RETURNING * INTO payment;
    INSERT INTO ledger (account, amount, idempotency_key) VALUES (payment.account, -payment.amount, p_key);
    UPDATE accounts SET balance = balance - payment.amount WHERE id = payment.account;

    status := 201;
    body := jsonb_build_object('id', payment.id, 'account', payment.account, 'amount', payment.amount,
                               'currency', payment.currency, 'status', 'succeeded',
                               'created_at', payment.created_at);
    PERFORM idem_complete(p_key, status, body, '{"Content-Type": "application/json"}');
END
$$;
