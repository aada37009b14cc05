// HTTP answers: problem+json bodies, the idem_claim outcome -> HTTP mapping, and what is stored for a replay.
// Everything here is pure (no database, no Express), so it is unit tested on its own.

export const PROBLEM_BASE = 'https://idempotency.dev/problems/';

/** Internal header kept with a stored response whose body is not stored as JSON: "text" or "base64". */
export const BODY_ENCODING_HEADER = 'Idempotency-Body-Encoding';

/** Headers never stored for a replay: they describe one connection or one response, not the answer. */
export const NOT_REPLAYED = new Set(
  [
    'Connection', 'Keep-Alive', 'Transfer-Encoding', 'Content-Length', 'Date', 'Server', 'Set-Cookie', 'Upgrade',
    'TE', 'Trailer', 'Proxy-Authenticate', 'Proxy-Connection', 'X-Powered-By', 'Idempotent-Replayed',
    BODY_ENCODING_HEADER, 'Idempotency-Key-Expires',
  ].map((h) => h.toLowerCase()),
);

/**
 * A response as the middleware handles it: status, headers as [[name, value], ...] (original case, in order),
 * body as a Buffer.
 */
export class CapturedResponse {
  constructor(status, headers = [], body = Buffer.alloc(0)) {
    this.status = status;
    this.headers = headers;
    this.body = body;
  }

  /** The first value of header `name` (case-insensitive), or undefined. */
  header(name) {
    const lower = name.toLowerCase();
    const found = this.headers.find(([k]) => k.toLowerCase() === lower);
    return found ? found[1] : undefined;
  }
}

/** Thrown (e.g. by a scope function) to answer a problem at once, before any claim. */
export class HttpProblem extends Error {
  constructor(status, slug, title, detail = '', headers = [], base = PROBLEM_BASE) {
    super(detail || title);
    this.name = 'HttpProblem';
    this.status = status;
    this.response = problem(status, slug, title, detail, headers, base);
  }
}

/** An RFC 9457 application/problem+json response. */
export function problem(status, slug, title, detail = '', headers = [], base = PROBLEM_BASE) {
  const body = { type: base + slug, title, status, detail };
  const response = new CapturedResponse(
    status,
    [['Content-Type', 'application/problem+json'], ...headers],
    Buffer.from(JSON.stringify(body)),
  );
  // what renderProblem() is given (CONTRACT.md error-shape)
  response.problem = { status, type: slug, title, detail, headers: Object.fromEntries(headers) };
  return response;
}

/** The problem types of the answers the middleware writes itself: the ones renderProblem() shapes. */
export const MIDDLEWARE_PROBLEMS = new Set([
  'idempotency-key-missing', 'idempotency-key-invalid', 'idempotency-key-in-progress', 'idempotency-key-expired',
  'request-too-large', 'idempotency-key-reused', 'internal-error', 'transaction-conflict', 'request-body-unreadable',
  'request-body-not-json',
]);

/**
 * `answer` as `renderProblem(problem)` writes it when it is one of the middleware's own problems (CONTRACT.md
 * error-shape), else `answer`. The hook returns {status, headers, body}: status defaults to the problem's,
 * headers (an object or [[name, value]]) to the problem's, body is a Buffer, a string, or a value sent as JSON
 * (Content-Type: application/json unless the headers say otherwise).
 */
export function renderAnswer(answer, renderProblem) {
  if (!renderProblem || !answer || !answer.problem || !MIDDLEWARE_PROBLEMS.has(answer.problem.type)) return answer;
  const out = renderProblem({ ...answer.problem, headers: { ...answer.problem.headers } });
  if (out instanceof CapturedResponse) return out;
  if (!out || typeof out !== 'object') throw new TypeError('renderProblem must return {status, headers, body}');
  const headers = Array.isArray(out.headers) ? [...out.headers]
    : Object.entries(out.headers ?? answer.problem.headers).map(([k, v]) => [k, String(v)]);
  let { body } = out;
  if (!Buffer.isBuffer(body) && typeof body !== 'string' && body !== undefined && body !== null) {
    body = JSON.stringify(body);
    if (!headers.some(([k]) => k.toLowerCase() === 'content-type')) headers.unshift(['Content-Type', 'application/json']);
  }
  return new CapturedResponse(out.status ?? answer.status, headers,
    body === undefined || body === null ? Buffer.alloc(0) : Buffer.from(body));
}

