# frozen_string_literal: true

require "json"
require "securerandom"

module IdempotencyPg
  # The 1.3 statements (CONTRACT.md "Statements of 1.3"), named prepared statements on each connection, or the same
  # text unnamed behind a pooler that cannot keep them. The claim's value is read in binary (record_send), so no
  # session setting (bytea_output, DateStyle, ...) changes what is read.
  class Statements
    CLAIM_SQL = "SELECT idem_claim_request($1, $2, $3, $4, $5, $6, $7, $8)"
    COMPLETE_SQL = "SELECT idem_complete_request($1, $2, $3, $4, $5, $6)"
    # A named statement that the pooler's server connection does not hold (26000), or holds already (42P05).
    NOT_PREPARED = %w[26000 42P05].freeze

    Claim = Struct.new(:outcome, :http_status, :content_type, :headers, :body)

    # prepared: true (always named), false (never), :auto (named until a claim meets 26000/42P05, then unnamed for
    # good: PgBouncer before 1.21 in transaction pooling).
    def initialize(prepared = :auto)
      raise ArgumentError, "prepared must be true, false or :auto" unless [true, false, :auto].include?(prepared)

      @prepared = prepared
      @named = prepared != false
      @lock = Mutex.new
    end

    def named?
      @named
    end

    # Learn from an error of a named claim: true when the attempt is worth running again unnamed.
    def learn(err)
      return false unless @prepared == :auto && NOT_PREPARED.include?(IdempotencyPg.sqlstate(err))

      @named = false
      true
    end

    # The claim, in the transaction the caller opened; with begin_sql (its BEGIN), that BEGIN and the claim (and
    # the claim's Parse, the first time on the connection) in one round trip (CONTRACT.md "Round trips"). Raises
    # PG::Error.
    def claim(conn, key, scope, method, path, query, content_type, body, ttl = nil, begin_sql: nil)
      params = [key, scope, method, path, query, content_type, { value: body, format: 1 }, ttl]
      decode_claim(run(conn, :claim, CLAIM_SQL, params, 1, before: begin_sql).getvalue(0, 0))
    end

    # The completion; true when stored (false for a 5xx). With commit: true, COMMIT goes with it in one round trip
    # and the transaction has ended when this returns (raises when COMMIT answered ROLLBACK: an earlier error had
    # aborted it).
    def complete(conn, key, scope, status, content_type, headers, body, commit: false)
      params = [key, scope, status, content_type, headers && JSON.generate(headers),
                body.nil? ? nil : { value: body, format: 1 }]
      run(conn, :complete, COMPLETE_SQL, params, 0, after: commit ? "COMMIT" : nil).getvalue(0, 0) == "t"
    end

    # The value of idem_request_claim in PostgreSQL's binary composite layout: int32 field count, then per field
    # uint32 type OID, int32 length (-1 = NULL) and the value (text: bytes; int4: big-endian; jsonb: version 1 then
    # the text; bytea: the bytes).
    def self.decode_claim(bin)
      bin = bin.b
      count = bin.unpack1("N")
      pos = 4
      fields = Array.new(count) do
        _oid, len = bin.unpack("Nl>", offset: pos)
        pos += 8
        if len.negative?
          nil
        else
          v = bin.byteslice(pos, len)
          pos += len
          v
        end
      end
      outcome, status, ctype, headers, body = fields
      headers = headers && JSON.parse(headers.byteslice(1..).force_encoding(Encoding::UTF_8))
      Claim.new(outcome&.force_encoding(Encoding::UTF_8), status&.unpack1("l>"),
                ctype&.force_encoding(Encoding::UTF_8), headers, body)
    end

    private

    def decode_claim(bin)
      self.class.decode_claim(bin)
    end

    def run(conn, which, sql, params, format, before: nil, after: nil)
      return pipelined(conn, which, sql, params, format, before, after) if before || after
      return conn.exec_params(sql, params, format) unless @named

      names = prepared_names(conn)
      name = names[which] ||= begin
        n = "idem_#{which}_#{names[:id]}"
        conn.prepare(n, sql)
        n
      end
      conn.exec_prepared(name, params, format)
    end

    # `before` (BEGIN), the statement and `after` (COMMIT) in one round trip: libpq's pipeline mode, each as an
    # extended-protocol exchange, one Sync at the end. Named, BEGIN and COMMIT are named statements too (each
    # Parse in front of its first Bind on the connection): an unnamed BEGIN or COMMIT is parsed and analysed on
    # every request, which cost the server 15k instructions per request more than the simple-query BEGIN and
    # COMMIT of one statement per round trip (bench/clients/RESULTS-ruby.md). The statement's result; the first
    # error among the results is raised (the ones after it are aborted and the transaction block, when BEGIN went
    # first, is left failed for the caller's ROLLBACK).
    def pipelined(conn, which, sql, params, format, before, after)
      steps = []
      steps << [before, [], 0, before] if before
      steps << [sql, params, format, which]
      steps << [after, [], 0, after] if after
      names = @named ? prepared_names(conn) : nil
      parsed = [] # [key, name] of the Parses sent, recorded once answered
      results = []
      conn.enter_pipeline_mode
      begin
        steps.each do |text, args, fmt, key|
          next conn.send_query_params(text, args, fmt) unless names

          name = names[key]
          unless name
            name = "idem_#{key.is_a?(Symbol) ? key : key.downcase.tr(' ', '_')}_#{names[:id]}"
            conn.send_prepare(name, text)
            parsed << [key, name]
          end
          conn.send_query_prepared(name, args, fmt)
        end
        conn.pipeline_sync
        # each statement's result (and each Parse's) is followed by nil; the Sync's result ends the round trip. Two
        # nils in a row before it: nothing more will come (the connection was lost), not a loop for ever.
        nils = 0
        while (r = conn.get_result).nil? || r.result_status != PG::PGRES_PIPELINE_SYNC
          if r
            nils = 0
            results << r
          elsif (nils += 1) > 1
            raise PG::ConnectionBad, "the connection was lost before the pipeline's end"
          end
        end
        conn.exit_pipeline_mode
      rescue StandardError
        # a connection that cannot leave pipeline mode is of no use to anyone: closed, the pool drops it
        conn.finish if !conn.finished? && conn.pipeline_status != PG::PQ_PIPELINE_OFF
        raise
      end
      # the results in order: per step, its Parse's (when sent) then its own. A name whose Parse succeeded is on
      # the server whatever came after it (a claim that failed on the body): it is not parsed again.
      answers = []
      i = 0
      steps.each do |_text, _args, _fmt, key|
        if (p = parsed.find { |k, _| k == key })
          names[key] = p[1] if results[i]&.result_status == PG::PGRES_COMMAND_OK
          i += 1
        end
        answers << results[i]
        i += 1
      end
      results.each { |r| r.check unless r.result_status == PG::PGRES_PIPELINE_ABORTED }
      if after && answers.last.cmd_status != after
        raise "the transaction was aborted by an earlier error" # COMMIT answered ROLLBACK
      end
      answers[before ? 1 : 0]
    end

    # The names parsed on this client connection (a connection is one server session, or one pooler client).
    def prepared_names(conn)
      @lock.synchronize do
        conn.instance_variable_get(:@idempotency_pg_names) ||
          conn.instance_variable_set(:@idempotency_pg_names, { id: SecureRandom.hex(6) })
      end
    end
  end

  def self.sqlstate(err)
    err.respond_to?(:result) && err.result ? err.result.error_field(PG::PG_DIAG_SQLSTATE) : nil
  end
end
