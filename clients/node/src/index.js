export { idempotency, transactional, isRetryable, readRawBody, errorStatus, CLAIM_SQL, COMPLETE_SQL, RETRYABLE } from './middleware.js';
export { parseIdempotencyKey, KeyHeaderError, MAX_KEY_BYTES } from './header.js';
export {
  BODY_ENCODING_HEADER,
  CapturedResponse,
  HttpProblem,
  NOT_REPLAYED,
  PROBLEM_BASE,
  claimResponse,
  isJsonType,
  jsonResponse,
  parseJsonBody,
  problem,
  replayResponse,
  storedForm,
} from './responses.js';
export { interceptResponse, sendResponse } from './capture.js';
export { koaIdempotency } from './koa.js';
export { fastifyIdempotency } from './fastify.js';
export { sqlLiteral } from './engine.js';
export { runLease, LeaseLostError, LEASE_LOST } from './lease.js';
