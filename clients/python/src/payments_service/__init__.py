"""The payment service of clients/CONTRACT.md, on the idempotency_pg middleware."""

from .app import PaymentsApp, account_scope, process_payment

__all__ = ["PaymentsApp", "account_scope", "process_payment"]
