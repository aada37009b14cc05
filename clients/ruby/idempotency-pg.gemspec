# frozen_string_literal: true

require_relative "lib/idempotency_pg/version"

Gem::Specification.new do |s|
  s.name = "idempotency-pg"
  s.version = IdempotencyPg::VERSION
  s.summary = "Idempotency-Key Rack middleware (Rails, Sinatra, Hanami) on the idempotency PostgreSQL extension"
  s.description = "Runs a protected request's handler in one PostgreSQL transaction with its idempotency claim: " \
                  "a retry with the same Idempotency-Key replays the first response byte for byte."
  s.authors = ["the idempotency authors"]
  s.license = "PostgreSQL"
  s.required_ruby_version = ">= 3.0"
  s.files = Dir["lib/**/*.rb"] + %w[README.md LICENSE]
  s.require_paths = ["lib"]
  s.add_dependency "pg", ">= 1.2"
  s.add_dependency "rack", ">= 2.0"
end
