// The holder that test/lease.test.js kills mid-step: it runs runLease with a 1 s lease (heartbeat on), commits
// step one, marks that step two started, then waits to be killed (SIGKILL: no cleanup, no release). Inert when
// node --test loads it as a file of the test folder (LEASE_KEY unset).
import pg from 'pg';
import { runLease, jsonResponse } from '../src/index.js';

const { IDEM_TEST_DATABASE_URL: url, LEASE_KEY: key, LEASE_SCOPE: scope } = process.env;
if (key && url) {
  const pool = new pg.Pool({ connectionString: url, max: 3 });
  const write = (client, ctx, step) => client.query('INSERT INTO lease_test_writes VALUES ($1, $2, $3, $4, $5)',
    [ctx.scope, ctx.key, step, 'child', ctx.fencingNumber]);
  await runLease(pool, key, {
    scope, path: '/t', body: '{"a": 1}', leaseSeconds: 1,
    steps: [
      {
        name: 'one',
        async run(ctx) {
          await ctx.transaction(async (client) => {
            await write(client, ctx, 'one');
            ctx.state.one = 'child';
          });
        },
      },
      {
        name: 'two',
        async run(ctx) {
          await write(pool, ctx, 'two-started'); // autocommit: the test sees it and kills this process
          await new Promise((resolve) => setTimeout(resolve, 60000)); // "the provider call" that never ends
        },
      },
    ],
    finish: async () => jsonResponse(201, { child: true }),
  });
  process.exit(3); // never here: killed in step two
}
