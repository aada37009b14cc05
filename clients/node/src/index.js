// The package's public API, as index.d.ts describes it.
export { idempotency, transactional, readRawBody } from './express.js';
export { koaIdempotency } from './koa.js';
export { fastifyIdempotency } from './fastify.js';
export {
  CLAIM_REQUEST_SQL, CLAIM_SQL, COMPLETE_REQUEST_SQL, COMPLETE_SQL, DEFAULT_BODY_LIMIT, RETRYABLE, admit, errorStatus, isRetryable, readBody,
} from './engine.js';
export { parseIdempotencyKey, KeyHeaderError, MAX_KEY_BYTES } from './header.js';
export { CapturedResponse, HttpProblem, PROBLEM_BASE, jsonResponse, problem } from './responses.js';
export { sendResponse } from './capture.js';
export { runLease, LeaseLostError, LEASE_LOST } from './lease.js';
