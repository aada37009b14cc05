# frozen_string_literal: true

require_relative "helper"
begin
  require "active_record"
rescue LoadError
  nil
end

# ActiveRecordBackend: the claim, the model's writes and the completion are one ActiveRecord transaction.
class TestActiveRecord < Minitest::Test
  include DbHelper

  class Entry < ActiveRecord::Base
    self.table_name = "ledger"
  end if defined?(ActiveRecord)

  def setup
    skip "activerecord is not installed (ruby-rails)" unless defined?(ActiveRecord)
    db
    ActiveRecord::Base.establish_connection(URL) unless ActiveRecord::Base.connected?
  end

  def app
    handler = lambda do |env|
      ctx = env["idempotency"]
      e = Entry.create!(account: ctx.scope, amount_cents: -100, currency: "EUR", idempotency_key: ctx.key)
      next [503, {}, ["down"]] if env["HTTP_X_ANSWER"] == "503"

      [201, { "Content-Type" => "application/json" }, [%({"id":#{e.id}})]]
    end
    Rack::MockRequest.new(IdempotencyPg::Middleware.new(handler, backend: IdempotencyPg::ActiveRecordBackend.new,
                                                                 scope: ->(_env) { "acct" }, logger: Logger.new(nil)))
  end

  def post(req, key, **headers)
    env = { method: "POST", input: "{}", "CONTENT_TYPE" => "application/json", "HTTP_IDEMPOTENCY_KEY" => key }
    headers.each { |k, v| env["HTTP_#{k.to_s.upcase}"] = v }
    req.request("POST", "/payments", env)
  end

  def test_the_models_write_commits_with_the_answer_or_not_at_all
    req = app
    key = new_key
    assert_equal 503, post(req, key, X_ANSWER: "503").status
    assert_equal 0, Entry.where(idempotency_key: key).count # the model's insert rolled back with the claim
    assert_nil stored(key)
    first = post(req, key)
    assert_equal 201, first.status
    again = post(req, key)
    assert_equal [first.body, "true"], [again.body, again.headers["Idempotent-Replayed"]]
    assert_equal 1, Entry.where(idempotency_key: key).count
    refute ActiveRecord::Base.connection.transaction_open?
  end
end
