# frozen_string_literal: true

require "json"

module IdempotencyPg
  # Lease mode (clients/CONTRACT.md "lease-rides"): for a handler that calls something outside the database (a
  # payment provider), which must not hold a transaction open while it waits. The key is leased (idem_lease,
  # committed at once), then each step runs with no transaction open and a heartbeat extending the lease, and
  # records a recovery point (idem_checkpoint) in one short transaction with its local writes. A retry after a
  # crash, or a takeover after the lease ran out, skips the steps done and resumes with their state. Once another
  # attempt holds the key, the holder's next call gets SQLSTATE 55000: the run stops, writes nothing more, and
  # answers 409.
  #
  # A route the middleware protects with `{ lease: true }` gets the key parsed and the body read whole, as any
  # protected route, and then no claim: env["idempotency"] is a LeaseRequest, and the handler (after validating
  # the body: an answer without `lease` is not executed) runs
  #
  #   env["idempotency"].lease(lease_seconds: 30) do |lease|
  #     lease.step("charge_created", commit: ->(conn, state) { state.merge("ride_id" => insert_ride(conn, state)) }) do
  #       { "charge_id" => provider.charge(...) }        # no transaction open; the heartbeat runs meanwhile
  #     end
  #     lease.step("receipt_sent") { |l| mailer.send(l.state["ride_id"]); l.state }
  #     lease.finish { |conn| [201, { "Content-Type" => "application/json" }, [body]] }  # stored as sent
  #   end
  #
  # which returns the Rack response to answer: finish's, or a replay, a 409, 410 or 422 of the key.
  LEASE_LOST = "55000" # object_not_in_prerequisite_state: another attempt holds the key now

  # Every statement is sent unnamed (one per step: nothing to gain from a named one, and nothing for PgBouncer in
  # transaction pooling to lose). The lease's row is read in binary with every field but the bytes cast to text,
  # whose form no session setting changes; its timestamps are not read.
  module LeaseSQL
    LEASE = "SELECT l.outcome, l.http_status::text, l.lease_token::text, l.recovery_point, l.recovery_state::text, " \
            "l.fencing_number::text, l.response_content_type, l.response_bytes, l.response_body::text, " \
            "l.response_headers::text FROM idem_lease($1::text, idem_fingerprint($2::text, $3::text, $4::text, " \
            "$5::text, $6::bytea), make_interval(secs => $7::float8), $8::interval, $9::text) AS l"
    EXTEND = "SELECT idem_lease_extend($1::text, $2::uuid, make_interval(secs => $3::float8), $4::text)"
    CHECKPOINT = "SELECT idem_checkpoint($1::text, $2::uuid, $3::text, $4::jsonb, $5::text)"
    COMPLETE = "SELECT idem_lease_complete_request($1::text, $2::text, $3::uuid, $4::int, $5::text, $6::jsonb, " \
               "$7::bytea)"
    RELEASE = "SELECT idem_lease_release($1::text, $2::uuid, $3::text)"
  end

  # env["idempotency"] on a lease route: the request read whole (key, scope, body, content type, target), not
  # claimed yet. Built by the middleware.
  class LeaseRequest
    attr_reader :key, :scope, :method, :path, :query, :content_type, :body, :backend

    def initialize(backend:, key:, scope:, method:, path:, query:, content_type:, body:, answers:, ttl: nil,
                   logger: nil)
      @backend, @key, @scope, @method, @path, @query = backend, key, scope, method, path, query
      @content_type, @body, @answers, @ttl, @logger = content_type, body, answers, ttl, logger
    end

    # Nothing is claimed before `lease`, so an answer without it is not executed already (kept for the one idiom).
    def not_executed!; end

    # Lease the key and run the block's steps (see IdempotencyPg::Lease); returns the Rack response to answer.
    def lease(lease_seconds: 30, &block)
      raise ArgumentError, "lease needs a block of steps ending with lease.finish" unless block

      row = @backend.connection do |conn|
        conn.exec_params(LeaseSQL::LEASE, [@key, @method, @path, @query, @content_type, { value: @body, format: 1 },
                                           lease_seconds.to_f.to_s, @ttl, @scope], 1).first
      end
      row = row.transform_values { |v| v&.force_encoding(Encoding::UTF_8) }
      row["response_bytes"]&.force_encoding(Encoding::BINARY)
      return @answers.outcome(row) unless row["outcome"] == "claimed"

      Lease.new(self, row, lease_seconds.to_f, @answers, @logger).run(&block)
    end
  end

  # The holder of a lease, handed to the block of LeaseRequest#lease: `step`, `finish`, `state`, `token`,
  # `recovery_point`, `fencing_number` (extension 1.2's number, strictly increasing per takeover),
  # `stop_heartbeat` and `connection` (a connection of the backend, autocommit, for a step's own statements).
  class Lease
    attr_reader :key, :scope, :token, :recovery_point, :state, :fencing_number, :lease_seconds

    def initialize(request, row, lease_seconds, answers, logger)
      @request, @answers, @logger = request, answers, logger
      @backend = request.backend
      @key, @scope, @lease_seconds = request.key, request.scope, lease_seconds
      @token = row["lease_token"]
      @recovery_point = row["recovery_point"]
      @state = row["recovery_state"] ? JSON.parse(row["recovery_state"]) : {}
      @fencing_number = row["fencing_number"]&.to_i
      @expiry = (row["response_headers"] ? JSON.parse(row["response_headers"]) : {}).select { |k, _| k.casecmp?(EXPIRES) }
      @skipping = !@recovery_point.nil? # the steps up to the recovery point are done: skipped
      @response = nil
      @heartbeat = nil
    end

    def connection(&block)
      @backend.connection(&block)
    end

    # A step: the block (given the lease, no transaction open, the heartbeat running) returns the new state, a
    # Hash as JSON has it; `commit` (optional, given the connection of the checkpoint's transaction and that state)
    # writes what goes with the step and returns the state to record. A step done before (a retry, a takeover) is
    # skipped. Returns the state.
    def step(name, commit: nil)
      name = name.to_s
      if @skipping
        @skipping = false if name == @recovery_point
        return @state
      end
      state = @state
      if block_given?
        start_heartbeat
        begin
          state = yield self
        ensure
          end_heartbeat
        end
      end
      fenced do |conn|
        state = commit.call(conn, state) if commit
        conn.exec_params(LeaseSQL::CHECKPOINT, [@key, @token, name, JSON.generate(state), @scope])
        true
      end
      @state = JSON.parse(JSON.generate(state)) # what a resumed run reads back: string keys
      @recovery_point = name
      @state
    end

    # The last part: the block, in the completing transaction, returns the Rack response, stored as sent
    # (idem_lease_complete_request, less what the route does not store) and committed with its writes. A 5xx is
    # not stored: the transaction rolls back and the lease is released, the recovery point kept.
    def finish
      raise ArgumentError, "finish needs a block answering the response" unless block_given?
      raise "the steps after #{@recovery_point.inspect} were not all given" if @skipping

      answer = nil
      stored = fenced do |conn|
        status, headers, bytes = IdempotencyPg.collect(yield(conn))
        answer = [status, headers, [bytes]]
        next false if status >= 500

        ctype, kept, body = @answers.to_store(status, headers, bytes)
        conn.exec_params(LeaseSQL::COMPLETE, [@key, @scope, @token, status, ctype, kept && JSON.generate(kept),
                                              body.nil? ? nil : { value: body, format: 1 }])
        true
      end
      release unless stored
      # the key's expiry (CONTRACT.md key-lifetime) on the answer, after it was stored without it
      @response = stored ? [answer[0], answer[1].merge(@expiry), answer[2]] : answer
    end

    # No more beats in this step (the thread ends after an extend under way; the step's end waits for it).
    def stop_heartbeat
      @heartbeat&.stop(wait: false)
    end

    # The block's run: its steps and finish; a lost lease (55000) answers 409, any other error releases the lease
    # (the recovery point kept) and is raised again.
    def run
      yield self
      raise ArgumentError, "the lease block ended without lease.finish" unless @response

      @response
    rescue StandardError => e
      end_heartbeat
      if lost?(e)
        @logger&.info("idempotency: the lease of #{@key.inspect} was lost (SQLSTATE 55000)")
        return @answers.lost
      end
      release
      raise
    end

    private

    def lost?(err)
      [err, err.cause].any? { |e| e && IdempotencyPg.sqlstate(e) == LEASE_LOST }
    end

    # One transaction of the backend, opened by the fence: idem_lease_extend first, so a stale holder gets 55000
    # before any local write, and the key's row stays locked until the checkpoint (or the completion) commits.
    # The block returns true to commit, false to roll back.
    def fenced
      @backend.transaction do |conn, tx|
        tx&.open! # PgBackend leaves BEGIN to the first statement that can carry it; this one goes alone
        conn.exec_params(LeaseSQL::EXTEND, [@key, @token, @lease_seconds.to_s, @scope])
        commit = yield conn
        [commit, commit]
      end
    end

    def release
      @backend.connection { |conn| conn.exec_params(LeaseSQL::RELEASE, [@key, @token, @scope]) }
    rescue StandardError # stale (55000) or the database is gone: the lease runs out on its own
      nil
    end

    def end_heartbeat
      @heartbeat&.stop
      @heartbeat = nil
    end

    def start_heartbeat
      @heartbeat = Heartbeat.new(@backend, [@key, @token, @lease_seconds.to_s, @scope], @lease_seconds / 3.0, @logger)
    end
  end

  # The answers of a lease route that the middleware writes (through its error-shape hook) or stores (its
  # store-less options): built by the middleware for each request.
  class LeaseAnswers
    def initialize(render:, replay:, store:)
      @render, @replay, @store = render, replay, store
    end

    # The answer of a lease that was not claimed: a replay (1.3's bytes and content type, else the jsonb body's
    # text), a mismatch, in progress, or expired; the key's expiry among their headers (key-lifetime).
    def outcome(row)
      headers = row["response_headers"] && JSON.parse(row["response_headers"])
      expiry = (headers || {}).select { |k, _| k.casecmp?(EXPIRES) }
      status = row["http_status"]&.to_i
      case row["outcome"]
      when "replay"
        @replay.call(Statements::Claim.new("replay", status, row["response_content_type"], headers,
                                           row["response_bytes"] || row["response_body"]&.b))
      when "mismatch" then @render.call(Problems.mismatch(status, expiry))
      when "in_progress" then @render.call(Problems.in_progress(expiry))
      when "expired" then @render.call(Problems.expired)
      else raise "unknown idem_lease outcome #{row['outcome'].inspect}"
      end
    end

    # 409: another attempt took the key over (55000); its retry gets that attempt's answer.
    def lost
      @render.call(Problem.new(status: 409, type: "idempotency-key-in-progress", title: "Request in progress",
                               detail: "another attempt took this request over; retry later",
                               headers: { "Retry-After" => "1" }))
    end

    # [content_type, headers, body] to store for a response.
    def to_store(status, headers, bytes)
      @store.call(status, headers, bytes)
    end
  end

  # Extends the lease every lease / 3 seconds while a step runs, a thread on a connection of the backend's own
  # (a pooled one, taken for each extend). A failed extend never takes the request down: the next fence decides.
  class Heartbeat
    def initialize(backend, args, interval, logger)
      @backend, @args, @interval, @logger = backend, args, interval, logger
      @mutex = Mutex.new
      @wake = ConditionVariable.new
      @stopped = false
      @thread = Thread.new { beat }
    end

    # Stops the beats; waits for an extend under way unless called from a step that may hold the connection the
    # extend waits for (then the thread ends after it).
    def stop(wait: true)
      @mutex.synchronize do
        @stopped = true
        @wake.signal
      end
      @thread.join if wait && Thread.current != @thread
    end

    private

    def beat
      loop do
        @mutex.synchronize do
          @wake.wait(@mutex, @interval) unless @stopped
          return if @stopped
        end
        begin
          @backend.connection { |conn| conn.exec_params(LeaseSQL::EXTEND, @args) }
        rescue StandardError => e
          return if [e, e.cause].any? { |x| x && IdempotencyPg.sqlstate(x) == LEASE_LOST } # lost: the fence says so

          @logger&.warn("idempotency: lease heartbeat failed: #{e.class}: #{e.message}")
        end
      end
    end
  end
end
