import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  answerHeaders, byteaFromText, parseRecord, requestClaimResponse,
  BODY_ENCODING_HEADER,
  CapturedResponse,
  HttpProblem,
  PROBLEM_BASE,
  claimResponse,
  isJsonType,
  parseJsonBody,
  problem,
  replayResponse,
  storedForm,
} from '../src/responses.js';

const json = (r) => JSON.parse(r.body.toString());
const EXPIRES_AT = 'Tue, 08 Dec 2026 10:30:00 GMT';

test('claimed: null (run the handler); an unknown outcome is an error', () => {
  assert.equal(claimResponse({ outcome: 'claimed', http_status: null, response_body: null, response_headers: null }), null);
  assert.throws(() => claimResponse({ outcome: 'weird' }), /unknown idem_claim outcome/);
});

test('replay: the stored status, headers and body (none stored: none), plus Idempotent-Replayed: true', () => {
  for (const [body, headers, status, expected] of [
    ['{"payment_id": 7}', '{"Content-Type": "application/json", "Location": "/payments/7"}', 201,
      [['Content-Type', 'application/json'], ['Location', '/payments/7']]],
    [null, null, 204, []],
  ]) {
    const r = claimResponse({ outcome: 'replay', http_status: status, response_body: body, response_headers: headers });
    assert.equal(r.status, status);
    assert.deepEqual(r.headers, [...expected, ['Idempotent-Replayed', 'true']]);
    assert.equal(r.body.toString(), body ?? '');
  }
});

test('mismatch: 422 problem+json idempotency-key-reused (or the configured status); in_progress: 409 with Retry-After: 1', () => {
  for (const [outcome, status, type, retryAfter] of [['mismatch', 422, 'idempotency-key-reused', undefined],
    ['in_progress', 409, 'idempotency-key-in-progress', '1']]) {
    const r = claimResponse({ outcome, http_status: status });
    assert.equal(r.status, status);
    assert.equal(r.header('Content-Type'), 'application/problem+json');
    assert.equal(r.header('Retry-After'), retryAfter);
    assert.deepEqual(Object.keys(json(r)).sort(), ['detail', 'status', 'title', 'type']);
    assert.equal(json(r).type, PROBLEM_BASE + type);
    assert.equal(json(r).status, status);
  }
  assert.equal(claimResponse({ outcome: 'mismatch', http_status: 400 }).status, 400);
  assert.equal(claimResponse({ outcome: 'mismatch', http_status: null }).status, 422);
});

test('problem(): RFC 9457 body', () => {
  const r = problem(400, 'idempotency-key-missing', 'Idempotency-Key required', 'the header is required');
  assert.deepEqual(json(r), {
    type: 'https://idempotency.dev/problems/idempotency-key-missing',
    title: 'Idempotency-Key required',
    status: 400,
    detail: 'the header is required',
  });
  const p = new HttpProblem(401, 'unauthorized', 'Unauthorized', '', [['WWW-Authenticate', 'Bearer']]);
  assert.equal(p.response.status, 401);
  assert.equal(p.response.header('www-authenticate'), 'Bearer');
});

test('storedForm: a JSON body is stored as JSON, per-connection headers are dropped', () => {
  const resp = new CapturedResponse(
    201,
    [
      ['Content-Type', 'application/json; charset=utf-8'],
      ['Location', '/payments/1'],
      ['Content-Length', '13'],
      ['Date', 'now'],
      ['Set-Cookie', 's=1'],
      ['X-Powered-By', 'Express'],
      ['X-Trace', 'a'],
      ['x-trace', 'b'],
    ],
    Buffer.from('{"ok": true }'),
  );
  const s = storedForm(resp);
  assert.equal(s.body, '{"ok": true }');
  assert.deepEqual(JSON.parse(s.headers), {
    'Content-Type': 'application/json; charset=utf-8',
    Location: '/payments/1',
    'X-Trace': 'a, b',
  });
});

test('storedForm: an allow-list of headers', () => {
  const resp = new CapturedResponse(201, [['content-type', 'application/json'], ['Location', '/x'], ['X-Other', '1']],
    Buffer.from('{}'));
  assert.deepEqual(JSON.parse(storedForm(resp, ['Content-Type', 'location']).headers), {
    'content-type': 'application/json',
    Location: '/x',
  });
});

