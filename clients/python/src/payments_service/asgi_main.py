"""``python -m payments_service.asgi_main psycopg|sqlalchemy``: the FastAPI payment service under uvicorn on
127.0.0.1:$PORT against $DATABASE_URL (same environment as ``python -m payments_service``)."""

import logging
import os
import sys


def main(argv):
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    variant = argv[0] if argv else "psycopg"
    dsn = os.environ.get("DATABASE_URL")
    if not dsn:
        print("payments_service.asgi_main: DATABASE_URL is required", file=sys.stderr)
        return 2
    import uvicorn

    from .fastapi_app import create_app

    app = create_app(dsn, variant, faults=os.environ.get("PAYMENTS_FAULTS") == "1",
                     pool_size=int(os.environ.get("POOL_SIZE", "20")))
    # uvicorn's own access log off; its limit on concurrent connections generous; one process (the pool is
    # per process).
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8080")), log_level="warning",
                access_log=False, lifespan="on")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
