-- The tiny bank of the payment demo (scripts/demo.sh, examples/payment_service.pl).
-- Money leaves an account as one ledger debit per Idempotency-Key; a second debit for a key is the bug
-- the extension prevents.

CREATE TABLE accounts (
    id              int PRIMARY KEY,
    owner           text NOT NULL,
    opening_balance numeric NOT NULL,
    balance         numeric NOT NULL CHECK (balance >= 0)
);

CREATE TABLE payments (
    id         bigserial PRIMARY KEY,
    account    int NOT NULL REFERENCES accounts,
    amount     numeric NOT NULL CHECK (amount > 0),
    currency   text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- A debit is a negative amount.
CREATE TABLE ledger (
    id              bigserial PRIMARY KEY,
    account         int NOT NULL REFERENCES accounts,
    amount          numeric NOT NULL,
    idempotency_key text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

INSERT INTO accounts (id, owner, opening_balance, balance)
SELECT id, owner, 1000.00, 1000.00
FROM unnest(ARRAY[1, 2, 3, 4, 5], ARRAY['alice', 'bob', 'carol', 'dave', 'erin']) AS a(id, owner);