test('storedForm and replayResponse round trip text, binary, invalid JSON and empty bodies', () => {
  const cases = [
    new CapturedResponse(200, [['Content-Type', 'text/plain']], Buffer.from('héllo')),
    new CapturedResponse(200, [['Content-Type', 'application/octet-stream']], Buffer.from([0, 0xff, 0xfe, 1])),
    new CapturedResponse(200, [['Content-Type', 'application/json']], Buffer.from('{not json')),
    new CapturedResponse(200, [], Buffer.from('no type')),
    new CapturedResponse(204, [], Buffer.alloc(0)),
  ];
  for (const resp of cases) {
    const s = storedForm(resp);
    if (resp.body.length === 0) assert.equal(s.body, null);
    else JSON.parse(s.body); // always valid JSON for the jsonb column
    const back = replayResponse(resp.status, s.body, s.headers);
    assert.deepEqual(back.body, resp.body);
    assert.equal(back.header(BODY_ENCODING_HEADER), undefined);
    assert.equal(back.header('Content-Type'), resp.header('Content-Type'));
    assert.equal(back.header('Idempotent-Replayed'), 'true');
  }
  assert.equal(JSON.parse(storedForm(cases[1]).headers)[BODY_ENCODING_HEADER], 'base64');
  assert.equal(JSON.parse(storedForm(cases[0]).headers)[BODY_ENCODING_HEADER], 'text');
});

test('replayResponse accepts jsonb columns already parsed by node-postgres', () => {
  const r = replayResponse(201, { a: 1 }, { 'Content-Type': 'application/json' });
  assert.deepEqual(json(r), { a: 1 });
  assert.equal(r.header('content-type'), 'application/json');
});

test('isJsonType', () => {
  assert.ok(isJsonType('application/json'));
  assert.ok(isJsonType('Application/JSON; charset=utf-8'));
  assert.ok(isJsonType('application/problem+json'));
  assert.ok(!isJsonType('text/plain'));
  assert.ok(!isJsonType(undefined));
});

test('parseJsonBody', () => {
  assert.deepEqual(parseJsonBody(Buffer.from('{"a": 1}')), { text: '{"a": 1}', value: { a: 1 } });
  assert.throws(() => parseJsonBody(Buffer.from('{a')));
  assert.throws(() => parseJsonBody(Buffer.alloc(0)));
  assert.throws(() => parseJsonBody(Buffer.from([0x22, 0xff, 0x22])), /UTF-8/);
});

test('parseRecord and requestClaimResponse: the 1.3 claim value in its text form', () => {
  assert.deepEqual(parseRecord('(claimed,,,,)'), ['claimed', null, null, null, null]);
  assert.deepEqual(parseRecord('(a,"",")(, ""q"" \\\\",x)'), ['a', '', ')(, "q" \\', 'x']);
  const r = requestClaimResponse(parseRecord(
    '(replay,201,"text/html; charset=utf-8","{""X-A"": ""1,2""}","\\\\x3c703e")'));
  assert.equal(r.status, 201);
  assert.deepEqual(r.headers, [['Content-Type', 'text/html; charset=utf-8'], ['X-A', '1,2'], ['Idempotent-Replayed', 'true']]);
  assert.deepEqual(r.body, Buffer.from('<p>'));
  assert.equal(requestClaimResponse(['in_progress', '409', null, null, null]).status, 409);
  assert.equal(requestClaimResponse(['claimed', null, null, null, null]), null);
  // a key stored by 1.0-1.2 as text under the encoding header is decoded as replayResponse does
  const old = requestClaimResponse(['replay', '200', null, '{"Idempotency-Body-Encoding": "text", "Content-Type": "text/plain"}',
    `\\x${Buffer.from('"hi"').toString('hex')}`]);
  assert.equal(old.body.toString(), 'hi');
});

test('the claim value under bytea_output = escape (a setting any role may choose): the same bytes as under hex', () => {
  // record_out's text of one value, as PostgreSQL 15 writes it with SET bytea_output = escape
  const r = requestClaimResponse(parseRecord(
    '(replay,201,application/octet-stream,"{""X-A"": ""1""}","\\\\000!\\\\\\\\""\\\\177\\\\200\\\\377,(")'));
  assert.equal(r.status, 201);
  assert.deepEqual(r.headers, [['Content-Type', 'application/octet-stream'], ['X-A', '1'], ['Idempotent-Replayed', 'true']]);
  assert.equal(r.body.toString('hex'), '00215c227f80ff2c28');
  assert.deepEqual(requestClaimResponse(parseRecord('(replay,200,,,abc)')).body, Buffer.from('abc'));
  // every byte, in both forms (escape: 0x20..0x7e as themselves, a backslash doubled, any other byte \ooo)
  const all = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
  const escape = [...all].map((b) => (b === 0x5c ? '\\\\' : b >= 0x20 && b <= 0x7e ? String.fromCharCode(b)
    : `\\${b.toString(8).padStart(3, '0')}`)).join('');
  assert.deepEqual(byteaFromText(escape), all);
  assert.deepEqual(byteaFromText(`\\x${all.toString('hex')}`), all);
  assert.deepEqual(byteaFromText(''), Buffer.alloc(0));
  assert.deepEqual(byteaFromText('\\x'), Buffer.alloc(0));
  for (const bad of ['\\x4', '\\xzz', '\\9', '\\40', 'caf\u00e9', '\n']) assert.throws(() => byteaFromText(bad), /malformed bytea/, bad);
});

