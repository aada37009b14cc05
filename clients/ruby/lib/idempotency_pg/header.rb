# frozen_string_literal: true

module IdempotencyPg
  # Parsing of the Idempotency-Key request header (clients/CONTRACT.md): the IETF draft's Structured Field String
  # ("abc", with \" and \\ the only escapes) or the bare token form (abc), which mean the same key. A "," outside a
  # quoted key means several keys (HTTP joins repeated lines with ","; Puma and Rack do): refused.
  class KeyHeaderError < StandardError
    attr_reader :slug

    def initialize(slug, message)
      super(message)
      @slug = slug
    end

    def missing?
      slug == "idempotency-key-missing"
    end
  end

  module Header
    MAX_KEY_BYTES = 255
    SEVERAL = 'the request has several Idempotency-Key values (a "," outside a quoted key, or the header given ' \
              "more than once); send one key"

    module_function

    def invalid(message)
      KeyHeaderError.new("idempotency-key-invalid", message)
    end

    def control?(code)
      code < 0x20 || code == 0x7f || (code >= 0x80 && code <= 0x9f)
    end

    # The key of the raw field value (nil when the header is absent). Raises KeyHeaderError.
    def parse(value)
      raise KeyHeaderError.new("idempotency-key-missing", "the Idempotency-Key header is required") if value.nil?

      value = value.b.sub(/\A[ \t]+/, "").sub(/[ \t]+\z/, "")
      raise invalid("the Idempotency-Key header is empty") if value.empty?

      key = value.start_with?('"') ? sf_string(value) : bare(value)
      raise invalid("the Idempotency-Key header is empty") if key.empty?
      raise invalid("the Idempotency-Key is over #{MAX_KEY_BYTES} bytes") if key.bytesize > MAX_KEY_BYTES

      key.force_encoding(Encoding::UTF_8)
    end

    def sf_string(value)
      out = +""
      i = 1
      n = value.bytesize
      while i < n
        c = value.getbyte(i)
        if c == 0x5c # backslash
          raise invalid("the Idempotency-Key ends inside an escape") if i + 1 >= n

          nxt = value.getbyte(i + 1)
          raise invalid("the Idempotency-Key has an invalid escape") unless [0x22, 0x5c].include?(nxt)

          out << nxt
          i += 2
        elsif c == 0x22
          if i + 1 != n
            raise invalid(SEVERAL) if value.byteslice(i + 1, n) =~ /\A[ \t]*,/

            raise invalid("the Idempotency-Key has characters after its closing quote")
          end
          return out
        elsif control?(c)
          raise invalid("the Idempotency-Key contains a control character")
        elsif c > 0x7e
          raise invalid("the Idempotency-Key contains a character outside printable ASCII")
        else
          out << c
          i += 1
        end
      end
      raise invalid("the Idempotency-Key has no closing quote")
    end

    def bare(value)
      raise invalid(SEVERAL) if value.include?(",")

      value.each_byte do |c|
        raise invalid("the Idempotency-Key contains a control character") if control?(c)
        raise invalid("the Idempotency-Key has a quote inside a bare key") if c == 0x22
        raise invalid("a bare Idempotency-Key must be visible ASCII (quote a key with spaces)") if c < 0x21 || c > 0x7e
      end
      value.dup
    end
  end
end
