# frozen_string_literal: true

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "minitest/autorun"
require "rack"
require "rack/mock"
require "securerandom"
require "idempotency_pg"

module DbHelper
  URL = ENV["IDEM_TEST_DATABASE_URL"]

  def db
    skip "IDEM_TEST_DATABASE_URL is not set" unless URL
    @db ||= PG.connect(URL)
  end

  def pool
    @pool ||= IdempotencyPg::Pool.new(URL, size: 4)
  end

  def teardown
    @db&.close
    @pool&.close
    super
  end

  def new_key
    "k-#{SecureRandom.hex(8)}"
  end

  # The key's stored row (either table of keys): [http_status, headers text, body bytes] or nil.
  def stored(key, scope = "acct")
    sql = "SELECT http_status, response_headers::text AS h, response_bytes AS body FROM idempotency_keys WHERE scope = $1 AND key = $2 " \
          "UNION ALL SELECT http_status, response_headers::text, response_bytes FROM idempotency_keys_partitioned WHERE scope = $1 AND key = $2"
    row = db.exec_params(sql, [scope, key]).first
    row && [row["http_status"]&.to_i, row["h"], row["body"] && PG::Connection.unescape_bytea(row["body"])]
  end
end
