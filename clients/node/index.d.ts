// TypeScript declarations of idempotency-pg (the package is ESM JavaScript; these describe src/index.js).
// Framework types are kept structural so that the package needs neither express, koa nor fastify installed.

import type { IncomingMessage, ServerResponse } from 'node:http';

/** What the middleware needs of node-postgres: a pg.Pool (or anything with the same connect()). */
export interface PoolLike {
  connect(): Promise<PoolClientLike>;
}
export interface PoolClientLike {
  query(text: string, values?: unknown[]): Promise<any>;
  /** The claim and the completion go as a query config: named prepared statements. */
  query(config: { text: string; values?: unknown[]; name?: string }): Promise<any>;
  release(err?: Error | boolean): void;
  on(event: 'error', listener: (err: Error) => void): unknown;
  removeListener(event: 'error', listener: (err: Error) => void): unknown;
  /** Set by node-postgres 8.23+ on clients of a pool made with `pipeline: true`: BEGIN then goes with the claim. */
  pipeline?: boolean;
}

export type IsolationLevel = 'READ COMMITTED' | 'REPEATABLE READ' | 'SERIALIZABLE';

export interface Logger {
  error(...args: unknown[]): void;
  info?(...args: unknown[]): void;
}

/** Options shared by idempotency(), transactional(), koaIdempotency() and fastifyIdempotency. */
export interface IdempotencyOptions<Req = any> {
  /** The pool the claim, the handler's statements and the completion run on (one connection per request). */
  pool: PoolLike;
  /** The tenant the key belongs to, from the authenticated caller; may throw HttpProblem (e.g. a 401). */
  scope?: (req: Req) => string | null | undefined | Promise<string | null | undefined>;
  /** How long a completed key is kept (interval text such as '24 hours'); default the server's idempotency.ttl. */
  ttl?: string | null;
  /** Runs of the whole transaction again on SQLSTATE 40001/40P01 (default 3). */
  maxRetries?: number;
  /** Allow-list of response headers stored for a replay (default: all but per-connection ones). */
  replayHeaders?: string[] | null;
  isolationLevel?: IsolationLevel | Lowercase<IsolationLevel> | null;
  /**
   * The path in the request fingerprint (default: the request line's target up to its first '?', as sent: not
   * decoded, not normalised, before any mount prefix is stripped or URL rewritten). The query in the fingerprint is
   * always what follows that '?', as sent (none for a trailing '?').
   */
  requestPath?: (req: Req) => string;
  /** Request body limit in bytes (default 1 MiB = 1048576; over it: 413). Fastify: default the route's bodyLimit. */
  bodyLimit?: number;
  /** Methods protected by a middleware mounted with app.use() (default POST and PATCH). */
  methods?: string[];
  /**
   * Named prepared statements for the claim and the completion (names unique to each connection). 'auto'
   * (default): named, and unnamed for good after the first 26000/42P05 at a claim (a pooler that does not keep
   * them: PgBouncer before 1.21 in transaction pooling); true: always named; false: never named.
   */
  prepared?: boolean | 'auto';
  /** Base URI of the problem types (default https://idempotency.dev/problems/). */
  problemBase?: string;
  logger?: Logger;
  /**
   * Writes the answers the middleware writes itself (400 key missing/invalid, 409 in progress, 410 expired, 413,
   * 422 reused, 500) in the API's own shape (CONTRACT.md error-shape); default application/problem+json.
   */
  renderProblem?: RenderProblem | null;
  /** Store-less (StoreOptions) for every route of this middleware; per route: Express idem({redact}, handler),
   * Fastify config.idempotency = {redact}. */
  redact?: string[] | null;
  storeBody?: boolean;
}

