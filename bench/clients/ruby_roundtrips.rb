# frozen_string_literal: true

# One measurement of bench/clients/ruby_roundtrips.py: operations/s of one way, THREADS threads on an
# IdempotencyPg::Pool of as many connections, in process (no HTTP), for SECONDS after a warm-up.
#   ruby bench/clients/ruby_roundtrips.rb URL WAY SECONDS THREADS  ->  prints "<ops/s> <client CPU ms/op>"
# Ways: autocommit (the INSERT alone), bare-tx (PgBackend's transaction without a key: BEGIN, INSERT, COMMIT),
# mw-pipeline (the middleware, a fresh key per request: BEGIN + claim, INSERT, completion + COMMIT),
# mw-plain (the same with PgBackend pipeline: false: BEGIN, claim, INSERT, completion, COMMIT).
$LOAD_PATH.unshift(File.expand_path("../../clients/ruby/lib", __dir__))
require "securerandom"
require "stringio"
require "idempotency_pg"

url, way, seconds, threads = ARGV
seconds = Float(seconds)
threads = Integer(threads)
INSERT = "INSERT INTO ledger (account, amount_cents, currency, idempotency_key) VALUES ($1, $2, $3, $4) RETURNING id"
BODY = '{"amount_cents": 100, "currency": "EUR"}'

pool = IdempotencyPg::Pool.new(url, size: threads)
handler = lambda do |env|
  ctx = env["idempotency"]
  id = ctx.connection.exec_params(INSERT, ["bench", -100, "EUR", ctx.key || ""]).getvalue(0, 0)
  [201, { "Content-Type" => "application/json", "Location" => "/payments/#{id}" },
   [%({"payment_id": #{id}, "account": "bench", "amount_cents": 100, "currency": "EUR"})]]
end
op =
  case way
  when "autocommit"
    -> { pool.with { |c| c.exec_params(INSERT, ["bench", -100, "EUR", ""]) } }
  when "bare-tx", "mw-pipeline", "mw-plain"
    backend = IdempotencyPg::PgBackend.new(pool, pipeline: way != "mw-plain")
    route = way == "bare-tx" ? { claim: false } : true
    mw = IdempotencyPg::Middleware.new(handler, backend: backend, scope: ->(_env) { "bench" },
                                                protect: ->(_env) { route })
    lambda do
      env = { "REQUEST_METHOD" => "POST", "PATH_INFO" => "/payments", "CONTENT_TYPE" => "application/json",
              "CONTENT_LENGTH" => BODY.bytesize.to_s, "rack.input" => StringIO.new(BODY.dup),
              "HTTP_IDEMPOTENCY_KEY" => SecureRandom.hex(16) }
      status, = mw.call(env)
      raise "the middleware answered #{status}" unless status == 201
    end
  else abort "ruby_roundtrips.rb: unknown way #{way}"
  end

run = lambda do |stop|
  Array.new(threads) do
    Thread.new do
      n = 0
      while Process.clock_gettime(Process::CLOCK_MONOTONIC) < stop
        op.call
        n += 1
      end
      n
    end
  end.sum(&:value)
end
run.call(Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.5) # warm-up: every connection opened, names parsed
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
c0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
n = run.call(t0 + seconds)
elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - c0
pool.close
puts format("%.1f %.3f", n / elapsed, cpu / n * 1000)
