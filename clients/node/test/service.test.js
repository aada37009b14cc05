// The payment service's body validation decides as the Go service does (clients/go/payments/payments.go): the same
// body gets the same status and detail from every service.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { validatePayment } from '../service/app.js';

const AMOUNT = 'amount_cents must be an integer from 1 to 9007199254740991';
const CURRENCY = 'currency must be 3 upper-case letters';
const OBJECT = 'the body must be a JSON object {"amount_cents": <integer > 0>, "currency": "<ISO 4217>"}';

test('validatePayment: integers only, as written, up to 2^53 - 1; a JSON object; 3 upper-case letters', () => {
  const cases = [
    ['{"amount_cents": 100, "currency": "USD"}', 100],
    ['{"amount_cents":1e2,"currency":"USD"}', AMOUNT],
    ['{"amount_cents": 100.0, "currency": "USD"}', AMOUNT],
    ['{"amount_cents": 1E+2, "currency": "USD"}', AMOUNT],
    ['{"amount_cents": 0, "currency": "USD"}', AMOUNT],
    ['{"amount_cents": -0, "currency": "USD"}', AMOUNT],
    ['{"amount_cents": -5, "currency": "USD"}', AMOUNT],
    ['{"amount_cents": "100", "currency": "USD"}', AMOUNT],
    ['{"amount_cents": null, "currency": "USD"}', AMOUNT],
    ['{"currency": "USD"}', AMOUNT],
    ['{"amount_cents": 9007199254740991, "currency": "USD"}', 9007199254740991],
    ['{"amount_cents": 9007199254740992, "currency": "USD"}', AMOUNT],
    ['{"amount_cents": 9223372036854775808, "currency": "USD"}', AMOUNT],
    ['{"amount_cents": 100000000000000000000000000000000000000, "currency": "USD"}', AMOUNT],
    ['{"amount_cents": 1e2, "amount_cents": 7, "currency": "USD"}', 7], // the last member wins, as in Go and jsonb
    ['{"note": "1e2 \\"amount_cents\\": 5", "amount_cents": 3, "currency": "USD"}', 3],
    ['{"amount_cents": 100, "currency": "usd"}', CURRENCY],
    ['{"amount_cents": 100, "currency": "USDX"}', CURRENCY],
    ['{"amount_cents": 100, "currency": 840}', CURRENCY],
    ['{"amount_cents": 100}', CURRENCY],
    ['{"amount_cents": 100, "currency": "\\u0055SD"}', 100],
    ['null', AMOUNT], // Go decodes null into the struct: no members
    ['[]', OBJECT],
    ['"USD"', OBJECT],
    ['100', OBJECT],
    ['true', OBJECT],
  ];
  for (const [body, want] of cases) {
    const got = validatePayment(body);
    if (typeof want === 'number') assert.deepEqual(got, { amount: want, currency: 'USD' }, body);
    else assert.deepEqual(got, { error: want }, body);
  }
});