/** A JSON Pointer (RFC 6901) as its reference tokens. */
function pointerTokens(pointer) {
  if (typeof pointer !== 'string' || !pointer.startsWith('/')) {
    throw new TypeError(`idempotency: redact takes JSON Pointers such as "/card/number", not ${JSON.stringify(pointer)}`);
  }
  return pointer.slice(1).split('/').map((t) => t.replace(/~1/g, '/').replace(/~0/g, '~'));
}

/** Checks the per-route store-less options {redact, storeBody}; returns them normalised. */
export function storeOptions({ redact = null, storeBody = true } = {}) {
  if (redact !== null && (!Array.isArray(redact) || redact.some((p) => typeof p !== 'string'))) {
    throw new TypeError('idempotency: redact must be an array of JSON Pointers');
  }
  if (redact) redact.forEach(pointerTokens);
  if (typeof storeBody !== 'boolean') throw new TypeError('idempotency: storeBody must be true or false');
  return { redact: redact && redact.length ? redact : null, storeBody };
}

/**
 * The response to store for `response` under the store-less options (CONTRACT.md store-less): with storeBody
 * false the status and headers only (no body, no Content-Type) and `Idempotent-Replay-Body: omitted`; with redact
 * a JSON object body without the members the pointers name (re-serialised) and `Idempotent-Replay-Redacted` with
 * the pointers dropped. Anything else is stored as it is.
 */
