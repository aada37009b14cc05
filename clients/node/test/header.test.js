import { test } from 'node:test';
import assert from 'node:assert/strict';
import { KeyHeaderError, MAX_KEY_BYTES, parseIdempotencyKey } from '../src/index.js';

function slugOf(value) {
  try {
    parseIdempotencyKey(value);
  } catch (e) {
    assert.ok(e instanceof KeyHeaderError, `not a KeyHeaderError: ${e}`);
    return e.slug;
  }
  return null;
}

// a quoted Structured Field string; escapes \" and \\ in it; the bare form, the same key as the quoted one; leading
// and trailing spaces and tabs are not part of the value
test('valid keys', () => {
  const uuid = '8e03978e-40d5-43e8-bc93-6894a57f9324';
  for (const [value, key] of [['"abc"', 'abc'], ['"with space"', 'with space'], [`"${uuid}"`, uuid],
    ['"a\\"b"', 'a"b'], ['"a\\\\b"', 'a\\b'], ['"\\\\\\""', '\\"'],
    ['abc', 'abc'], [uuid, uuid], ['a:b/c*d', 'a:b/c*d'],
    ['  abc\t', 'abc'], [' "abc" ', 'abc'], ['" abc "', ' abc ']]) {
    assert.equal(parseIdempotencyKey(value), key, value);
  }
});

test('a missing header', () => {
  assert.equal(slugOf(undefined), 'idempotency-key-missing');
  assert.equal(slugOf(null), 'idempotency-key-missing');
  assert.equal(new KeyHeaderError('idempotency-key-missing', 'x').missing, true);
});

// empty; quoted and unparsable; bare with a quote, a space or non-ASCII; control characters; non-ASCII quoted (an
// sf-string is ASCII)
test('invalid keys', () => {
  for (const v of ['', '   ', '""', ' "" ',
    '"abc', '"abc\\"', '"a\\nb"', '"a\\', '"abc"def', '"abc";p=1', '"a", "b"', '"a"b"',
    'ab"c', 'a b', 'a, b', 'caf\u00e9', 'k\u20ac',
    'a\u0001b', '"a\u0001b"', 'a\u007fb', '"a\u007f"', '"a\u0085"', 'a\u009fb', '"a\tb"', '"\u0000"',
    '"caf\u00e9"']) {
    assert.equal(slugOf(v), 'idempotency-key-invalid', JSON.stringify(v));
  }
});

test('at most 255 bytes', () => {
  assert.equal(MAX_KEY_BYTES, 255);
  assert.equal(parseIdempotencyKey('a'.repeat(255)).length, 255);
  assert.equal(parseIdempotencyKey(`"${'a'.repeat(255)}"`).length, 255);
  assert.equal(slugOf('a'.repeat(256)), 'idempotency-key-invalid');
  assert.equal(slugOf(`"${'a'.repeat(256)}"`), 'idempotency-key-invalid');
  // the limit is on the unescaped key: 255 escaped quotes are 510 characters of header but 255 bytes of key
  assert.equal(parseIdempotencyKey(`"${'\\"'.repeat(255)}"`), '"'.repeat(255));
});

test('a header given more than once', () => {
  assert.equal(parseIdempotencyKey(['abc']), 'abc');
  assert.equal(slugOf(['a', 'b']), 'idempotency-key-invalid');
  assert.equal(slugOf([]), 'idempotency-key-invalid');
});

test('several keys in one field (a "," outside a quoted key, as HTTP joins two lines) are refused', () => {
  for (const v of ['k1,k2', 'k1, k2', '"k1", "k2"', '"k1",k2', 'k1,', ',k1']) {
    assert.throws(() => parseIdempotencyKey(v), (e) => e.slug === 'idempotency-key-invalid' && /several/.test(e.message), v);
  }
  assert.equal(parseIdempotencyKey('"a,b"'), 'a,b');
  assert.equal(parseIdempotencyKey('" a , b "'), ' a , b ');
});

test('a Buffer value is read as Latin-1 (HTTP field bytes)', () => {
  assert.equal(parseIdempotencyKey(Buffer.from('"abc"')), 'abc');
  assert.equal(slugOf(Buffer.from([0x61, 0xe9])), 'idempotency-key-invalid');
});
