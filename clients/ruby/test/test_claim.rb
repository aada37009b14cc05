# frozen_string_literal: true

require_relative "helper"

# The claim's value as read: binary (record_send), whatever the session's settings (CONTRACT.md session-settings).
class TestClaim < Minitest::Test
  include DbHelper

  def claim(conn, key, body, ctype = "application/json")
    IdempotencyPg::Statements.new(false).claim(conn, key, "acct", "POST", "/payments", nil, ctype, body)
  end

  def test_decode_of_a_hand_made_value
    field = ->(oid, v) { v.nil? ? [oid, -1].pack("Nl>") : [oid, v.bytesize].pack("Nl>") + v.b }
    bin = [5].pack("N") + field.(25, "replay") + field.(23, [201].pack("l>")) + field.(25, "text/plain") +
          field.(3802, "\x01{\"Location\": \"/p/1\"}") + field.(17, "\x00\\x\xff")
    c = IdempotencyPg::Statements.decode_claim(bin)
    assert_equal ["replay", 201, "text/plain", { "Location" => "/p/1" }, "\x00\\x\xff".b], c.to_a
    c = IdempotencyPg::Statements.decode_claim([5].pack("N") + field.(25, "claimed") + field.(23, nil) * 4)
    assert_equal ["claimed", nil, nil, nil, nil], c.to_a
  end

  def test_a_replay_reads_the_same_bytes_under_any_bytea_output_and_datestyle
    key = new_key
    body = (0..255).map(&:chr).join.b
    db.exec("BEGIN")
    assert_equal "claimed", claim(db, key, '{"a": 1}').outcome
    db.exec_params("SELECT idem_complete_request($1, 'acct', 201, 'application/octet-stream', $2, $3)",
                   [key, '{"Location": "/p/1"}', { value: body, format: 1 }])
    db.exec("COMMIT")
    [%w[hex ISO], %w[escape SQL,\ DMY]].each do |bytea, style|
      db.exec("SET bytea_output = #{bytea}; SET DateStyle = '#{style}'; SET TimeZone = 'Asia/Kolkata'")
      db.exec("BEGIN")
      c = claim(db, key, '{ "a" : 1 }')
      db.exec("ROLLBACK")
      assert_equal "replay", c.outcome
      assert_equal 201, c.http_status
      assert_equal "application/octet-stream", c.content_type
      assert_equal "/p/1", c.headers["Location"]
      assert_equal body, c.body, "bytea_output = #{bytea}"
    end
    db.exec("BEGIN")
    assert_equal "mismatch", claim(db, key, '{"a": 2}').outcome
    db.exec("ROLLBACK")
  end
end