export function toStore(response, { redact = null, storeBody = true } = {}) {
  if (!storeBody) {
    const headers = response.headers.filter(([k]) => k.toLowerCase() !== 'content-type');
    const stored = new CapturedResponse(response.status, [...headers, ['Idempotent-Replay-Body', 'omitted']], null);
    return stored;
  }
  if (!redact || !isJsonType(response.header('Content-Type'))) return response;
  let value;
  try {
    value = JSON.parse(decodeUtf8(response.body) ?? '');
  } catch {
    return response;
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return response;
  const dropped = [];
  for (const pointer of redact) {
    const tokens = pointerTokens(pointer);
    let parent = value;
    for (const t of tokens.slice(0, -1)) parent = parent !== null && typeof parent === 'object' ? parent[t] : undefined;
    const last = tokens.at(-1);
    if (parent !== null && typeof parent === 'object' && !Array.isArray(parent) && Object.hasOwn(parent, last)) {
      delete parent[last];
      dropped.push(pointer);
    }
  }
  if (dropped.length === 0) return response;
  return new CapturedResponse(response.status, [...response.headers, ['Idempotent-Replay-Redacted', dropped.join(', ')]],
    Buffer.from(JSON.stringify(value), 'utf8'));
}

/** The headers of `answer` to set on a framework's response: all but the framing ones, which it sets itself. */
export function wireHeaders(answer) {
  return answer.headers.filter(([k]) => !/^(content-length|transfer-encoding)$/i.test(k));
}

/** The bytes of a framework's response body: a Buffer, a string, a stream (read to its end), or an object as JSON. */
export async function bytesOf(body) {
  if (body === null || body === undefined) return Buffer.alloc(0);
  if (Buffer.isBuffer(body)) return body;
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  if (typeof body.pipe === 'function') {
    const chunks = [];
    for await (const chunk of body) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
    return Buffer.concat(chunks);
  }
  return Buffer.from(JSON.stringify(body), 'utf8');
}

export function jsonResponse(status, obj, headers = []) {
  return new CapturedResponse(status, [['Content-Type', 'application/json'], ...headers], Buffer.from(JSON.stringify(obj)));
}

/**
 * Map one idem_claim row ({outcome, http_status, response_body, response_headers}, the jsonb columns as text) to
 * the answer, or null for 'claimed' (run the handler).
 */
export function claimResponse(row, base = PROBLEM_BASE) {
  const { outcome } = row;
  switch (outcome) {
    case 'claimed':
      return null;
    case 'replay':
      return replayResponse(row.http_status, row.response_body, row.response_headers);
    case 'mismatch':
      return problem(
        row.http_status || 422, 'idempotency-key-reused', 'Idempotency-Key reused',
        'this Idempotency-Key was already used with a different request', [], base,
      );
    case 'in_progress':
      return problem(
        409, 'idempotency-key-in-progress', 'Request in progress',
        'a request with this Idempotency-Key is still being processed; retry later', [['Retry-After', '1']], base,
      );
    case 'expired':
      // 1.4 with idempotency.tombstone_ttl: the stored response existed and is gone for good (CONTRACT.md expired)
      return problem(
        410, 'idempotency-key-expired', 'Idempotency-Key expired',
        'the response stored for this Idempotency-Key has expired; send the request with a new key', [], base,
      );
    default:
      throw new Error(`unknown idem_claim outcome ${JSON.stringify(outcome)}`);
  }
}

function asJson(value) {
  // node-postgres gives jsonb columns already parsed unless they are cast to text; accept both.
  return typeof value === 'string' ? JSON.parse(value) : value;
}

/** The stored response, decoded from what storedForm wrote, plus Idempotent-Replayed: true. */
export function replayResponse(httpStatus, bodyText, headersText) {
  const stored = headersText == null ? {} : asJson(headersText);
  let encoding = null;
  const headers = [];
  for (const [k, v] of Object.entries(stored)) {
    if (k.toLowerCase() === BODY_ENCODING_HEADER.toLowerCase()) encoding = v;
    else headers.push([k, String(v)]);
  }
  let body;
  if (bodyText == null) {
    body = Buffer.alloc(0);
  } else if (encoding === null) {
    // jsonb's canonical text of the stored JSON body
    body = Buffer.from(typeof bodyText === 'string' ? bodyText : JSON.stringify(bodyText), 'utf8');
  } else {
    const value = asJson(bodyText);
    body = encoding === 'base64' ? Buffer.from(value, 'base64') : Buffer.from(value, 'utf8');
  }
  headers.push(['Idempotent-Replayed', 'true']);
  return new CapturedResponse(httpStatus, headers, body);
}

/**
 * The fields of a record in PostgreSQL's text form, `(a,"b c",,"d""e")`: null for an empty unquoted field; inside
 * quotes `""` is `"` and a backslash escapes the next character.
 */
export function parseRecord(text) {
  const fields = [];
  let i = 1;
  while (i < text.length) {
    if (text[i] === '"') {
      let v = '';
      for (i++; i < text.length; i++) {
        if (text[i] === '\\') v += text[++i];
        else if (text[i] === '"' && text[i + 1] === '"') v += text[i++];
        else if (text[i] === '"') break;
        else v += text[i];
      }
      fields.push(v);
      i++;
    } else {
      const end = text.slice(i).search(/[,)]/) + i;
      fields.push(end === i ? null : text.slice(i, end));
      i = end;
    }
    i++; // the ',' or ')'
  }
  return fields;
}

const OCTAL = /^[0-3][0-7][0-7]$/;

/**
 * The bytes of bytea's text form, whichever form the session's bytea_output (a setting any role may choose: ALTER
 * DATABASE / ALTER ROLE ... SET) gave it: hex, `\x` then two hex digits a byte; or escape, where a byte from 0x20
 * to 0x7e is itself, `\\` a backslash and `\ooo` (three octal digits) any other byte. The two cannot be confused:
 * escape writes a backslash as `\\`, so its text never starts with `\x`. Throws on anything else.
 */
