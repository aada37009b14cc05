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

begin
  require "active_record"
rescue LoadError
  nil
end

# Lease mode through ActiveRecordBackend: a step's commit and finish write with a model in ActiveRecord's own
# transaction (rolled back with a 5xx finish), the heartbeat on a connection of ActiveRecord's pool.
class TestLeaseActiveRecord < Minitest::Test
  include DbHelper

  class Entry < ActiveRecord::Base
    self.table_name = "ledger"
  end if defined?(ActiveRecord)

  def setup
    skip "activerecord is not installed (ruby-rails)" unless defined?(ActiveRecord)
    db
    ActiveRecord::Base.establish_connection(URL) unless ActiveRecord::Base.connected?
  end

  def post(key, status: 201, beat_until: nil)
    handler = lambda do |env|
      env["idempotency"].lease(lease_seconds: 1.5) do |lease|
        write = lambda do |_conn, state|
          Entry.create!(account: lease.scope, amount_cents: -1, currency: "EUR", idempotency_key: lease.key)
          state
        end
        lease.step("one", commit: write) do
          beat_until&.call
          { "n" => 1 }
        end
        lease.finish do |_conn|
          Entry.create!(account: lease.scope, amount_cents: -2, currency: "EUR", idempotency_key: lease.key)
          [status, { "Content-Type" => "application/json" }, ['{"ok":true}']]
        end
      end
    end
    mw = IdempotencyPg::Middleware.new(handler, backend: IdempotencyPg::ActiveRecordBackend.new,
                                                scope: ->(_env) { "acct" }, protect: ->(_env) { { lease: true } },
                                                logger: Logger.new(nil))
    Rack::MockRequest.new(mw).request("POST", "/rides", method: "POST", input: "{}", "CONTENT_TYPE" => "application/json",
                                                        "HTTP_IDEMPOTENCY_KEY" => key)
  end

  def lease_until(key)
    db.exec_params("SELECT lease_until FROM idempotency_keys WHERE scope = 'acct' AND key = $1 UNION ALL " \
                   "SELECT lease_until FROM idempotency_keys_partitioned WHERE scope = 'acct' AND key = $1", [key])
      .getvalue(0, 0)
  end

  def test_model_writes_commit_with_each_step_and_the_heartbeat_extends
    key = new_key
    beat = lambda do
      first = lease_until(key)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
      sleep 0.05 until lease_until(key) != first || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      refute_equal first, lease_until(key), "the heartbeat never extended the lease"
    end
    assert_equal 503, post(key, status: 503, beat_until: beat).status
    assert_equal [-1], Entry.where(idempotency_key: key).pluck(:amount_cents) # finish's write rolled back
    first = post(key)
    assert_equal 201, first.status
    assert_equal [-2, -1], Entry.where(idempotency_key: key).pluck(:amount_cents).sort
    again = post(key)
    assert_equal [first.body, "true"], [again.body, again.headers["Idempotent-Replayed"]]
    refute ActiveRecord::Base.connection.transaction_open?
  end
end
