# frozen_string_literal: true

# unicorn for the payment service: WORKERS processes (default 10), each one request at a time on its own
# connection. unicorn hands the app the body as a stream (rack.input reads from the socket), so the middleware
# answers 413 for a Content-Length or a chunked body over the limit without reading the rest (CONTRACT.md
# body-limit), which Puma 5, reading every body whole before the app, cannot.
listen "127.0.0.1:#{ENV.fetch('PORT', '8080')}"
worker_processes Integer(ENV.fetch("WORKERS", "10"))
timeout 60
# The app (Rails above all) is loaded once, in the master, and the workers are forked from it: ten workers each
# booting Rails on their own took over 30 s on a busy 2-core machine. No connection is open before the fork (both
# pools connect on first use); should one be, it is closed, so that no two processes share a socket.
preload_app true
before_fork do |_server, _worker|
  ActiveRecord::Base.connection_handler.clear_all_connections! if defined?(ActiveRecord::Base)
end
