# frozen_string_literal: true

require_relative "helper"

# CONTRACT.md key-lifetime, without a server that writes the date yet: the claim's headers
# ({"Idempotency-Key-Expires": ...}) go on a stored first answer and on the 409/422 problems, never to the completion.
class TestKeyLifetime < Minitest::Test
  DATE = "Tue, 08 Dec 2026 10:30:00 GMT"
  Claim = IdempotencyPg::Statements::Claim

  class FakeStatements
    attr_reader :completed

    def initialize(claim)
      @claim = claim
    end

    def claim(*)
      @claim
    end

    def complete(_conn, _key, _scope, status, ctype, headers, body, **)
      @completed = [status, ctype, headers, body]
      true
    end

    def learn(_err)
      false
    end
  end

  class FakeBackend
    def transaction
      _commit, value = yield :conn
      value
    end
  end

  def answer(claim, status = 201, not_executed: false)
    app = lambda do |env|
      env["idempotency"].not_executed! if not_executed
      [status, { "Content-Type" => "application/json", "Location" => "/p/1" }, ["{}"]]
    end
    mw = IdempotencyPg::Middleware.new(app, backend: FakeBackend.new, logger: Logger.new(nil))
    statements = FakeStatements.new(claim)
    mw.instance_variable_set(:@statements, statements)
    r = Rack::MockRequest.new(mw).request("POST", "/payments", input: "{}", "HTTP_IDEMPOTENCY_KEY" => "k")
    [r, statements.completed]
  end

  def test_a_stored_first_answer_carries_the_date_and_the_completion_never_gets_it
    r, completed = answer(Claim.new("claimed", nil, nil, { "Idempotency-Key-Expires" => DATE }, nil))
    assert_equal [201, DATE], [r.status, r.headers["Idempotency-Key-Expires"]]
    refute_includes completed[2].keys.map(&:downcase), "idempotency-key-expires"
  end

  def test_answers_not_stored_carry_none
    [[503, false], [422, true]].each do |status, skip|
      r, completed = answer(Claim.new("claimed", nil, nil, { "Idempotency-Key-Expires" => DATE }, nil), status,
                            not_executed: skip)
      assert_equal status, r.status
      assert_nil r.headers["Idempotency-Key-Expires"]
      assert_nil completed
    end
  end

  def test_replay_mismatch_and_in_progress_carry_the_servers_date
    r, = answer(Claim.new("replay", 201, "application/json", { "Location" => "/p/1", "Idempotency-Key-Expires" => DATE }, "{}"))
    assert_equal [DATE, "true"], [r.headers["Idempotency-Key-Expires"], r.headers["Idempotent-Replayed"]]
    r, = answer(Claim.new("mismatch", 422, nil, { "Idempotency-Key-Expires" => DATE }, nil))
    assert_equal [422, DATE], [r.status, r.headers["Idempotency-Key-Expires"]]
    r, = answer(Claim.new("in_progress", 409, nil, { "Idempotency-Key-Expires" => DATE }, nil))
    assert_equal [409, DATE, "1"], [r.status, r.headers["Idempotency-Key-Expires"], r.headers["Retry-After"]]
    r, = answer(Claim.new("in_progress", 409, nil, nil, nil))
    assert_nil r.headers["Idempotency-Key-Expires"]
    r, = answer(Claim.new("expired", 410, nil, nil, nil))
    assert_equal "https://idempotency.dev/problems/idempotency-key-expired", JSON.parse(r.body)["type"]
  end
end