/** One of the middleware's own answers, as renderProblem() is given it. */
export interface Problem {
  status: number;
  /** The problem type's last segment: 'idempotency-key-missing', 'idempotency-key-in-progress', ... */
  type: string;
  title: string;
  detail: string;
  /** The headers the middleware adds (Retry-After: 1 on 409, Idempotency-Key-Expires, Connection: close on 413). */
  headers: Record<string, string>;
}
/** The answer to write: body a Buffer, a string, or a value sent as JSON (Content-Type application/json). */
export type RenderProblem = (problem: Problem) => CapturedResponse | {
  status?: number;
  headers?: Record<string, string> | Array<[string, string]>;
  body?: Buffer | string | unknown;
};

/** Per route (CONTRACT.md store-less): what a replay needs, and no more, is stored. */
export interface StoreOptions {
  /** JSON Pointers (RFC 6901) of members dropped from a JSON object body before it is stored. */
  redact?: string[] | null;
  /** false: only the status and headers are stored (Idempotent-Replay-Body: omitted). Default true. */
  storeBody?: boolean;
}

/** What a protected handler gets (req.idempotency, ctx.idempotency, request.idempotency). */
export interface IdempotencyHandle {
  /** The transaction's connection: run the handler's statements on it. */
  client: PoolClientLike;
  /** The Idempotency-Key (null under transactional()). */
  key: string | null;
  scope: string;
  /** 0 on the first run, then 1, 2, ... when 40001/40P01 ran the transaction again. */
  attempt: number;
  /** Answer without executing (validation before any write): sent, rolled back, not stored, the key released. */
  notExecuted(): void;
}

/** A response as the middleware handles it. */
export class CapturedResponse {
  constructor(status: number, headers?: Array<[string, string | number | string[]]>, body?: Buffer);
  status: number;
  headers: Array<[string, string | number | string[]]>;
  body: Buffer;
  header(name: string): string | number | string[] | undefined;
}

/** Thrown (by a scope function or a handler) to answer an RFC 9457 problem. */
export class HttpProblem extends Error {
  constructor(status: number, slug: string, title: string, detail?: string, headers?: Array<[string, string]>,
    base?: string);
  status: number;
  response: CapturedResponse;
}

export class KeyHeaderError extends Error {
  slug: 'idempotency-key-missing' | 'idempotency-key-invalid';
  readonly missing: boolean;
}

type Next = (err?: unknown) => void;
/** An Express-style handler; the request carries `idempotency` and `db`. */
export type Handler<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse> =
  (req: Req & { idempotency: IdempotencyHandle; db: PoolClientLike; body: unknown; rawBody: Buffer }, res: Res,
    next: Next) => unknown;

export interface Idem {
  /** A route handler running `handlers` at most once per key, in one transaction with the claim. */
  (...handlers: Array<Handler<any, any> | Array<Handler<any, any>>>): (req: any, res: any, next: Next) => Promise<void>;
  /** The same with the route's store-less options first. */
  (store: StoreOptions, ...handlers: Array<Handler<any, any> | Array<Handler<any, any>>>):
    (req: any, res: any, next: Next) => Promise<void>;
  /** No handlers: a middleware for app.use() that protects the routes after it. */
  (): (req: any, res: any, next: Next) => Promise<void>;
}

export function idempotency<Req = any>(options: IdempotencyOptions<Req>): Idem;
export function transactional<Req = any>(options: IdempotencyOptions<Req>): Idem;

/** Koa middleware: `app.use(koaIdempotency({pool, scope}))` before the routes. */
export function koaIdempotency<Ctx = any>(options: IdempotencyOptions<Ctx> & {
  /** How a thrown 4xx error is answered (and stored); default as Koa's own error handler. */
  renderError?: (err: any, ctx: Ctx) => void;
}): (ctx: any, next: () => Promise<unknown>) => Promise<void>;

/** Fastify plugin: `fastify.register(fastifyIdempotency, {pool, scope})`, routes opt in with config.idempotency. */
export function fastifyIdempotency(instance: any, options: IdempotencyOptions, done: (err?: Error) => void): void;