test('toStore: redact drops the members present (RFC 6901 ~0 ~1), keeps a body that is no JSON object; storeBody false', async () => {
  const { toStore, storeOptions } = await import('../src/responses.js');
  const body = { 'a/b': 1, 'm~n': 2, card: { number: '4', last4: '4' }, list: [1] };
  const r = new CapturedResponse(201, [['Content-Type', 'application/json']], Buffer.from(JSON.stringify(body)));
  const s = toStore(r, storeOptions({ redact: ['/a~1b', '/m~0n', '/card/number', '/list/0', '/nope/x'] }));
  assert.deepEqual(JSON.parse(s.body), { card: { last4: '4' }, list: [1] });
  assert.equal(s.header('Idempotent-Replay-Redacted'), '/a~1b, /m~0n, /card/number');
  assert.deepEqual(JSON.parse(r.body), body); // the first answer is untouched
  const array = new CapturedResponse(200, [['Content-Type', 'application/json']], Buffer.from('[{"a":1}]'));
  assert.equal(toStore(array, storeOptions({ redact: ['/0/a'] })), array);
  const html = new CapturedResponse(200, [['Content-Type', 'text/html']], Buffer.from('{"a":1}'));
  assert.equal(toStore(html, storeOptions({ redact: ['/a'] })), html);
  const none = toStore(r, storeOptions({ storeBody: false }));
  assert.deepEqual([none.body, none.header('Content-Type'), none.header('Idempotent-Replay-Body')], [null, undefined, 'omitted']);
  assert.throws(() => storeOptions({ redact: ['card'] }), /JSON Pointers/);
  assert.throws(() => storeOptions({ storeBody: 'no' }), /storeBody/);
});

test('renderAnswer: only the middleware\'s own problems; a value body is JSON', async () => {
  const { renderAnswer } = await import('../src/responses.js');
  const hook = (p) => ({ headers: { ...p.headers, 'X-Seen': p.type }, body: { message: p.detail } });
  const inProgress = requestClaimResponse(['in_progress', '409', null, JSON.stringify({ 'Idempotency-Key-Expires': EXPIRES_AT }), null]);
  const out = renderAnswer(inProgress, hook);
  assert.equal(out.status, 409);
  assert.deepEqual(Object.fromEntries(out.headers), {
    'Content-Type': 'application/json', 'Retry-After': '1', 'Idempotency-Key-Expires': EXPIRES_AT,
    'X-Seen': 'idempotency-key-in-progress',
  });
  const own = problem(401, 'unauthorized', 'Unauthorized');
  assert.equal(renderAnswer(own, hook), own);
  assert.equal(renderAnswer(inProgress, null), inProgress);
});

test('requestClaimResponse: expired -> 410 idempotency-key-expired; key-lifetime from the claim\'s headers', () => {
  const gone = requestClaimResponse(['expired', '410', null, null, null]);
  assert.equal(gone.status, 410);
  assert.equal(json(gone).type, `${PROBLEM_BASE}idempotency-key-expired`);
  assert.equal(gone.header('Idempotency-Key-Expires'), undefined);
  const replay13 = requestClaimResponse(parseRecord('(replay,201,application/json,"{}","\\\\x7b7d")'));
  assert.equal(replay13.header('Idempotency-Key-Expires'), undefined);
  const replay14 = requestClaimResponse(parseRecord(
    `(replay,201,application/json,"{""Location"": ""/p/1"", ""Idempotency-Key-Expires"": ""${EXPIRES_AT}""}","\\\\x7b7d")`));
  assert.equal(replay14.header('Idempotency-Key-Expires'), EXPIRES_AT);
  assert.equal(replay14.header('Location'), '/p/1');
  assert.equal(replay14.body.toString(), '{}');
  const mismatch = requestClaimResponse(parseRecord(`(mismatch,422,,"{""Idempotency-Key-Expires"": ""${EXPIRES_AT}""}",)`));
  assert.equal(mismatch.header('Idempotency-Key-Expires'), EXPIRES_AT);
  assert.equal(mismatch.problem.headers['Idempotency-Key-Expires'], EXPIRES_AT);
  // in progress without a known expiry (a claim in another transaction's flight): Retry-After alone
  assert.deepEqual(requestClaimResponse(['in_progress', '409', null, null, null]).problem.headers, { 'Retry-After': '1' });
  // claimed: no answer; its headers for the first answer, string values only, none that could split the block
  assert.equal(requestClaimResponse(['claimed', null, null, '{"Idempotency-Key-Expires": "x"}', null]), null);
  assert.deepEqual(answerHeaders('claimed', JSON.stringify({ 'Idempotency-Key-Expires': EXPIRES_AT, 'X-Bad': 'a\r\nb', n: 1 })),
    [['Idempotency-Key-Expires', EXPIRES_AT]]);
  assert.deepEqual(answerHeaders('claimed', null), []);
});
