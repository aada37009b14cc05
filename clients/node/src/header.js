// Parsing of the Idempotency-Key request header (clients/CONTRACT.md).
//
// The IETF draft (draft-ietf-httpapi-idempotency-key-header) makes the field a Structured Field Item whose value is
// a String (RFC 8941 section 3.3.3): "abc", with \" and \\ the only escapes. Many clients send the key bare (abc, a
// UUID), so the bare form is accepted too and means the same key: "abc" and abc are one key.
//
// - header absent -> KeyHeaderError with slug 'idempotency-key-missing';
// - empty ("" or an empty value), not parsable, over 255 bytes, or with control characters -> slug
//   'idempotency-key-invalid';
// - several keys (a "," outside a quoted key: `k1,k2`, `"k1", "k2"`, or two header lines, which Node joins with
//   ", ") -> 'idempotency-key-invalid' too; a "," inside a quoted key ("a,b") is part of that one key.
//
// Leading and trailing spaces and tabs (HTTP's OWS) are not part of the value. Anything after the closing quote of
// a quoted key is refused (the draft uses no parameters). A bare key is visible ASCII (%x21-7E) without '"'; a
// quoted key holds printable ASCII (%x20-7E) in which '"' and '\' must be escaped.

export const MAX_KEY_BYTES = 255;

export class KeyHeaderError extends Error {
  constructor(slug, message) {
    super(message);
    this.name = 'KeyHeaderError';
    this.slug = slug;
  }

  get missing() {
    return this.slug === 'idempotency-key-missing';
  }
}

function invalid(message) {
  return new KeyHeaderError('idempotency-key-invalid', message);
}

function severalKeys() {
  // HTTP joins the lines of a repeated field with ",": a "," outside a quoted key means several keys.
  return invalid('the request has several Idempotency-Key values (a "," outside a quoted key, or the header given more than once); send one key');
}

function isControl(code) {
  return code < 0x20 || code === 0x7f || (code >= 0x80 && code <= 0x9f);
}

function show(ch) {
  const c = ch.charCodeAt(0);
  return c >= 0x20 && c <= 0x7e ? ch : '\\x' + c.toString(16).padStart(2, '0');
}

function parseSfString(value) {
  let out = '';
  const n = value.length;
  for (let i = 1; i < n; ) {
    const ch = value[i];
    const code = value.charCodeAt(i);
    if (ch === '\\') {
      if (i + 1 >= n) throw invalid('the Idempotency-Key ends inside an escape');
      const next = value[i + 1];
      if (next !== '"' && next !== '\\') throw invalid(`the Idempotency-Key has an invalid escape \\${show(next)}`);
      out += next;
      i += 2;
    } else if (ch === '"') {
      if (i + 1 !== n) {
        if (/^[ \t]*,/.test(value.slice(i + 1))) throw severalKeys();
        throw invalid('the Idempotency-Key has characters after its closing quote');
      }
      return out;
    } else if (isControl(code)) {
      throw invalid('the Idempotency-Key contains a control character');
    } else if (code < 0x20 || code > 0x7e) {
      throw invalid('the Idempotency-Key contains a character outside printable ASCII');
    } else {
      out += ch;
      i += 1;
    }
  }
  throw invalid('the Idempotency-Key has no closing quote');
}

function parseBare(value) {
  if (value.includes(',')) throw severalKeys();
  for (let i = 0; i < value.length; i++) {
    const code = value.charCodeAt(i);
    if (isControl(code)) throw invalid('the Idempotency-Key contains a control character');
    if (code === 0x22) throw invalid('the Idempotency-Key has a quote inside a bare key');
    if (code < 0x21 || code > 0x7e) {
      throw invalid('a bare Idempotency-Key must be visible ASCII (quote a key with spaces)');
    }
  }
  return value;
}

/**
 * The key from the raw field value (a string, an array of the field's lines as Node gives repeated headers, or
 * undefined when the header is absent). Throws KeyHeaderError.
 */
export function parseIdempotencyKey(value) {
  if (value === undefined || value === null) {
    throw new KeyHeaderError('idempotency-key-missing', 'the Idempotency-Key header is required');
  }
  if (Array.isArray(value)) {
    if (value.length !== 1) throw severalKeys();
    value = value[0];
  }
  if (Buffer.isBuffer(value)) value = value.toString('latin1');
  value = String(value).replace(/^[ \t]+|[ \t]+$/g, '');
  if (value === '') throw invalid('the Idempotency-Key header is empty');
  const key = value[0] === '"' ? parseSfString(value) : parseBare(value);
  if (key === '') throw invalid('the Idempotency-Key header is empty');
  if (Buffer.byteLength(key, 'utf8') > MAX_KEY_BYTES) {
    throw invalid(`the Idempotency-Key is over ${MAX_KEY_BYTES} bytes`);
  }
  return key;
}