/** The HTTP status an error carries (`status` or `statusCode` in 400..599), or null. */
export function errorStatus(err: unknown): number | null;
export function parseIdempotencyKey(value: string | string[] | Buffer | undefined | null): string;
export function isRetryable(err: unknown): boolean;
export function problem(status: number, slug: string, title: string, detail?: string,
  headers?: Array<[string, string]>, base?: string): CapturedResponse;
export function sendResponse(res: ServerResponse, answer: CapturedResponse): void;

/** 1 MiB: the default request body limit. */
export const DEFAULT_BODY_LIMIT: 1048576;
/**
 * The whole body of a node:http request or stream: rejects with HttpProblem 413 at once when `declared` (its
 * Content-Length) is over `limit`, or as soon as a chunked body passes it, and with HttpProblem 400
 * (request-body-unreadable) when the stream is aborted or ends shorter than `declared`.
 */
export function readBody(stream: NodeJS.ReadableStream, cfg: { bodyLimit: number; problemBase?: string },
  declared?: string | number | null, limit?: number): Promise<Buffer>;
/** The request body: a body parser's (req.rawBody, a Buffer or string req.body), else readBody(req). */
export function readRawBody(req: IncomingMessage, cfg: number | { bodyLimit: number; problemBase?: string }): Promise<Buffer>;
/** What an adapter (and lease mode) checks before the database. */
export interface AdmitInput<Req = any> {
  scopeArg: Req;
  /** The raw Idempotency-Key field value (a string, or an array of its lines). */
  keyHeader: string | string[] | undefined;
  method: string;
  /** The request target up to its first '?', as sent. */
  path: string;
  /** What follows the target's first '?', as sent; null, undefined or '' for none. */
  query?: string | null;
  body(): Promise<Buffer>;
  /** The request's Content-Type value (null: none): the claim fingerprints the bytes with it (1.3+). */
  contentType?: string | null;
  /** true: the body must be JSON (400 request-body-not-json otherwise); bodyText and bodyValue are set. */
  json?: boolean;
  /** false: no key is parsed (a transaction without a claim). */
  claim?: boolean;
}
export interface AdmittedRequest {
  scope: string;
  key: string | null;
  method: string;
  path: string;
  /** The raw query string, or null for none (an empty one included). */
  query: string | null;
  raw: Buffer;
  contentType: string | null;
  /** With `json: true` only. */
  bodyText?: string;
  bodyValue?: unknown;
}
/**
 * The scope (401 from scope()), the key (400), the whole body (413, 400), with `json` as JSON (400): resolves with the answer to
 * send at once (nothing claimed) or the admitted request.
 */
export function admit<Req = any>(cfg: { scope: (req: Req) => unknown; bodyLimit: number; problemBase?: string },
  input: AdmitInput<Req>): Promise<CapturedResponse | AdmittedRequest>;

export const MAX_KEY_BYTES: 255;
export const PROBLEM_BASE: string;
export const CLAIM_SQL: string;
export const COMPLETE_SQL: string;
/** The 1.3 statements (extension 1.3+; the 1.0 ones above are used on an older extension). */
export const CLAIM_REQUEST_SQL: string;
export const COMPLETE_REQUEST_SQL: string;
export const RETRYABLE: Set<string>;

// ---- Lease mode (extension 1.1+): runLease

/** What runLease needs of node-postgres: a pg.Pool (its own connections for the lease, heartbeat, each step). */
export interface LeasePoolLike extends PoolLike {
  query(text: string, values?: unknown[]): Promise<any>;
}

