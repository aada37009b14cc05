# frozen_string_literal: true

# The payment service of clients/CONTRACT.md as a Rails 6.1 API app: IdempotencyPg::Middleware with
# ActiveRecordBackend, so each protected request runs inside ActiveRecord::Base.transaction and the controller
# writes with its models on ActiveRecord's own connection.
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require_relative "payments"

require "active_record/connection_adapters/postgresql_adapter"

# ActiveRecord 6.1 sets session settings when it opens a connection (SET intervalstyle = iso_8601, client_min_messages,
# standard_conforming_strings, timezone). Behind PgBouncer in transaction pooling a session SET stays on the server
# connection and reaches other clients (CONTRACT.md Process: no session state), so this sample sets none: its models
# read no interval, and the server's defaults (standard_conforming_strings on) are what ActiveRecord expects.
module NoSessionSettings
  def configure_connection; end
end
ActiveRecord::ConnectionAdapters::PostgreSQLAdapter.prepend(NoSessionSettings)

class LedgerEntry < ActiveRecord::Base
  self.table_name = "ledger"
end

class Document < ActiveRecord::Base
  self.table_name = "documents"
end

class Ride < ActiveRecord::Base
  self.table_name = "rides"
end

class PaymentsRails < Rails::Application
  config.api_only = true
  config.eager_load = false
  config.secret_key_base = "payments-sample"
  config.hosts.clear
  config.logger = Logger.new($stderr, level: :warn)

  def self.service(url, pool:, faults:)
    ENV["DATABASE_URL"] = url
    config.x.faults = faults
    # the pool: one connection per unicorn worker (POOL_SIZE), kept open while idle (CONTRACT.md idle-409)
    # and one more for a lease's heartbeat (POST /rides), which extends the lease from a thread of its own
    ActiveRecord::Base.configurations = { "production" => { "url" => url, "adapter" => "postgresql", "pool" => pool + 1,
                                                            "prepared_statements" => false,
                                                            "idle_timeout" => 0 } }
    config.middleware.use IdempotencyPg::Middleware, backend: IdempotencyPg::ActiveRecordBackend.new,
                                                     scope: Payments.method(:authenticate),
                                                     protect: Payments.method(:protect),
                                                     replay_headers: %w[Content-Type Location]
    initialize!
    routes.draw do
      get "/healthz", to: "payments#healthz"
      match "/healthz", to: "payments#not_allowed", via: %i[post put delete patch options], defaults: { allow: "GET, HEAD" }
      post "/payments", to: "payments#create"
      post "/payments-unprotected", to: "payments#create"
      post "/files/*name", to: "payments#create", format: false
      post "/documents", to: "payments#document"
      post "/rides", to: "payments#rides"
      %w[/payments /payments-unprotected /files/*name /documents /rides].each do |path|
        match path, to: "payments#not_allowed", via: %i[get head put delete patch options], defaults: { allow: "POST" },
                    format: false
      end
      match "*path", to: "payments#not_found", via: :all, format: false
      match "/", to: "payments#not_found", via: :all
    end
    self
  end
end

class PaymentsController < ActionController::API
  rescue_from(StandardError) do |e|
    Rails.logger.error("payments: #{e.class}: #{e.message}")
    answer(Payments.problem(500, "internal-error", "Internal Server Error", "the request failed and was rolled back"))
  end
  rescue_from(Payments::FrameworkError) { |e| answer(Payments.framework_error(e)) }

  def healthz
    answer(Payments.json(200, { ok: true }))
  end

  # POST /payments: the payment with the model, in the request's transaction (ActiveRecordBackend)
  def create
    ctx = request.env["idempotency"]
    payment = Payments.payment_of(request.env)
    if payment.nil?
      ctx.not_executed!
      return answer(Payments.problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON"))
    end
    if payment[:error]
      ctx.not_executed!
      return answer(Payments.problem(422, "invalid-payment", "Invalid payment", payment[:error]))
    end
    entry = LedgerEntry.create!(account: ctx.scope, amount_cents: -payment[:amount], currency: payment[:currency],
                                idempotency_key: ctx.key || "")
    case Rails.application.config.x.faults ? request.headers["X-Fault"] : nil
    when "503" then return answer(Payments.problem(503, "upstream-unavailable", "Service Unavailable", "upstream unavailable"))
    when "throw-422" then raise Payments::FrameworkError.new(422, "the payment was refused")
    when "throw-502" then raise Payments::FrameworkError.new(502, "the upstream failed")
    when "db-error" then ActiveRecord::Base.connection.execute("SELECT 1/0")
    when /\Asleep=(\d+)\z/ then ActiveRecord::Base.connection.execute("SELECT pg_sleep(#{Regexp.last_match(1).to_i} / 1000.0)")
    end
    answer(Payments.json(201, { payment_id: entry.id, account: ctx.scope, amount_cents: payment[:amount],
                                currency: payment[:currency] }, { "Location" => "/payments/#{entry.id}" }))
  end

  def document
    ctx = request.env["idempotency"]
    raw = request.raw_post.to_s.b
    doc = Document.create!(account: ctx.scope, idempotency_key: ctx.key, content_type: request.env["CONTENT_TYPE"], body: raw)
    answer(Payments.json(201, { document_id: doc.id, content_type: request.env["CONTENT_TYPE"], bytes: raw.bytesize,
                                sha256: Digest::SHA256.hexdigest(raw) }, { "Location" => "/documents/#{doc.id}" }))
  end

  # POST /rides: lease mode, the ride written with the model in the checkpoint's transaction (ActiveRecord's own)
  def rides
    env = request.env
    insert = lambda do |_conn, lease, state, payment|
      Ride.create!(account: lease.scope, idempotency_key: lease.key, amount_cents: payment[:amount],
                   currency: payment[:currency], charge_id: state["charge_id"], fencing_number: lease.fencing_number).id
    end
    mark_sent = ->(_conn, ride_id) { Ride.where(id: ride_id).update_all(receipt_sent: true) }
    answer(Payments.ride(env, faults: Rails.application.config.x.faults, insert_ride: insert, mark_sent: mark_sent))
  end

  def not_allowed
    answer(Payments.problem(405, "method-not-allowed", "Method Not Allowed", "#{request.request_method} is not allowed here",
                            { "Allow" => params[:allow] }))
  end

  def not_found
    answer(Payments.problem(404, "not-found", "Not Found", "#{request.path} is not a resource here"))
  end

  private

  def answer(triple)
    status, headers, body = triple
    headers.each { |k, v| response.headers[k] = v }
    response.charset = false
    render body: body.join, status: status, content_type: headers["Content-Type"]
  end
end
