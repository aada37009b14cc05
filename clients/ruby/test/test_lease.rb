# frozen_string_literal: true

require_relative "helper"

# Lease mode (lease.rb, CONTRACT.md lease-rides) against the database, through the middleware's lease route:
# steps, heartbeat, a stale holder fenced off, the steps done skipped on a retry or a takeover. No check waits on
# wall time: each polls the database's own state with a wide bound.
class TestLease < Minitest::Test
  include DbHelper

  # The handler: step "one" (its block counted, its commit writing a ledger row of -1), step "two" (its commit
  # counted), finish (a ledger row of -2, 201).
  # @hooks may hold a lambda per place: :one, :two (given the lease, in the step's block), :finish (status).
  def app(lease_seconds: 30, **opts)
    @calls = Hash.new(0)
    @hooks ||= {}
    handler = lambda do |env|
      env["idempotency"].lease(lease_seconds: lease_seconds) do |lease|
        insert = lambda do |conn, state|
          @calls[:commit] += 1
          id = conn.exec_params("INSERT INTO ledger (account, amount_cents, currency, idempotency_key) " \
                                "VALUES ($1, -1, 'EUR', $2) RETURNING id", [lease.scope, lease.key]).getvalue(0, 0)
          state.merge(ledger_id: id.to_i)
        end
        lease.step("one", commit: insert) do
          @calls[:one] += 1
          @hooks[:one]&.call(lease)
          { charge: "ch_#{lease.fencing_number}" }
        end
        lease.step("two", commit: ->(_conn, state) { (@calls[:commit_two] += 1) && state }) do
          @calls[:two] += 1
          @hooks[:two]&.call(lease)
          lease.state.merge("two" => true)
        end
        lease.finish do |conn|
          @calls[:finish] += 1
          conn.exec_params("INSERT INTO ledger (account, amount_cents, currency, idempotency_key) " \
                           "VALUES ($1, -2, 'EUR', $2)", [lease.scope, lease.key])
          status = @hooks[:finish]&.call || 201
          [status, { "Content-Type" => "application/json", "Location" => "/r/#{lease.state['ledger_id']}" },
           [JSON.generate(lease.state.merge(fencing: lease.fencing_number))]]
        end
      end
    end
    mw = IdempotencyPg::Middleware.new(handler, backend: IdempotencyPg::PgBackend.new(pool),
                                                scope: ->(_env) { "acct" }, protect: ->(_env) { { lease: true } },
                                                logger: Logger.new(nil), **opts)
    Rack::MockRequest.new(mw)
  end

  def post(req, key, body = '{"amount_cents": 100}')
    req.request("POST", "/rides", method: "POST", input: body, "CONTENT_TYPE" => "application/json",
                                  "HTTP_IDEMPOTENCY_KEY" => key)
  end

  def key_row(key, expr)
    db.exec_params("SELECT #{expr} FROM idempotency_keys WHERE scope = 'acct' AND key = $1 UNION ALL " \
                   "SELECT #{expr} FROM idempotency_keys_partitioned WHERE scope = 'acct' AND key = $1", [key])
      .getvalue(0, 0)
  end

  # Polls the database until the block is true; fails after `bound` seconds.
  def poll(what, bound = 30)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + bound
    until yield
      flunk "#{what} not within #{bound} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.05
    end
  end

  def lapsed?(key)
    key_row(key, "lease_until < clock_timestamp()") == "t"
  end

  def test_steps_run_and_the_answer_replays_byte_for_byte
    db
    req = app
    key = new_key
    first = post(req, key)
    assert_equal 201, first.status
    body = JSON.parse(first.body)
    assert_equal "ch_#{body['fencing']}", body["charge"] # the fencing number handed to the steps
    assert body["two"]
    assert_match(/\A\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT\z/, first.headers["Idempotency-Key-Expires"])
    again = post(req, key)
    assert_equal [201, first.body, "true"], [again.status, again.body, again.headers["Idempotent-Replayed"]]
    assert_equal first.headers["Location"], again.headers["Location"]
    assert_equal({ one: 1, commit: 1, two: 1, commit_two: 1, finish: 1 }, @calls.to_h)
    refute_match(/expires/i, stored(key)[1].to_s) # the expiry is not stored among the headers
    assert_equal 422, post(req, key, '{"amount_cents": 101}').status
  end

  def test_heartbeat_extends_the_lease_while_a_step_runs
    db
    key = new_key
    seen = []
    @hooks = { one: lambda do |_lease|
      first = key_row(key, "lease_until")
      seen << first
      poll("an extend of the lease by the heartbeat") { key_row(key, "lease_until > '#{first}'::timestamptz") == "t" }
      seen << key_row(key, "lease_until")
    end }
    r = post(app(lease_seconds: 1.5), key)
    assert_equal 201, r.status, r.body
    assert_equal 2, seen.size
  end

  def test_a_stale_holder_is_fenced_off_and_the_taker_resumes_after_the_recovery_point
    db
    key = new_key
    req = app(lease_seconds: 1)
    taker = nil
    taking = false
    @hooks = { two: lambda do |lease|
      next if taking # the taker's own run of step two

      taking = true
      lease.stop_heartbeat # stalled: the lease runs out
      poll("the lease ran out") { lapsed?(key) }
      taker = post(req, key) # another attempt takes over: step one is done, it runs two and finishes
    end }
    stalled = post(req, key)
    assert_equal 201, taker.status, taker.body
    assert_equal 409, stalled.status # the stale holder got 55000 at its next fence and stopped
    assert_equal "1", stalled.headers["Retry-After"]
    assert_equal({ one: 1, commit: 1, two: 2, commit_two: 1, finish: 1 }, @calls.to_h) # fenced before two.s commit
    ones = db.exec_params("SELECT count(*) FROM ledger WHERE idempotency_key = $1 AND amount_cents = -1", [key])
    assert_equal 1, ones.getvalue(0, 0).to_i # step one's write, once
    body = JSON.parse(taker.body)
    assert_operator body["fencing"], :>, Integer(body["charge"].delete_prefix("ch_")) # the first holder's state
    assert_equal [201, taker.body], [post(req, key).status, post(req, key).body]
  end

  def test_a_failed_step_releases_the_lease_and_the_retry_skips_the_steps_done
    db
    key = new_key
    req = app
    @hooks = { two: ->(_lease) { raise "mailer down" } }
    r = post(req, key)
    assert_equal 500, r.status
    assert_nil stored(key)[0]
    assert_equal "one", key_row(key, "recovery_point") # released at once, the recovery point kept
    assert_equal "t", key_row(key, "lease_until IS NULL OR lease_until <= clock_timestamp()")
    @hooks = {}
    assert_equal 201, post(req, key).status
    assert_equal({ one: 1, commit: 1, two: 2, commit_two: 1, finish: 1 }, @calls.to_h)
  end

  def test_a_5xx_finish_is_not_stored_and_the_retry_runs_finish_again
    db
    key = new_key
    req = app
    @hooks = { finish: -> { 503 } }
    assert_equal 503, post(req, key).status
    assert_nil stored(key)[0]
    @hooks = {}
    r = post(req, key)
    assert_equal 201, r.status
    assert_equal({ one: 1, commit: 1, two: 1, commit_two: 1, finish: 2 }, @calls.to_h)
    finished = db.exec_params("SELECT count(*) FROM ledger WHERE idempotency_key = $1 AND amount_cents = -2", [key])
    assert_equal 1, finished.getvalue(0, 0).to_i # the 503's writes rolled back
  end

  def test_store_less_applies_to_the_completion
    db
    key = new_key
    r = post(app(store_body: false), key)
    assert_equal 201, r.status
    refute_empty r.body # the first answer is sent whole
    again = post(app(store_body: false), key)
    assert_equal ["", "omitted"], [again.body, again.headers["Idempotent-Replay-Body"]]
  end
end
