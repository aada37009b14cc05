#!/usr/bin/env node
// Start the payment service: PORT (listens on 127.0.0.1:$PORT), DATABASE_URL (libpq URI), PAYMENTS_FAULTS=1.

import pg from 'pg';
import { createApp } from './app.js';

const port = Number(process.env.PORT || 8080);
const host = process.env.HOST || '127.0.0.1';
const faults = process.env.PAYMENTS_FAULTS === '1';
const max = Number(process.env.PG_POOL_MAX || 10);
// node-postgres closes a connection idle for 10 s by default; the next burst of requests then waits for new
// connections (TCP, authentication), so a 409 that should come at once takes a connection set-up. Idle
// connections are kept (0 = never closed) unless PG_IDLE_TIMEOUT_MS says otherwise; PG_POOL_MIN keeps that many
// even then.
const idleTimeoutMillis = Number(process.env.PG_IDLE_TIMEOUT_MS || 0);
const min = Number(process.env.PG_POOL_MIN || 0);

if (!process.env.DATABASE_URL) {
  console.error('payments: DATABASE_URL is not set (e.g. postgresql://postgres@127.0.0.1:5432/payments)');
  process.exit(2);
}

// Pipelined clients (node-postgres 8.23+): BEGIN goes with the claim and the completion with COMMIT, one round trip
// each. PG_PIPELINE=0: a plain pool, each statement in a round trip of its own. PAYMENTS_BENCH=1
// (POST /payments-autocommit) is for bench/clients.
const pipeline = process.env.PG_PIPELINE !== '0';
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max, min, idleTimeoutMillis, pipeline });
pool.on('error', (err) => console.error('payments: idle database connection failed:', err.message));

// POST /rides' lease (lease mode): RIDES_LEASE_SECONDS, default 30 (the e2e suite uses 2 so takeovers are quick).
const ridesLeaseSeconds = Number(process.env.RIDES_LEASE_SECONDS || 30);
if (!(ridesLeaseSeconds > 0)) {
  console.error(`payments: RIDES_LEASE_SECONDS must be a number of seconds > 0, not ${process.env.RIDES_LEASE_SECONDS}`);
  process.exit(2);
}

// PG_PREPARED=0: never name a statement; by default the middleware names them and goes on unnamed by itself at the
// first 26000/42P05 at a claim (a pooler that cannot keep them, such as PgBouncer before 1.21 in transaction pooling).
const prepared = process.env.PG_PREPARED === '0' ? false : 'auto';
const app = createApp({
  pool, faults, prepared, bench: process.env.PAYMENTS_BENCH === '1', ridesLeaseSeconds,
});
const server = app.listen(port, host, () => {
  console.log(`payments: listening on http://${host}:${port}${faults ? ' (X-Fault enabled)' : ''}`);
});
server.on('error', (err) => {
  console.error('payments: cannot listen:', err.message);
  process.exit(1);
});

let stopping = false;
function stop() {
  if (stopping) return;
  stopping = true;
  server.close(() => pool.end().finally(() => process.exit(0)));
  server.closeIdleConnections?.();
  setTimeout(() => process.exit(0), 5000).unref();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
