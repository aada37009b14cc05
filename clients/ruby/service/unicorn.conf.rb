# frozen_string_literal: true

# unicorn for the payment service: WORKERS processes (default 10), each one request at a time on its own
# connection. unicorn hands the app the body as a stream (rack.input reads from the socket), so the middleware
# answers 413 for a Content-Length or a chunked body over the limit without reading the rest (CONTRACT.md
# body-limit), which Puma 5, reading every body whole before the app, cannot.
listen "127.0.0.1:#{ENV.fetch('PORT', '8080')}"
worker_processes Integer(ENV.fetch("WORKERS", "10"))
timeout 60
preload_app false
