# frozen_string_literal: true

require_relative "helper"
require "tempfile"
require "timeout"

# CONTRACT.md "Round trips", read from libpq's trace of the connection: PgBackend sends BEGIN with the claim and
# the completion with COMMIT (pipeline mode), so a claimed request costs what a bare transactional handler costs.
class TestRoundTrips < Minitest::Test
  include DbHelper

  # A pool of one connection: the traced one.
  OneConnection = Struct.new(:conn) do
    def with
      yield conn
    end
  end

  INSERT = "INSERT INTO ledger (account, amount_cents, currency, idempotency_key) VALUES ($1, -100, 'EUR', $2) RETURNING id"

  def app(conn, prepared, pipeline: true)
    handler = lambda do |env|
      ctx = env["idempotency"]
      id = ctx.connection.exec_params(INSERT, [ctx.scope, ctx.key || ""]).getvalue(0, 0)
      next [503, {}, ["down"]] if env["HTTP_X_ANSWER"] == "503"

      [201, { "Content-Type" => "application/json" }, [%({"id":#{id}})]]
    end
    protect = ->(env) { env["PATH_INFO"] == "/bare" ? { claim: false } : true }
    @mw = IdempotencyPg::Middleware.new(handler, backend: IdempotencyPg::PgBackend.new(OneConnection.new(conn), pipeline: pipeline),
                                                 scope: ->(_env) { "acct" }, protect: protect, prepared: prepared,
                                                 logger: Logger.new(nil))
    Rack::MockRequest.new(@mw)
  end

  def post(req, key, path: "/payments", body: '{"amount_cents": 100}', answer: nil)
    env = { input: body, "CONTENT_TYPE" => "application/json" }
    env["HTTP_IDEMPOTENCY_KEY"] = key if key
    env["HTTP_X_ANSWER"] = answer if answer
    req.request("POST", path, env)
  end

  # Each round trip of a libpq trace (the messages sent before the answers are read), named by what it sends: a
  # simple query by its text, an extended-protocol statement by the idem_ function it calls (else its text), a
  # Parse not bound in the same round trip as "prepare <name>".
  def self.round_trips(trace)
    name = ->(sql) { sql[/\b(idem_\w+)\(/, 1] || sql }
    trips, sent, parsed, texts, last = [], [], [], {}, nil
    File.foreach(trace) do |line|
      _time, dir, _len, msg, fields = line.chomp.split("\t", 5)
      if dir == "B" && last == "F"
        trips << (sent + parsed.map { |p| "prepare #{p}" }).join("; ")
        sent, parsed = [], []
      end
      last = dir
      next unless dir == "F"

      case msg
      when "Query" then sent << name.(fields[/\A\s*"(.*)"\z/, 1])
      when "Parse"
        stmt, sql = fields.match(/\A\s*"([^"]*)" "(.*)" \d+/).captures
        texts[stmt] = name.(sql)
        parsed << texts[stmt]
      when "Bind"
        text = texts[fields[/\A\s*"[^"]*" "([^"]*)"/, 1]]
        parsed.delete_at(parsed.index(text)) if parsed.include?(text)
        sent << text
      end
    end
    trips
  end

  def traced(conn)
    file = Tempfile.new("idem-trace")
    conn.trace(file)
    yield
    conn.untrace
    file.flush
    self.class.round_trips(file.path)
  ensure
    file&.close!
  end

  def check_round_trips(prepared)
    conn = PG.connect(DbHelper::URL)
    req = app(conn, prepared)
    key, failed = new_key, new_key
    trips = traced(conn) do
      assert_equal 201, post(req, key).status
      assert_equal "true", post(req, key).headers["Idempotent-Replayed"]
      assert_equal 503, post(req, failed, answer: "503").status
      assert_equal 201, post(req, nil, path: "/bare").status
      assert_equal 400, post(req, new_key, body: "{not json").status
      assert_equal 201, post(req, failed).status
    end
    insert = INSERT
    assert_equal ["BEGIN; idem_claim_request", insert, "idem_complete_request; COMMIT", # claimed: 3, as bare
                  "BEGIN; idem_claim_request", "ROLLBACK",                             # replay: 2
                  "BEGIN; idem_claim_request", insert, "ROLLBACK",                     # 503: rolled back
                  "BEGIN", insert, "COMMIT",                                           # no key: the bare handler
                  "BEGIN; idem_claim_request", "ROLLBACK",                             # not JSON: 22P02 at the claim
                  "BEGIN; idem_claim_request", insert, "idem_complete_request; COMMIT"], trips
    assert_equal PG::PQTRANS_IDLE, conn.transaction_status
    conn.exec("SELECT statement FROM pg_prepared_statements").map { |r| r["statement"][/idem_\w+/] || r["statement"] }.sort
  ensure
    conn&.close
  end

  def test_begin_goes_with_the_claim_and_commit_with_the_completion_over_named_statements
    db
    # the names (BEGIN and COMMIT too) parsed in the claim's and the completion's first round trips, bound after
    assert_equal %w[BEGIN COMMIT idem_claim_request idem_complete_request], check_round_trips(true)
  end

  def test_the_same_round_trips_over_unnamed_statements
    db
    assert_empty check_round_trips(false) # behind PgBouncer (before 1.21): nothing named
  end

  def test_names_parsed_in_a_round_trip_whose_claim_failed_are_kept
    db
    conn = PG.connect(DbHelper::URL)
    req = app(conn, :auto)
    # the first claim on the connection fails on its body (22P02) after BEGIN's and its own Parse succeeded: the
    # names are on the server, so the next request binds them instead of parsing them again (42P05, which would
    # turn named statements off for good)
    trips = traced(conn) do
      assert_equal 400, post(req, new_key, body: "{not json").status
      assert_equal 201, post(req, new_key).status
    end
    assert @mw.statements.named?
    assert_equal ["BEGIN; idem_claim_request", "ROLLBACK",
                  "BEGIN; idem_claim_request", INSERT, "idem_complete_request; COMMIT"], trips
    assert_equal 4, conn.exec("SELECT count(*) FROM pg_prepared_statements").getvalue(0, 0).to_i
  ensure
    conn&.close
  end

  def test_a_connection_lost_in_the_pipeline_is_a_500_and_dropped_from_the_pool
    db
    one = IdempotencyPg::Pool.new(DbHelper::URL, size: 1)
    mw = IdempotencyPg::Middleware.new(->(_env) { [201, {}, ["{}"]] }, backend: IdempotencyPg::PgBackend.new(one),
                                                                     scope: ->(_env) { "acct" }, logger: Logger.new(nil))
    req = Rack::MockRequest.new(mw)
    assert_equal 201, post(req, new_key).status
    pid = one.with(&:backend_pid)
    db.exec_params("SELECT pg_terminate_backend($1, 20000)", [pid]) # returns once it is gone
    r = Timeout.timeout(20) { post(req, new_key) }
    assert_equal 500, r.status, r.body
    assert_equal 201, post(req, new_key).status # a new connection
    refute_equal pid, one.with(&:backend_pid)
  ensure
    one&.close
  end

  def test_without_the_pipeline_each_statement_is_a_round_trip
    db
    conn = PG.connect(DbHelper::URL)
    req = app(conn, true, pipeline: false)
    key = new_key
    trips = traced(conn) do
      assert_equal 201, post(req, key).status
      assert_equal 201, post(req, new_key).status
      assert_equal "true", post(req, key).headers["Idempotent-Replayed"]
    end
    assert_equal ["BEGIN", "prepare idem_claim_request", "idem_claim_request", INSERT, "prepare idem_complete_request",
                  "idem_complete_request", "COMMIT",
                  "BEGIN", "idem_claim_request", INSERT, "idem_complete_request", "COMMIT",
                  "BEGIN", "idem_claim_request", "ROLLBACK"], trips
  ensure
    conn&.close
  end

  def test_a_failed_completion_rolls_back_and_the_connection_goes_on
    db
    conn = PG.connect(DbHelper::URL)
    req = app(conn, :auto)
    key = new_key
    # the completion's Bind fails (the name is gone, as behind a pooler's other server connection): COMMIT in the
    # same pipeline is aborted, the transaction rolled back, the request run again unnamed
    assert_equal 201, post(req, new_key).status
    @mw.statements.define_singleton_method(:complete) do |c, *args, **kw|
      c.exec("DEALLOCATE ALL")
      singleton_class.send(:remove_method, :complete)
      complete(c, *args, **kw)
    end
    r = post(req, key)
    assert_equal 201, r.status, r.body
    assert_nil r.headers["Idempotent-Replayed"]
    refute @mw.statements.named?
    assert_equal 1, db.exec_params("SELECT count(*) FROM ledger WHERE idempotency_key = $1", [key]).getvalue(0, 0).to_i
    assert_equal "true", post(req, key).headers["Idempotent-Replayed"]
    assert_equal PG::PQ_PIPELINE_OFF, conn.pipeline_status
  ensure
    conn&.close
  end
end
