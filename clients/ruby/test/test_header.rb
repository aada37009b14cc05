# frozen_string_literal: true

require_relative "helper"

class TestHeader < Minitest::Test
  P = IdempotencyPg::Header

  def slug(value)
    P.parse(value)
    flunk "#{value.inspect} was accepted"
  rescue IdempotencyPg::KeyHeaderError => e
    e.slug
  end

  def test_quoted_and_bare_are_one_key
    assert_equal "abc", P.parse('"abc"')
    assert_equal "abc", P.parse("abc")
    assert_equal "abc", P.parse(" \tabc \t")
    assert_equal 'a"b\\c', P.parse('"a\\"b\\\\c"')
    assert_equal "a,b", P.parse('"a,b"')
    assert_equal "with space", P.parse('"with space"')
  end

  def test_missing_and_invalid
    assert_equal "idempotency-key-missing", slug(nil)
    ["", '""', "   ", '"abc', '"a\\nb"', '"abc"x', "a\"b", "a\x01b", "caf\xC3\xA9", "x" * 256, "with space"].each do |v|
      assert_equal "idempotency-key-invalid", slug(v), v.inspect
    end
    assert_equal "x" * 255, P.parse("x" * 255)
  end

  def test_several_keys
    ["k1,k2", "k1, k2", '"k1", "k2"', '"k1" ,k2'].each do |v|
      err = assert_raises(IdempotencyPg::KeyHeaderError) { P.parse(v) }
      assert_match(/several/, err.message, v)
    end
  end
end