export function byteaFromText(text) {
  if (text.startsWith('\\x')) {
    const bytes = Buffer.from(text.slice(2), 'hex'); // stops at the first pair that is not hex
    if (bytes.length * 2 !== text.length - 2) throw new Error('malformed bytea text (hex)');
    return bytes;
  }
  const out = Buffer.allocUnsafe(text.length);
  let n = 0;
  for (let i = 0; i < text.length;) {
    const c = text.charCodeAt(i);
    if (c !== 0x5c) {
      if (c < 0x20 || c > 0x7e) throw new Error('malformed bytea text (escape)');
      out[n++] = c;
      i++;
    } else if (text.charCodeAt(i + 1) === 0x5c) {
      out[n++] = 0x5c;
      i += 2;
    } else {
      const octal = text.slice(i + 1, i + 4);
      if (!OCTAL.test(octal)) throw new Error('malformed bytea text (escape)');
      out[n++] = parseInt(octal, 8);
      i += 4;
    }
  }
  return out.subarray(0, n);
}

/**
 * The answer to an idem_claim_request value (1.3: outcome, http_status, content_type, headers, body as bytea text
 * in either bytea_output form, or a Buffer), or null for 'claimed'. A replay is the stored bytes with the stored
 * Content-Type and headers; a key stored by 1.0-1.2 (no content type) is decoded as replayResponse does.
 */
export function requestClaimResponse([outcome, status, contentType, headersText, bytes], base = PROBLEM_BASE) {
  const answer = claimAnswer(outcome, status, contentType, headersText, bytes, base);
  // CONTRACT.md key-lifetime (1.4): a 422 or 409 carries the claim's headers (the key's expiry), through the
  // error-shape hook's headers too; a replay's come with its stored ones
  if (answer && (outcome === 'mismatch' || outcome === 'in_progress')) {
    for (const [k, v] of answerHeaders(outcome, headersText)) {
      answer.headers.push([k, v]);
      if (answer.problem) answer.problem.headers[k] = v;
    }
  }
  return answer;
}

/**
 * The headers a claim's answer carries besides a replay's stored ones (1.4, CONTRACT.md key-lifetime): on
 * 'claimed', 'mismatch' and 'in_progress', the members of the claim's headers object (Idempotency-Key-Expires: the
 * key's expiry, written by the server), as [[name, value]]; string values only, none that could split a header
 * block; [] on a 1.3 server or when the server knows none. A claimed key's go on its first answer once stored,
 * never into the completion.
 */
export function answerHeaders(outcome, headersText) {
  if (outcome === 'replay' || headersText == null) return [];
  let obj;
  try {
    obj = asJson(headersText);
  } catch {
    return [];
  }
  if (!obj || typeof obj !== 'object' || Array.isArray(obj)) return [];
  return Object.entries(obj).filter(([, v]) => typeof v === 'string' && !/[\r\n\0]/.test(v));
}

function claimAnswer(outcome, status, contentType, headersText, bytes, base) {
  const httpStatus = status === null ? null : Number(status);
  if (outcome !== 'replay') return claimResponse({ outcome, http_status: httpStatus }, base);
  const body = Buffer.isBuffer(bytes) ? bytes : bytes == null ? Buffer.alloc(0) : byteaFromText(bytes);
  if (contentType === null && headersText !== null && new RegExp(`"${BODY_ENCODING_HEADER}"`, 'i').test(headersText)) {
    return replayResponse(httpStatus, body.toString('utf8'), headersText);
  }
  const headers = contentType === null ? [] : [['Content-Type', contentType]];
  for (const [k, v] of Object.entries(headersText === null ? {} : JSON.parse(headersText))) headers.push([k, String(v)]);
  headers.push(['Idempotent-Replayed', 'true']);
  return new CapturedResponse(httpStatus, headers, body);
}

/** What a store-less route adds to the stored headers: stored whatever the allow-list says. */
const STORE_LESS = new Set(['idempotent-replay-redacted', 'idempotent-replay-body']);

