# frozen_string_literal: true

module IdempotencyPg
  VERSION = "0.1.0"
end
