"""Python client of the ``idempotency`` PostgreSQL extension: Idempotency-Key middleware for WSGI
(:class:`IdempotencyMiddleware`), ASGI (:mod:`idempotency_pg.asgi`: Starlette, FastAPI, SQLAlchemy) and Django
(:mod:`idempotency_pg.django`)."""

from .header import InvalidKey, KeyHeaderError, MissingKey, parse_idempotency_key
from .middleware import ATTEMPT, CONNECTION, KEY, SCOPE, IdempotencyMiddleware, get_connection, run_wsgi
from .responses import (MAX_BODY_BYTES, BodyIncomplete, BodyTooLarge, HTTPProblem, NotExecuted, Problem, Response,
                        claim_response, json_response, problem, problem_json, stored_form)

__all__ = [
    "ATTEMPT", "CONNECTION", "KEY", "MAX_BODY_BYTES", "SCOPE", "BodyIncomplete", "BodyTooLarge", "HTTPProblem",
    "IdempotencyMiddleware", "InvalidKey", "KeyHeaderError", "MissingKey", "NotExecuted", "Problem", "Response",
    "claim_response", "connection_pool", "connect_kwargs", "get_connection", "json_response",
    "parse_idempotency_key", "problem", "problem_json", "run_wsgi", "stored_form",
]


def connect_kwargs():
    """Connection settings that work through PgBouncer in transaction pooling mode.

    ``prepare_threshold=None``: psycopg 3 otherwise turns a handler's query into a *named* server-side prepared
    statement after 5 executions, which a later transaction may run on another server connection
    (``prepared statement "_pg3_0" does not exist``); the middleware prepares only its own two statements, and stops
    when the pooler shows it cannot (:class:`idempotency_pg.core.Preparing`).  ``autocommit=True``: every
    transaction is an explicit block, so no connection sits idle in an implicit transaction.
    """
    return {"prepare_threshold": None, "autocommit": True}


def connection_pool(conninfo, min_size=4, max_size=20, **pool_kwargs):
    """A ``psycopg_pool.ConnectionPool`` with :func:`connect_kwargs`."""
    from psycopg_pool import ConnectionPool

    kwargs = dict(connect_kwargs(), **pool_kwargs.pop("kwargs", {}))
    return ConnectionPool(conninfo, min_size=min_size, max_size=max_size, kwargs=kwargs, **pool_kwargs)
