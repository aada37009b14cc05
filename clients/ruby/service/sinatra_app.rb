# frozen_string_literal: true

# The payment service of clients/CONTRACT.md as a Sinatra app behind IdempotencyPg::Middleware, on a pool of `pg`
# connections. Started by service/serve (Puma).
require "sinatra/base"
require_relative "payments"

class PaymentsSinatra < Sinatra::Base
  set :show_exceptions, false
  set :raise_errors, false
  set :dump_errors, true
  set :x_cascade, false
  disable :protection # Rack::Protection would answer some requests itself (JSON CSRF, path traversal)

  def self.service(pool, faults: false, logger: nil)
    backend = IdempotencyPg::PgBackend.new(pool)
    Rack::Builder.new do
      use IdempotencyPg::Middleware, backend: backend, scope: Payments.method(:authenticate),
                                     protect: Payments.method(:protect),
                                     replay_headers: %w[Content-Type Location], logger: logger
      run PaymentsSinatra.new(faults: faults)
    end.to_app
  end

  def initialize(app = nil, faults: false)
    super(app)
    @faults = faults
  end

  def not_allowed(allow)
    r = Payments.problem(405, "method-not-allowed", "Method Not Allowed", "#{request.request_method} is not allowed here",
                         { "Allow" => allow })
    halt(*r)
  end

  def self.other(verbs, pattern, allow)
    verbs.each { |verb| route(verb, pattern) { not_allowed(allow) } }
  end

  NOT_POST = %w[GET HEAD PUT DELETE PATCH OPTIONS LINK UNLINK].freeze

  get("/healthz") { Payments.json(200, { ok: true }) }
  other(%w[POST PUT DELETE PATCH OPTIONS LINK UNLINK], "/healthz", "GET, HEAD")

  %w[/payments /payments-unprotected %r{/files/.+}].each do |p|
    pattern = p.start_with?("%r") ? %r{/files/.+} : p
    post(pattern) { Payments.pay(env, faults: @faults) }
    other(NOT_POST, pattern, "POST")
  end
  post("/documents") { Payments.document(env) }
  other(NOT_POST, "/documents", "POST")
  post("/rides") { Payments.ride(env, faults: @faults) }
  other(NOT_POST, "/rides", "POST")

  error(Payments::FrameworkError) { halt(*Payments.framework_error(env["sinatra.error"])) }
  not_found { halt(*Payments.problem(404, "not-found", "Not Found", "#{request.path_info} is not a resource here")) }
  error(StandardError) do
    halt(*Payments.problem(500, "internal-error", "Internal Server Error", "the request failed and was rolled back"))
  end
end
