# frozen_string_literal: true

require "json"
require "logger"
require "stringio"

module IdempotencyPg
  DEFAULT_BODY_LIMIT = 1024 * 1024
  RETRYABLE = %w[40001 40P01].freeze
  # SQLSTATEs of the claim that mean the body is not JSON that PostgreSQL accepts (under a JSON content type).
  BAD_BODY = %w[22P02 22P05 22003 22021].freeze
  # Response headers never stored for a replay (Content-Type goes to its own column).
  NOT_STORED = %w[content-type content-length transfer-encoding connection date set-cookie keep-alive
                  idempotency-key-expires idempotent-replayed].freeze
  EXPIRES = "Idempotency-Key-Expires"

  class BadBody < StandardError; end

  # What the handler finds in env["idempotency"]: the connection of the request's transaction, the key, the scope.
  class Context
    attr_reader :connection, :key, :scope, :attempt

    def initialize(connection, key, scope, attempt)
      @connection, @key, @scope, @attempt = connection, key, scope, attempt
      @not_executed = false
    end

    # Answer without executing (validation before any write): rolled back, not stored, the key released.
    def not_executed!
      @not_executed = true
    end

    def not_executed?
      @not_executed
    end
  end

  # A Rack response as [status, headers, body bytes], the body read whole and closed.
  def self.collect(response)
    status, headers, rbody = response
    bytes = +"".b
    begin
      rbody.each { |chunk| bytes << chunk.b }
    ensure
      rbody.close if rbody.respond_to?(:close)
    end
    [status.to_i, headers.to_h, bytes]
  end

  def self.not_executed!(env)
    env["idempotency"]&.not_executed!
  end

  # The Rack middleware: for a request `protect` selects, parse the key, read the whole body, claim, run the app in
  # the claim's transaction, store what it answered and commit, or roll back (CONTRACT.md's one flow).
  #
  #   use IdempotencyPg::Middleware, backend: IdempotencyPg::PgBackend.new(pool),
  #       scope: ->(env) { account_of(env) }, protect: ->(env) { env["PATH_INFO"] == "/payments" && env["REQUEST_METHOD"] == "POST" }
  #
  # protect(env) returns nil/false (not protected), true, or a Hash of per-route options: redact (JSON Pointers),
  # store_body (false: status and headers only), claim (false: the transaction only, no key), lease (true: lease
  # mode, the handler runs env["idempotency"].lease { |lease| ... }, lease.rb).
  class Middleware
    def initialize(app, backend:, protect: ->(env) { env["REQUEST_METHOD"] == "POST" }, scope: ->(_env) { "" },
                   ttl: nil, max_retries: 3, body_limit: DEFAULT_BODY_LIMIT, replay_headers: nil,
                   render_problem: nil, redact: nil, store_body: true, prepared: :auto, logger: nil,
                   problem_base: PROBLEM_BASE)
      raise ArgumentError, "backend is required (IdempotencyPg::PgBackend or ActiveRecordBackend)" unless backend
      raise ArgumentError, "render_problem must respond to call" if render_problem && !render_problem.respond_to?(:call)

      @app, @backend, @protect, @scope, @ttl, @max_retries = app, backend, protect, scope, ttl, max_retries
      @body_limit, @render_problem, @problem_base = body_limit, render_problem, problem_base
      @replay_headers = replay_headers&.map(&:downcase)
      @defaults = { redact: redact, store_body: store_body, claim: true }
      @statements = Statements.new(prepared)
      @logger = logger || Logger.new($stderr, progname: "idempotency")
    end

    attr_reader :statements

    def call(env)
      route = @protect.call(env)
      return @app.call(env) unless route

      execute(env, @defaults.merge(route.is_a?(Hash) ? route : {}))
    rescue HttpProblem => e
      DEFAULT_RENDER.call(e.problem, @problem_base)
    end

    private

    def render(problem)
      return DEFAULT_RENDER.call(problem, @problem_base) unless @render_problem

      @render_problem.call(problem)
    end

    def execute(env, opts)
      scope = @scope.call(env).to_s
      key = opts[:claim] ? Header.parse(env["HTTP_IDEMPOTENCY_KEY"]) : nil
      body = read_body(env)
      return render(body) if body.is_a?(Problem)
      return lease_route(env, opts, key, scope, body) if opts[:lease]

      path, query = target(env)
      content_type = env["CONTENT_TYPE"]
      attempt = 0
      learnt = false
      begin
        @backend.transaction do |conn, tx|
          run(env, conn, tx, opts, key, scope, path, query, content_type, body, attempt)
        end
      rescue BadBody
        render(Problems.not_json)
      rescue StandardError => e
        code = IdempotencyPg.sqlstate(e) || IdempotencyPg.sqlstate(e.cause)
        if key && !learnt && @statements.learn(e.cause || e)
          learnt = true # once: a second 26000 is an error like any other
          @logger.info("SQLSTATE #{code} at the claim: going on with unnamed statements")
          retry
        end
        if RETRYABLE.include?(code)
          attempt += 1
          retry if attempt <= @max_retries
          return render(Problems.conflict)
        end
        @logger.error("request rolled back: #{e.class}: #{e.message}")
        render(Problems.internal(code ? "database error (SQLSTATE #{code}); the request was rolled back"
                                      : "the request failed and was rolled back"))
      end
    rescue KeyHeaderError => e
      render(Problems.missing_key(e))
    end

    # One attempt, inside the backend's transaction: returns [commit?, rack response]. tx: PgBackend's Transaction
    # (BEGIN sent with the claim, COMMIT with the completion), or nil (ActiveRecord's transaction, begun already).
    def run(env, conn, tx, opts, key, scope, path, query, content_type, body, attempt)
      expiry = {}
      if key
        claim = begin
          @statements.claim(conn, key, scope, env["REQUEST_METHOD"], path, query, content_type, body, @ttl,
                            begin_sql: tx&.take_begin)
        rescue PG::Error => e
          raise BadBody, e.message if BAD_BODY.include?(IdempotencyPg.sqlstate(e))

          raise
        end
        expiry = (claim.headers || {}).select { |k, _| k.casecmp?(EXPIRES) }
        case claim.outcome
        when "claimed" then nil
        when "replay" then return [false, replay(claim)]
        when "mismatch" then return [false, render(Problems.mismatch(claim.http_status, expiry))]
        when "in_progress" then return [false, render(Problems.in_progress(expiry))]
        when "expired" then return [false, render(Problems.expired)]
        else raise "unknown idem_claim_request outcome #{claim.outcome.inspect}"
        end
      end
      tx&.open!
      ctx = Context.new(conn, key, scope, attempt)
      status, headers, bytes = call_app(env, ctx, body)
      return [false, [status, headers, [bytes]]] if status >= 500 || ctx.not_executed?
      return [true, [status, headers, [bytes]]] unless key

      ctype, stored_headers, stored_body = to_store(status, headers, bytes, opts)
      @statements.complete(conn, key, scope, status, ctype, stored_headers, stored_body, commit: !tx.nil?)
      tx&.committed!
      [true, [status, headers.merge(expiry), [bytes]]]
    end

    # A lease route (protect's `lease: true`, CONTRACT.md lease-rides): the key and the body read as for any
    # protected route, then the app with a LeaseRequest in env["idempotency"] and no claim: the handler leases
    # the key and runs its steps (lease.rb). An error the handler lets through answers 500 (the lease released).
    def lease_route(env, opts, key, scope, body)
      raise ArgumentError, "a lease route needs a key (claim: true)" unless key

      path, query = target(env)
      answers = LeaseAnswers.new(render: method(:render), replay: method(:replay),
                                 store: ->(status, headers, bytes) { to_store(status, headers, bytes, opts) })
      req = LeaseRequest.new(backend: @backend, key: key, scope: scope, method: env["REQUEST_METHOD"], path: path,
                             query: query, content_type: env["CONTENT_TYPE"], body: body, ttl: @ttl,
                             answers: answers, logger: @logger)
      status, headers, bytes = call_app(env, req, body)
      [status, headers, [bytes]]
    rescue StandardError => e
      @logger.error("lease route failed: #{e.class}: #{e.message}")
      render(Problems.internal("the request failed; its lease was released"))
    end

    # The app's answer as [status, headers, body bytes], the request body given back as rack.input.
    def call_app(env, ctx, body)
      env = env.merge("rack.input" => StringIO.new(body.dup), "idempotency" => ctx)
      IdempotencyPg.collect(begin
        @app.call(env)
      rescue HttpProblem => e
        DEFAULT_RENDER.call(e.problem, @problem_base)
      end)
    end

    def replay(claim)
      headers = {}
      headers["Content-Type"] = claim.content_type if claim.content_type
      (claim.headers || {}).each { |k, v| headers[k] = v.to_s }
      headers["Idempotent-Replayed"] = "true"
      [claim.http_status, headers, [claim.body || ""]]
    end

    # [content_type, headers, body] to store (CONTRACT.md store-less: what is dropped never reaches the completion).
    def to_store(_status, headers, bytes, opts)
      ctype = nil
      stored = {}
      headers.each do |k, v|
        name = k.downcase
        if name == "content-type"
          ctype = v
        elsif !NOT_STORED.include?(name) && (@replay_headers.nil? || @replay_headers.include?(name))
          stored[k] = v
        end
      end
      body = bytes
      if opts[:store_body] == false
        stored["Idempotent-Replay-Body"] = "omitted"
        return [nil, stored, nil]
      end
      if opts[:redact] && !opts[:redact].empty? && json_type?(ctype)
        redacted, dropped = Redact.call(bytes, opts[:redact])
        if dropped.any?
          body = redacted
          stored["Idempotent-Replay-Redacted"] = dropped.join(", ")
        end
      end
      [ctype, stored.empty? ? nil : stored, body]
    end

    def json_type?(ctype)
      media = ctype.to_s.split(";", 2).first.to_s.strip.downcase
      media == "application/json" || media.end_with?("+json")
    end

    # The whole body, or a Problem (413 over the limit, 400 when it ended before its Content-Length).
    def read_body(env)
      declared = env["CONTENT_LENGTH"]
      declared = declared.nil? || declared.empty? ? nil : Integer(declared, exception: false)
      return Problems.too_large(@body_limit) if declared && declared > @body_limit

      input = env["rack.input"]
      begin
        body = +"".b
        # read on until the end (nil): a streaming input (unicorn's) may return fewer bytes than asked
        while input && body.bytesize <= @body_limit && (chunk = input.read(@body_limit + 1 - body.bytesize))
          body << chunk.b
        end
      rescue EOFError, IOError, SystemCallError # the client went away while its body was read (a streaming server)
        return Problems.unreadable
      end
      return Problems.too_large(@body_limit) if body.bytesize > @body_limit
      return Problems.unreadable if declared && body.bytesize != declared

      body
    end

    # The request target as the request line sent it (CONTRACT.md raw-target): Puma's REQUEST_URI, else
    # SCRIPT_NAME + PATH_INFO (a server that gives only those: decoded, so `%2F` cannot be told from `/`).
    def target(env)
      uri = env["REQUEST_URI"]
      if uri.nil? || uri.empty?
        uri = "#{env['SCRIPT_NAME']}#{env['PATH_INFO']}"
        uri += "?#{env['QUERY_STRING']}" unless env["QUERY_STRING"].to_s.empty?
      end
      uri = uri.sub(%r{\A[a-zA-Z][a-zA-Z0-9+.-]*://[^/?]*}, "") # absolute-form
      path, query = uri.split("?", 2)
      [path, query.nil? || query.empty? ? nil : query]
    end
  end

  # Drop JSON Pointers (RFC 6901) from a JSON object body: [bytes, pointers dropped]. A body that is not a JSON
  # object comes back as is.
  module Redact
    module_function

    def call(bytes, pointers)
      doc = JSON.parse(bytes)
      return [bytes, []] unless doc.is_a?(Hash)

      dropped = pointers.select { |p| drop(doc, p) }
      [dropped.empty? ? bytes : JSON.generate(doc).b, dropped]
    rescue JSON::ParserError
      [bytes, []]
    end

    def drop(doc, pointer)
      tokens = pointer.split("/", -1).drop(1).map { |t| t.gsub("~1", "/").gsub("~0", "~") }
      return false if tokens.empty?

      parent = tokens[0..-2].reduce(doc) do |node, t|
        case node
        when Hash then node[t]
        when Array then t =~ /\A(0|[1-9]\d*)\z/ ? node[t.to_i] : nil
        end
      end
      last = tokens.last
      case parent
      when Hash then parent.key?(last) ? (parent.delete(last) || true) : false
      when Array then last =~ /\A(0|[1-9]\d*)\z/ && last.to_i < parent.size ? (parent.delete_at(last.to_i) || true) : false
      else false
      end
    end
  end
end
