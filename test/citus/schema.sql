-- The business side of the Citus tests (scripts/test-citus.sh) and benchmark (bench/citus/run.sh): accounts, their
-- ledger, and post_payment, a handler that claims, debits and completes in one transaction. On one node as it is;
-- on Citus followed by distribute.sql.
-- No unique constraint on ledger (account, payment_key): a payment debited twice must show as two rows.
CREATE TABLE accounts (account text COLLATE "C" PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE ledger (account text COLLATE "C" NOT NULL, payment_key text NOT NULL, amount bigint NOT NULL,
                     at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON ledger (account, payment_key);
INSERT INTO accounts SELECT 'acct-' || i, 1000000 FROM generate_series(1, 40) i;

CREATE FUNCTION post_payment(p_account text, p_key text, p_amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    claim idem_claim_result;
BEGIN
    -- In FROM, not as a simple expression: the form Citus can route inside a delegated call.
    SELECT * INTO claim FROM idem_claim(p_key, idem_hash(jsonb_build_object('amount', p_amount)), NULL, p_account);
    IF claim.outcome <> 'claimed' THEN
        RETURN jsonb_build_object('outcome', claim.outcome, 'status', claim.http_status, 'body', claim.response_body);
    END IF;
    UPDATE accounts SET balance = balance - p_amount WHERE account = p_account;
    INSERT INTO ledger (account, payment_key, amount) VALUES (p_account, p_key, p_amount);
    PERFORM * FROM idem_complete(p_key, 201, jsonb_build_object('debited', p_amount), NULL, p_account);
    RETURN jsonb_build_object('outcome', 'claimed', 'status', 201, 'body', jsonb_build_object('debited', p_amount));
END
$$;

-- The same debit without a key: the floor the benchmark compares post_payment with.
CREATE FUNCTION post_payment_bare(p_account text, p_key text, p_amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE accounts SET balance = balance - p_amount WHERE account = p_account;
    INSERT INTO ledger (account, payment_key, amount) VALUES (p_account, p_key, p_amount);
    RETURN jsonb_build_object('outcome', 'claimed', 'status', 201, 'body', jsonb_build_object('debited', p_amount));
END
$$;
