// POST /rides (clients/CONTRACT.md "lease-rides"): the rocket-rides story in lease mode. The charge at a simulated
// payment provider and the receipt from a simulated mailer are outside calls, each made with no transaction open,
// so the request runs with runLease() (a lease with a heartbeat, a recovery point per step) instead of the
// transactional middleware.
//
// Steps: `charge_created` (the provider's charge, then the ride row and the checkpoint in one transaction) and
// `receipt_sent` (the mailer); finish marks the ride's receipt sent and stores the 201 (idem_lease_complete_request).

import { setTimeout as sleep } from 'node:timers/promises';
import {
  CapturedResponse, DEFAULT_BODY_LIMIT, HttpProblem, PROBLEM_BASE, admit, jsonResponse, problem, readRawBody, runLease,
  sendResponse,
} from '../src/index.js';
import { isJsonType } from '../src/responses.js';

const STALL = /^stall=(\d{1,7})$/;
/** The exit status of the crash-* faults. */
export const CRASH_STATUS = 70;

/**
 * The route handler. `authenticate(req)` gives the account (or throws HttpProblem 401), `paymentOf(contentType,
 * raw)` {amount, currency}, {error}, or null for a body it cannot read; `leaseSeconds` is the lease's length; `faults` enables X-Fault.
 */
export function ridesHandler({ pool, authenticate, paymentOf, leaseSeconds = 30, faults = false, logger = console }) {
  const cfg = { scope: authenticate, bodyLimit: DEFAULT_BODY_LIMIT, problemBase: PROBLEM_BASE };
  return async function rides(req, res, next) {
    let answer;
    try {
      answer = await ride(req);
    } catch (e) {
      if (e instanceof HttpProblem) answer = e.response;
      else return next(e); // the app's error handler: 500 problem+json (the lease was given back)
    }
    sendResponse(res, answer);
  };

  async function ride(req) {
    const request = await admit(cfg, {
      scopeArg: req, keyHeader: req.headers['idempotency-key'], method: 'POST', path: '/rides',
      body: () => readRawBody(req, cfg), contentType: req.headers['content-type'] ?? null,
    });
    if (request instanceof CapturedResponse) return request; // 401, 400, 413: before any lease
    const { key, scope: account, raw, contentType } = request;
    const payment = await paymentOf(contentType, raw);
    if (payment === null) return problem(400, 'request-body-not-json', 'Malformed request body', 'the request body is not JSON');
    if (payment.error) {
      // not executed: answered before any lease, so nothing is stored and the corrected retry is claimed afresh
      return problem(422, 'invalid-payment', 'Invalid payment', payment.error);
    }
    const { amount, currency } = payment;
    const fault = faults && typeof req.headers['x-fault'] === 'string' ? req.headers['x-fault'].trim() : '';

    const charge = {
      name: 'charge_created',
      async run(ctx) {
        if (fault === 'provider-503') {
          // the provider refused before charging: runLease gives the lease back, nothing is stored
          throw new HttpProblem(503, 'provider-unavailable', 'Service Unavailable', 'the payment provider answered 503');
        }
        // The provider call: idempotent on (account, key), as a real provider is on its Idempotency-Key, so a
        // retry after a crash gets the first charge back instead of a second one.
        const { rows: [{ charge_id: chargeId }] } = await pool.query(
          'INSERT INTO provider_charges (account, idempotency_key, amount_cents, currency) VALUES ($1, $2, $3, $4) ' +
          'ON CONFLICT (account, idempotency_key) DO UPDATE SET amount_cents = EXCLUDED.amount_cents RETURNING charge_id',
          [account, key, amount, currency]);
        if (fault === 'crash-after-charge') process.exit(CRASH_STATUS);
        const stall = STALL.exec(fault);
        if (stall) {
          ctx.stopHeartbeat(); // a stalled holder: its lease runs out and a retry takes over
          await sleep(Number(stall[1]));
        }
        await ctx.transaction(async (client) => {
          const { rows: [{ id }] } = await client.query(
            'INSERT INTO rides (account, idempotency_key, amount_cents, currency, charge_id, fencing_number) ' +
            'VALUES ($1, $2, $3, $4, $5, $6) RETURNING id',
            [account, key, amount, currency, chargeId, ctx.fencingNumber]);
          ctx.state.ride_id = Number(id);
          ctx.state.charge_id = chargeId;
        });
        if (fault === 'crash-after-checkpoint') process.exit(CRASH_STATUS);
      },
    };
    const receipt = {
      name: 'receipt_sent',
      async run(ctx) {
        // The mailer: one receipt per (account, key), however often it is asked. No local write: the runner
        // records the step in a transaction of its own.
        await pool.query(
          'INSERT INTO receipts (account, idempotency_key, ride_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING',
          [account, key, ctx.state.ride_id]);
      },
    };
    // the fingerprint: a JSON body's as idem_lease computes it from method, path and body (1.2's, which is
    // idem_fingerprint's JSON form); any other body's bytes form from idem_fingerprint (1.3+)
    const json = isJsonType(contentType) || !contentType;
    const fingerprint = json ? { method: 'POST', path: '/rides', body: raw.toString('utf8') } : {
      requestHash: (await pool.query('SELECT idem_fingerprint($1, $2, $3, $4, $5) AS h',
        ['POST', '/rides', null, contentType, raw])).rows[0].h,
    };
    return runLease(pool, key, {
      scope: account,
      ...fingerprint,
      leaseSeconds,
      steps: [charge, receipt],
      replayHeaders: ['Content-Type', 'Location'],
      logger,
      async finish(client, ctx) {
        const { ride_id: rideId, charge_id: chargeId } = ctx.state;
        await client.query('UPDATE rides SET receipt_sent = true WHERE id = $1', [rideId]);
        return jsonResponse(201, { ride_id: rideId, account, amount_cents: amount, currency, charge_id: chargeId },
          [['Location', `/rides/${rideId}`]]);
      },
    });
  }
}
