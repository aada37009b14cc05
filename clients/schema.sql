-- The payment service's table (clients/CONTRACT.md); load into a database that has CREATE EXTENSION idempotency.
CREATE TABLE ledger (
    id              bigserial PRIMARY KEY,
    account         text NOT NULL,
    amount_cents    bigint NOT NULL,          -- a debit is negative
    currency        text NOT NULL,
    idempotency_key text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The lease-mode service, POST /rides (CONTRACT.md "lease-rides").
CREATE TABLE rides (
    id              bigserial PRIMARY KEY,
    account         text NOT NULL,
    idempotency_key text NOT NULL,
    amount_cents    bigint NOT NULL,
    currency        text NOT NULL,
    charge_id       text NOT NULL,
    fencing_number  bigint,                   -- idem_lease's fencing number (1.2), NULL on 1.1
    receipt_sent    boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account, idempotency_key)
);
-- The simulated payment provider: idempotent on (account, key), as a real one is on its Idempotency-Key.
CREATE TABLE provider_charges (
    id              bigserial PRIMARY KEY,
    charge_id       text NOT NULL GENERATED ALWAYS AS ('ch_' || id) STORED,
    account         text NOT NULL,
    idempotency_key text NOT NULL,
    amount_cents    bigint NOT NULL,
    currency        text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account, idempotency_key)
);
-- The simulated mailer: one receipt per (account, key).
CREATE TABLE receipts (
    account         text NOT NULL,
    idempotency_key text NOT NULL,
    ride_id         bigint NOT NULL,
    sent_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account, idempotency_key)
);

-- POST /documents (CONTRACT.md "any-body"): a body of any type, stored as it came.
CREATE TABLE documents (
    id              bigserial PRIMARY KEY,
    account         text NOT NULL,
    idempotency_key text NOT NULL,
    content_type    text,
    body            bytea NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
