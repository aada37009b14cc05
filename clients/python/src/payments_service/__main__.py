"""``python -m payments_service``: serve on 127.0.0.1:$PORT against $DATABASE_URL, with waitress.

Environment: ``PORT`` (default 8080), ``DATABASE_URL`` (required, a libpq URI), ``PAYMENTS_FAULTS=1`` to act on
``X-Fault``; optional ``POOL_SIZE`` (default 20 connections) and ``THREADS`` (default 32 request threads).
"""

import logging
import os
import signal
import sys

from idempotency_pg import connection_pool

from .app import PaymentsApp
from .payment import serve


def main():
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    dsn = os.environ.get("DATABASE_URL")
    if not dsn:
        print("payments_service: DATABASE_URL is required", file=sys.stderr)
        return 2
    port = int(os.environ.get("PORT", "8080"))
    pool_size = int(os.environ.get("POOL_SIZE", "20"))
    faults = os.environ.get("PAYMENTS_FAULTS") == "1"
    pool = connection_pool(dsn, min_size=min(4, pool_size), max_size=pool_size, timeout=10)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        pool.wait(timeout=30)
        print("payments_service: listening on 127.0.0.1:%d (faults %s)" % (port, "on" if faults else "off"),
              file=sys.stderr, flush=True)
        serve(PaymentsApp(pool, faults=faults), port, int(os.environ.get("THREADS", "32")))
    except KeyboardInterrupt:
        pass
    finally:
        pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
