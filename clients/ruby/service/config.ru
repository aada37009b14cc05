# frozen_string_literal: true

# The payment service for a Rack server (unicorn, service/serve): PAYMENTS_FRAMEWORK=sinatra (default) or rails,
# DATABASE_URL, PAYMENTS_FAULTS=1, POOL_SIZE (connections per worker process, default 1).
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__)) unless ENV["IDEMPOTENCY_PG_INSTALLED"] == "1"
url = ENV.fetch("DATABASE_URL") { abort "payments: DATABASE_URL is not set" }
faults = ENV["PAYMENTS_FAULTS"] == "1"
size = Integer(ENV.fetch("POOL_SIZE", "1"))
case ENV.fetch("PAYMENTS_FRAMEWORK", "sinatra")
when "sinatra"
  require_relative "sinatra_app"
  run PaymentsSinatra.service(IdempotencyPg::Pool.new(url, size: size), faults: faults)
when "rails"
  require_relative "rails_app"
  run PaymentsRails.service(url, pool: size, faults: faults)
else abort "payments: unknown PAYMENTS_FRAMEWORK #{ENV['PAYMENTS_FRAMEWORK']}"
end
