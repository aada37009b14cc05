# frozen_string_literal: true

# The payment service of clients/CONTRACT.md, shared by the Sinatra and the Rails sample: authentication, the
# payment's body rules, and the handlers' SQL, on the request's PG::Connection (env["idempotency"].connection).
require "json"
require "digest"
require "rack"
require "idempotency_pg"

module Payments
  MAX_AMOUNT = 2**53 - 1
  CURRENCY = /\A[A-Z]{3}\z/.freeze
  UNAUTHORIZED = "send Authorization: Bearer <account>, the account being [a-z0-9_]{1,64}"
  AMOUNT = "amount_cents must be an integer from 1 to #{MAX_AMOUNT}"
  INSERT = "INSERT INTO ledger (account, amount_cents, currency, idempotency_key) VALUES ($1, $2, $3, $4) RETURNING id"

  class NotReadable < StandardError; end

  module_function

  # The account of `Authorization: Bearer <account>`, or HttpProblem 401. The idempotency scope is the account.
  def authenticate(env)
    m = /\A[Bb][Ee][Aa][Rr][Ee][Rr] ([a-z0-9_]{1,64})\z/.match(env["HTTP_AUTHORIZATION"].to_s)
    raise IdempotencyPg::HttpProblem.new(401, "unauthorized", "Unauthorized", UNAUTHORIZED,
                                         { "WWW-Authenticate" => "Bearer" }) unless m

    m[1]
  end

  def problem(status, type, title, detail, headers = {})
    IdempotencyPg::DEFAULT_RENDER.call(IdempotencyPg::Problem.new(status: status, type: type, title: title,
                                                                  detail: detail, headers: headers))
  end

  def json(status, obj, headers = {})
    [status, { "Content-Type" => "application/json" }.merge(headers), [JSON.generate(obj)]]
  end

  def media_type(value)
    value.to_s.split(";", 2).first.to_s.strip.downcase
  end

  # {amount:, currency:} or {error:} from text fields (form, multipart): amount_cents as the JSON rule writes it
  def fields_payment(fields)
    amount = fields["amount_cents"]
    return { error: AMOUNT } unless amount.is_a?(String) && amount.match?(/\A[1-9][0-9]{0,15}\z/) &&
                                    amount.to_i <= MAX_AMOUNT

    currency = fields["currency"]
    return { error: "currency must be 3 upper-case letters" } unless currency.is_a?(String) && CURRENCY.match?(currency)

    { amount: amount.to_i, currency: currency }
  end

  def nul?(value)
    case value
    when String then value.include?("\u0000")
    when Hash then value.any? { |k, v| nul?(k) || nul?(v) }
    when Array then value.any? { |v| nul?(v) }
    else false
    end
  end

  # The payment of a JSON body: a JSON object (null counts as one without members) whose amount_cents is an integer
  # literal from 1 to 2^53 - 1 (Ruby's parser keeps 1e2 and 1.0 Floats) and whose currency is 3 upper-case letters.
  def json_payment(raw)
    text = raw.dup.force_encoding(Encoding::UTF_8)
    raise NotReadable unless text.valid_encoding?

    doc = JSON.parse(text)
    raise NotReadable if nul?(doc)

    doc = {} if doc.nil?
    return { error: 'the body must be a JSON object {"amount_cents": <integer > 0>, "currency": "<ISO 4217>"}' } unless doc.is_a?(Hash)

    amount = doc["amount_cents"]
    return { error: AMOUNT } unless amount.is_a?(Integer) && amount >= 1 && amount <= MAX_AMOUNT

    currency = doc["currency"]
    return { error: "currency must be 3 upper-case letters" } unless currency.is_a?(String) && CURRENCY.match?(currency)

    { amount: amount, currency: currency }
  rescue JSON::ParserError, EncodingError
    raise NotReadable
  end

  # The payment a request says (CONTRACT.md any-body), read by Rack's own form and multipart parsers.
  def payment_of(env)
    case media_type(env["CONTENT_TYPE"])
    when "application/x-www-form-urlencoded", "multipart/form-data"
      fields_payment(Rack::Request.new(env).POST)
    else
      env["rack.input"].rewind
      json_payment(env["rack.input"].read.to_s)
    end
  rescue NotReadable, EOFError, Rack::Multipart::MultipartPartLimitError, ArgumentError, TypeError
    nil
  end

  # POST /payments (and /files/*, /payments-unprotected): a Rack response. Runs inside the request's transaction.
  def pay(env, faults:)
    ctx = env["idempotency"]
    conn, account = ctx.connection, ctx.scope
    payment = payment_of(env)
    if payment.nil?
      ctx.not_executed!
      return problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON")
    end
    if payment[:error]
      ctx.not_executed! # validation before any write: answered, not stored, the key released
      return problem(422, "invalid-payment", "Invalid payment", payment[:error])
    end
    id = conn.exec_params(INSERT, [account, -payment[:amount], payment[:currency], ctx.key || ""]).getvalue(0, 0).to_i
    fault = faults ? env["HTTP_X_FAULT"] : nil
    case fault
    when "503" then return problem(503, "upstream-unavailable", "Service Unavailable", "upstream unavailable")
    when "throw-422" then raise FrameworkError.new(422, "the payment was refused")
    when "throw-502" then raise FrameworkError.new(502, "the upstream failed")
    when "db-error" then conn.exec("SELECT 1/0")
    when /\Asleep=(\d+)\z/ then conn.exec_params("SELECT pg_sleep($1::float8 / 1000.0)", [Regexp.last_match(1)])
    end
    json(201, { payment_id: id, account: account, amount_cents: payment[:amount], currency: payment[:currency] },
         { "Location" => "/payments/#{id}" })
  end

  # POST /documents (CONTRACT.md any-body): a body of any type, empty included, stored as its bytes.
  def document(env)
    ctx = env["idempotency"]
    env["rack.input"].rewind
    raw = env["rack.input"].read.to_s.b
    ctype = env["CONTENT_TYPE"]
    id = ctx.connection.exec_params(
      "INSERT INTO documents (account, idempotency_key, content_type, body) VALUES ($1, $2, $3, $4) RETURNING id",
      [ctx.scope, ctx.key, ctype, { value: raw, format: 1 }]
    ).getvalue(0, 0).to_i
    json(201, { document_id: id, content_type: ctype, bytes: raw.bytesize, sha256: Digest::SHA256.hexdigest(raw) },
         { "Location" => "/documents/#{id}" })
  end

  # POST /rides (CONTRACT.md lease-rides): the rocket-rides story in lease mode. Steps charge_created (the
  # simulated provider's charge, then the ride and the checkpoint in one transaction) and receipt_sent (the
  # simulated mailer); finish marks the receipt sent and answers 201, stored as sent. `insert_ride` (conn, lease,
  # state, payment -> ride id) and `mark_sent` (conn, ride id), in the step's transaction, may write with the app's
  # own models (Rails); by default, SQL on the transaction's connection.
  RIDE_CHARGE = "INSERT INTO provider_charges (account, idempotency_key, amount_cents, currency) VALUES ($1, $2, $3, $4) " \
                "ON CONFLICT (account, idempotency_key) DO UPDATE SET amount_cents = EXCLUDED.amount_cents RETURNING charge_id"
  RIDE_INSERT = "INSERT INTO rides (account, idempotency_key, amount_cents, currency, charge_id, fencing_number) " \
                "VALUES ($1, $2, $3, $4, $5, $6) RETURNING id"
  RIDE_RECEIPT = "INSERT INTO receipts (account, idempotency_key, ride_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"
  RIDE_RECEIPT_SENT = "UPDATE rides SET receipt_sent = true WHERE id = $1"
  CRASH_STATUS = 70

  class ProviderDown < StandardError; end

  def lease_seconds
    Float(ENV.fetch("RIDES_LEASE_SECONDS", "30"))
  end

  def ride(env, faults:, insert_ride: nil, mark_sent: nil)
    ctx = env["idempotency"]
    payment = payment_of(env)
    return problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON") if payment.nil?
    return problem(422, "invalid-payment", "Invalid payment", payment[:error]) if payment[:error] # before any lease

    account, key, amount, currency = ctx.scope, ctx.key, payment[:amount], payment[:currency]
    fault = faults ? env["HTTP_X_FAULT"].to_s : ""
    insert_ride ||= lambda do |conn, lease, state, _payment|
      conn.exec_params(RIDE_INSERT, [account, key, amount, currency, state["charge_id"], lease.fencing_number])
          .getvalue(0, 0).to_i
    end
    ctx.lease(lease_seconds: lease_seconds) do |lease|
      charged = ->(conn, state) { state.merge("ride_id" => insert_ride.call(conn, lease, state, payment)) }
      lease.step("charge_created", commit: charged) do
        raise ProviderDown if fault == "provider-503"

        charge_id = lease.connection { |c| c.exec_params(RIDE_CHARGE, [account, key, amount, currency]).getvalue(0, 0) }
        crash! if fault == "crash-after-charge"
        if (m = /\Astall=(\d{1,7})\z/.match(fault))
          lease.stop_heartbeat # a stalled holder: the lease runs out, another attempt takes over
          sleep(m[1].to_i / 1000.0)
        end
        { "charge_id" => charge_id }
      end
      lease.step("receipt_sent") do
        crash! if fault == "crash-after-checkpoint"
        lease.connection { |c| c.exec_params(RIDE_RECEIPT, [account, key, lease.state["ride_id"]]) }
        lease.state
      end
      lease.finish do |conn|
        ride_id = lease.state["ride_id"]
        mark_sent ? mark_sent.call(conn, ride_id) : conn.exec_params(RIDE_RECEIPT_SENT, [ride_id])
        json(201, { ride_id: ride_id, account: account, amount_cents: amount, currency: currency,
                    charge_id: lease.state["charge_id"] }, { "Location" => "/rides/#{ride_id}" })
      end
    end
  rescue ProviderDown
    problem(503, "provider-unavailable", "Service Unavailable", "the payment provider answered 503")
  end

  # The crash faults: the process exits at once (under unicorn its master goes first, so the service is gone).
  def crash!
    Process.kill(:KILL, Process.ppid) if defined?(::Unicorn::HttpServer)
    exit!(CRASH_STATUS)
  end

  # The framework's own HTTP error a handler raises (rule framework-errors): the app answers it as
  # problem+json http-<status>.
  class FrameworkError < StandardError
    attr_reader :status

    def initialize(status, message)
      super(message)
      @status = status
    end
  end

  def framework_error(err)
    problem(err.status, "http-#{err.status}", Rack::Utils::HTTP_STATUS_CODES[err.status] || "Error", err.message)
  end

  # The middleware's route table: which requests it protects, and how.
  def protect(env)
    return nil unless env["REQUEST_METHOD"] == "POST"

    path = env["PATH_INFO"].to_s
    if path == "/payments" || path == "/documents" || path.match?(%r{\A/files/.+})
      true
    elsif path == "/rides"
      { lease: true } # lease mode: the handler leases the key and runs its steps (Payments.ride)
    elsif path == "/payments-unprotected"
      { claim: false } # the same handler in one transaction, no key: the benchmark's baseline
    end
  end
end
