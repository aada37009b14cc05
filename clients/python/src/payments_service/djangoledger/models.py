from django.db import models


class Ledger(models.Model):
    """clients/schema.sql's ledger (created there, so not managed by Django's migrations)."""

    account = models.TextField()
    amount_cents = models.BigIntegerField()
    currency = models.TextField()
    idempotency_key = models.TextField()

    class Meta:
        managed = False
        db_table = "ledger"
        app_label = "djangoledger"
