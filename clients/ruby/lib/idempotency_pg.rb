# frozen_string_literal: true

# idempotency-pg: the Idempotency-Key middleware for Rack (Rails, Sinatra, Hanami) over the idempotency PostgreSQL
# extension (clients/CONTRACT.md).
require "pg"
require_relative "idempotency_pg/version"
require_relative "idempotency_pg/header"
require_relative "idempotency_pg/problem"
require_relative "idempotency_pg/statements"
require_relative "idempotency_pg/backends"
require_relative "idempotency_pg/middleware"
require_relative "idempotency_pg/lease"
