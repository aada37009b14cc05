"""The ledger table of clients/schema.sql as a SQLAlchemy 1.4 ORM model (the FastAPI + SQLAlchemy variant)."""

from sqlalchemy import BigInteger, Column, Text
from sqlalchemy.orm import declarative_base

Base = declarative_base()


class Ledger(Base):
    __tablename__ = "ledger"

    id = Column(BigInteger, primary_key=True)
    account = Column(Text, nullable=False)
    amount_cents = Column(BigInteger, nullable=False)
    currency = Column(Text, nullable=False)
    idempotency_key = Column(Text, nullable=False)
