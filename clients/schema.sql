-- The payment service's table (clients/CONTRACT.md); load into a database that has CREATE EXTENSION idempotency.
CREATE TABLE ledger (
    id              bigserial PRIMARY KEY,
    account         text NOT NULL,
    amount_cents    bigint NOT NULL,          -- a debit is negative
    currency        text NOT NULL,
    idempotency_key text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
