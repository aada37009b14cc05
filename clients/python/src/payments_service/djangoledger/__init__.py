"""The Django app holding the ledger model of the Django variant of the payment service."""
