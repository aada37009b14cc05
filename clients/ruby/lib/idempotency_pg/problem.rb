# frozen_string_literal: true

require "json"

module IdempotencyPg
  PROBLEM_BASE = "https://idempotency.dev/problems/"

  # An answer the middleware writes itself (CONTRACT.md error-shape): `type` is the problem type's last segment,
  # `headers` the ones the middleware adds (Retry-After on 409, Idempotency-Key-Expires on 409 and 422).
  Problem = Struct.new(:status, :type, :title, :detail, :headers, keyword_init: true)

  # The default shape: application/problem+json per RFC 9457. Returns a Rack triple.
  DEFAULT_RENDER = lambda do |problem, base = PROBLEM_BASE|
    body = JSON.generate({ "type" => base + problem.type, "title" => problem.title, "status" => problem.status,
                           "detail" => problem.detail })
    [problem.status, { "Content-Type" => "application/problem+json" }.merge(problem.headers || {}), [body]]
  end

  # Raised by a handler (or the framework's error mapping) to answer a problem of its own.
  class HttpProblem < StandardError
    attr_reader :problem

    def initialize(status, type, title, detail = "", headers = {})
      super(detail.to_s.empty? ? title : detail)
      @problem = Problem.new(status: status, type: type, title: title, detail: detail, headers: headers)
    end
  end

  module Problems
    module_function

    def missing_key(err)
      Problem.new(status: 400, type: err.slug, title: err.missing? ? "Idempotency-Key required" : "Invalid Idempotency-Key",
                  detail: err.message, headers: {})
    end

    def too_large(limit)
      Problem.new(status: 413, type: "request-too-large", title: "Request body too large",
                  detail: "the request body is over #{limit} bytes", headers: { "Connection" => "close" })
    end

    def unreadable
      Problem.new(status: 400, type: "request-body-unreadable", title: "Unreadable request body",
                  detail: "the request body ended before its Content-Length; nothing was done",
                  headers: { "Connection" => "close" })
    end

    def not_json
      Problem.new(status: 400, type: "request-body-not-json", title: "Malformed request body",
                  detail: "the request body is not JSON", headers: {})
    end

    def mismatch(status, headers)
      Problem.new(status: status || 422, type: "idempotency-key-reused", title: "Idempotency-Key reused",
                  detail: "this Idempotency-Key was already used with a different request", headers: headers)
    end

    def in_progress(headers)
      Problem.new(status: 409, type: "idempotency-key-in-progress", title: "Request in progress",
                  detail: "a request with this Idempotency-Key is still being processed; retry later",
                  headers: { "Retry-After" => "1" }.merge(headers))
    end

    def expired
      Problem.new(status: 410, type: "idempotency-key-expired", title: "Idempotency-Key expired",
                  detail: "the response stored for this Idempotency-Key has expired; send the request with a new key",
                  headers: {})
    end

    def conflict
      Problem.new(status: 409, type: "transaction-conflict", title: "Conflict",
                  detail: "the request kept conflicting with concurrent requests; retry it",
                  headers: { "Retry-After" => "1" })
    end

    def internal(detail)
      Problem.new(status: 500, type: "internal-error", title: "Internal Server Error", detail: detail, headers: {})
    end
  end
end