/** The headers of `response` to store for a replay: [[name, value]], repeated ones joined with ", ". */
function replayedHeaders(response, replayHeaders) {
  const allow = replayHeaders ? new Set(replayHeaders.map((h) => h.toLowerCase())) : null;
  const out = new Map();
  for (const [k, v] of response.headers) {
    const lk = k.toLowerCase();
    if (NOT_REPLAYED.has(lk) || (allow && !allow.has(lk) && !STORE_LESS.has(lk))) continue;
    const value = Array.isArray(v) ? v.join(', ') : String(v);
    out.set(lk, out.has(lk) ? [out.get(lk)[0], `${out.get(lk)[1]}, ${value}`] : [k, value]);
  }
  return [...out.values()];
}

/** What idem_complete_request (1.3) stores for `response`: {contentType, headers: JSON text of the others}. */
export function storedBytes(response, replayHeaders = null) {
  const headers = replayedHeaders(response, replayHeaders);
  const type = headers.find(([k]) => k.toLowerCase() === 'content-type');
  return {
    contentType: type ? type[1] : null,
    headers: JSON.stringify(Object.fromEntries(headers.filter((h) => h !== type))),
  };
}

export function isJsonType(contentType) {
  if (!contentType) return false;
  const media = String(contentType).split(';', 1)[0].trim().toLowerCase();
  return media === 'application/json' || media.endsWith('+json');
}

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function decodeUtf8(buf) {
  try {
    return utf8.decode(buf);
  } catch {
    return null;
  }
}

/**
 * What idem_complete stores for `response`: {body: JSON text or null, headers: JSON text, json: whether the body
 * is stored as the JSON value itself (a replay then sends jsonb's text of it)}.
 *
 * A JSON body (by its Content-Type) is stored as JSON; any other body as a JSON string, its encoding kept in an
 * internal header that the replay removes. `replayHeaders`, when given, is the allow-list of headers to store
 * (case-insensitive); otherwise every header but the per-connection ones in NOT_REPLAYED. Repeated headers are
 * joined with ", ".
 */
export function storedForm(response, replayHeaders = null) {
  const headers = Object.fromEntries(replayedHeaders(response, replayHeaders));
  const body = response.body;
  let bodyJson = null;
  if (body && body.length > 0) {
    const text = decodeUtf8(body);
    if (text !== null && isJsonType(response.header('Content-Type'))) {
      try {
        JSON.parse(text);
        bodyJson = text;
      } catch {
        bodyJson = null;
      }
    }
    if (bodyJson === null) {
      if (text !== null) {
        headers[BODY_ENCODING_HEADER] = 'text';
        bodyJson = JSON.stringify(text);
      } else {
        headers[BODY_ENCODING_HEADER] = 'base64';
        bodyJson = JSON.stringify(body.toString('base64'));
      }
    }
  }
  return { body: bodyJson, headers: JSON.stringify(headers), json: bodyJson !== null && !(BODY_ENCODING_HEADER in headers) };
}

function hasNul(v) {
  if (typeof v === 'string') return v.includes('\0');
  if (v === null || typeof v !== 'object') return false;
  return Object.entries(v).some(([k, x]) => k.includes('\0') || hasNul(x));
}

/** The request body as text and value if it is JSON that PostgreSQL's jsonb accepts (UTF-8, no \u0000), else throws. */
/**
 * The request body as 1.3's middleware handed it to the handler (`req.body`, Koa's `ctx.request.body`): the parsed
 * JSON value of a body whose Content-Type is absent or a JSON type, else undefined (a form, multipart, text or
 * binary body is left to the framework's own parsers, as is a body that does not parse).
 */
export function compatJsonBody(raw, contentType) {
  if (contentType && !isJsonType(contentType)) return undefined;
  try {
    return parseJsonBody(raw).value;
  } catch {
    return undefined;
  }
}

export function parseJsonBody(raw) {
  const text = decodeUtf8(raw);
  if (text === null) throw new SyntaxError('the request body is not UTF-8');
  const value = JSON.parse(text);
  if (text.includes('u0000') && hasNul(value)) throw new SyntaxError('the request body holds \\u0000');
  return { text, value };
}
