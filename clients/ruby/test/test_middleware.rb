# frozen_string_literal: true

require_relative "helper"

# The middleware's flow against the database (CONTRACT.md), through Rack::MockRequest.
class TestMiddleware < Minitest::Test
  include DbHelper

  STRIPE = lambda do |p|
    headers = { "Content-Type" => "application/json",
                "Stripe-Should-Retry" => p.status == 409 ? "true" : "false" }.merge(p.headers)
    [p.status, headers, [JSON.generate({ error: { type: "idempotency_error", message: p.detail } })]]
  end

  # The handler: inserts a ledger row, answers by X-Answer (201 default; 503; raise; not-executed 422; 40001 once).
  def app(**opts)
    handler = lambda do |env|
      ctx = env["idempotency"]
      req = Rack::Request.new(env)
      amount = (req.media_type == "application/x-www-form-urlencoded" ? req.POST["amount_cents"] : 100).to_i
      if env["HTTP_X_ANSWER"] == "invalid"
        ctx.not_executed!
        next [422, { "Content-Type" => "application/problem+json" }, ['{"type":"invalid"}']]
      end
      id = ctx.connection.exec_params("INSERT INTO ledger (account, amount_cents, currency, idempotency_key) " \
                                      "VALUES ($1, $2, 'EUR', $3) RETURNING id", [ctx.scope, -amount, ctx.key])
                  .getvalue(0, 0)
      case env["HTTP_X_ANSWER"]
      when "503" then next [503, {}, ["down"]]
      when "raise" then raise "boom"
      when "40001"
        ctx.connection.exec("DO $$BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END$$") if ctx.attempt.zero?
      end
      [201, { "Content-Type" => "application/json", "Location" => "/p/#{id}", "X-Not-Replayed" => "1" },
       [JSON.generate({ id: id.to_i, amount: amount, card: { number: "4242", exp: "12/30" }, api_key: "sk" })]]
    end
    @mw = IdempotencyPg::Middleware.new(handler, backend: IdempotencyPg::PgBackend.new(pool),
                                                 scope: ->(_env) { "acct" }, replay_headers: %w[Location],
                                                 logger: Logger.new(nil), **opts)
    Rack::MockRequest.new(@mw)
  end

  def post(req, key, body = '{"amount_cents": 100}', **headers)
    env = { method: "POST", input: body, "CONTENT_TYPE" => headers.delete(:ctype) || "application/json" }
    env["HTTP_IDEMPOTENCY_KEY"] = key if key
    headers.each { |k, v| env["HTTP_#{k.to_s.upcase}"] = v }
    req.request("POST", "/payments", env)
  end

  def debits(key)
    db.exec_params("SELECT count(*) FROM ledger WHERE idempotency_key = $1", [key]).getvalue(0, 0).to_i
  end

  def test_first_answer_is_stored_and_replayed_byte_for_byte
    db
    req = app
    key = new_key
    first = post(req, key)
    assert_equal 201, first.status
    again = post(req, key, "{ \"amount_cents\" :100 }")
    assert_equal 201, again.status
    assert_equal first.body, again.body
    assert_equal "true", again.headers["Idempotent-Replayed"]
    assert_equal first.headers["Location"], again.headers["Location"]
    assert_nil again.headers["X-Not-Replayed"] # only replay_headers are stored
    assert_equal 1, debits(key)
    mismatch = post(req, key, '{"amount_cents": 101}')
    assert_equal 422, mismatch.status
    assert_equal "application/problem+json", mismatch.headers["Content-Type"]
    assert_equal "https://idempotency.dev/problems/idempotency-key-reused", JSON.parse(mismatch.body)["type"]
  end

  def test_5xx_exception_and_not_executed_store_nothing_and_release_the_key
    db
    req = app
    { "503" => 503, "raise" => 500, "invalid" => 422 }.each do |answer, status|
      key = new_key
      r = post(req, key, X_ANSWER: answer)
      assert_equal status, r.status, answer
      assert_nil r.headers["Idempotent-Replayed"]
      assert_nil stored(key), answer
      assert_equal 0, debits(key), answer
      assert_equal 201, post(req, key).status, "the retry of #{answer} runs"
      assert_equal 1, debits(key)
    end
  end

  def test_serialization_failure_runs_the_transaction_again
    db
    key = new_key
    r = post(app, key, X_ANSWER: "40001")
    assert_equal 201, r.status
    assert_equal 1, debits(key)
  end

  def test_key_errors_and_body_limits_before_any_claim
    db
    req = app(body_limit: 64)
    assert_equal "idempotency-key-missing", JSON.parse(post(req, nil).body)["type"].split("/").last
    r = post(req, "k1, k2")
    assert_equal 400, r.status
    assert_match(/several/, JSON.parse(r.body)["detail"])
    key = new_key
    assert_equal 413, post(req, key, "{\"amount_cents\": 100#{' ' * 64}}").status
    assert_nil stored(key)
    assert_equal 400, post(req, key, "{nope").status # a JSON type the claim cannot read: 400, nothing claimed
    assert_nil stored(key)
  end

  def test_any_body_the_framework_parses_the_form
    db
    req = app
    key = new_key
    r = post(req, key, "amount_cents=250&currency=EUR", ctype: "application/x-www-form-urlencoded")
    assert_equal 201, r.status
    assert_equal 250, JSON.parse(r.body)["amount"]
    assert_equal 422, post(req, key, "amount_cents=251&currency=EUR", ctype: "application/x-www-form-urlencoded").status
  end

  def test_error_shape_hook_renders_the_middlewares_answers
    db
    req = app(render_problem: STRIPE)
    r = post(req, nil)
    assert_equal 400, r.status
    assert_equal "false", r.headers["Stripe-Should-Retry"]
    assert_equal "idempotency_error", JSON.parse(r.body)["error"]["type"]
    key = new_key
    post(req, key)
    r = post(req, key, '{"amount_cents": 7}')
    assert_equal [422, "application/json"], [r.status, r.headers["Content-Type"]]
    # in progress: the key held by an open transaction
    other = PG.connect(URL)
    busy = new_key
    other.exec("BEGIN")
    other.exec_params("SELECT idem_claim_request($1, 'acct', 'POST', '/payments', NULL, 'application/json', '{}')", [busy])
    r = post(req, busy, "{}")
    assert_equal [409, "true", "1"], [r.status, r.headers["Stripe-Should-Retry"], r.headers["Retry-After"]]
  ensure
    other&.close
  end

  def test_store_less_redact_and_no_body
    db
    key = new_key
    req = app(redact: ["/card/number", "/api_key", "/absent"])
    first = post(req, key)
    assert_equal "4242", JSON.parse(first.body)["card"]["number"] # the first answer is sent whole
    again = post(req, key)
    doc = JSON.parse(again.body)
    assert_equal({ "exp" => "12/30" }, doc["card"])
    refute doc.key?("api_key")
    assert_equal "/card/number, /api_key", again.headers["Idempotent-Replay-Redacted"]
    refute_includes stored(key)[2], "4242"

    key = new_key
    req = app(store_body: false)
    assert_equal 201, post(req, key).status
    again = post(req, key)
    assert_equal [201, "", "omitted"], [again.status, again.body, again.headers["Idempotent-Replay-Body"]]
    assert_nil stored(key)[2]
  end

  def test_named_statements_fall_back_to_unnamed_when_the_server_lost_them
    db
    req = app(prepared: :auto)
    assert_equal 201, post(req, new_key).status
    assert @mw.statements.named?
    pool.with { |c| c.exec("DEALLOCATE ALL") } # as a pooler's other server connection: the names are not there
    key = new_key
    assert_equal 201, post(req, key).status
    refute @mw.statements.named?
    assert_equal 1, debits(key)
  end
end