/** What each step and finish get. */
export interface LeaseContext<State extends Record<string, unknown> = Record<string, any>> {
  readonly key: string;
  readonly scope: string;
  /** The lease token (uuid text). */
  readonly token: string;
  /** The lease's fencing number (1.2; strictly increasing across takeovers of a key), null on a 1.1 database. */
  readonly fencingNumber: bigint | null;
  /** The key's expiry as idem_lease wrote it (Idempotency-Key-Expires, an IMF-fixdate; 1.4), else null (1.1-1.3). */
  readonly keyExpires: string | null;
  /** The last step recorded before the current one (null: none yet). */
  recoveryPoint: string | null;
  /** The recovery state: what earlier steps recorded (restored on a takeover); recorded with each checkpoint. */
  state: State;
  /** The step running now (null in finish). */
  readonly step: string | null;
  /** Aborted with a LeaseLostError when the heartbeat finds the lease taken over: pass it to fetch(). */
  readonly signal: AbortSignal;
  /**
   * Run fn in a transaction that first checks the lease is still this holder's and last records the current step
   * with `state` (idem_checkpoint): the step's local writes and its recovery point commit together. Rejects with
   * LeaseLostError when the lease was taken over.
   */
  transaction<T>(fn: (client: PoolClientLike, ctx: LeaseContext<State>) => Promise<T> | T): Promise<T>;
  /** Stop extending the lease until the current step ends (a stalled holder, in tests). */
  stopHeartbeat(): void;
}

export interface LeaseStep<State extends Record<string, unknown> = Record<string, any>> {
  /** The recovery point recorded once the step is done (non-empty, at most 255 bytes, unique in the run). */
  name: string;
  /** The outside call with no transaction open, then the local writes in ctx.transaction(). */
  run(ctx: LeaseContext<State>): Promise<unknown> | unknown;
}

interface LeaseOptionsBase<State extends Record<string, unknown>> {
  /** The tenant the key belongs to (default ''). */
  scope?: string;
  steps?: Array<LeaseStep<State>>;
  /** Builds the response in the completing transaction; stored as the bytes sent (1.3) unless a 5xx. */
  finish(client: PoolClientLike, ctx: LeaseContext<State>): Promise<CapturedResponse> | CapturedResponse;
  /** The lease's length in seconds (default 30). */
  leaseSeconds?: number;
  /** How often the heartbeat extends the lease (default a third of the lease). */
  heartbeatMs?: number;
  /** How long the completed key replays (interval text such as '24 hours'); default the server's idempotency.ttl. */
  ttl?: string | null;
  replayHeaders?: string[] | null;
  problemBase?: string;
  logger?: Logger;
  /** As the middleware's option: the lease's own answers (409, 410, 422) in the API's shape. */
  renderProblem?: RenderProblem | null;
  /** Store-less (CONTRACT.md): the completion's body without these members, or none at all. */
  redact?: string[] | null;
  storeBody?: boolean;
}

/**
 * The fingerprint: idem_hash of {method, path, body} in SQL (as the middleware computes it), or a SHA-256 of yours
 * (64 hex digits, as idem_hash returns).
 */
export type LeaseOptions<State extends Record<string, unknown> = Record<string, any>> = LeaseOptionsBase<State> & (
  | { method?: string; path: string; body: string | Buffer; requestHash?: undefined }
  | { requestHash: string; method?: undefined; path?: undefined; body?: undefined }
);

/**
 * Lease `key`, run the steps after its recovery point, then finish. Resolves with the response to send (replay,
 * 422 mismatch, 409 in progress or lease taken over, finish's response); rejects with a step's error after giving
 * the lease back (the retry resumes after the last recorded step).
 */
export function runLease<State extends Record<string, unknown> = Record<string, any>>(
  pool: LeasePoolLike, key: string, options: LeaseOptions<State>): Promise<CapturedResponse>;

/** The lease was taken over (SQLSTATE 55000): stop, write nothing more. */
export class LeaseLostError extends Error {
  readonly code: '55000';
  readonly key: string;
}
export const LEASE_LOST: '55000';

export function jsonResponse(status: number, body: unknown, headers?: Array<[string, string]>): CapturedResponse;
