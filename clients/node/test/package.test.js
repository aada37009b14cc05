// The package as a newcomer gets it: `npm pack` holds the library and its declarations and nothing else, the
// tarball installed by path imports by its name, and tsc accepts the documented uses through index.d.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const pkgDir = fileURLToPath(new URL('..', import.meta.url));
const pkg = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'));
const npmEnv = { ...process.env, npm_config_audit: 'false', npm_config_fund: 'false', npm_config_update_notifier: 'false' };

test('npm pack: the library, its declarations, README and package.json; no tests, service or lock file', () => {
  const [info] = JSON.parse(execFileSync('npm', ['pack', '--dry-run', '--json'], { cwd: pkgDir, env: npmEnv, encoding: 'utf8' }));
  const files = info.files.map((f) => f.path).sort();
  const sources = readdirSync(join(pkgDir, 'src')).filter((f) => f.endsWith('.js')).map((f) => `src/${f}`);
  assert.deepEqual(files, ['README.md', 'index.d.ts', 'package.json', ...sources].sort());
  for (const target of [pkg.main, pkg.types, pkg.exports['.'].types, pkg.exports['.'].default]) {
    assert.ok(files.includes(target.replace(/^\.\//, '')), `${target} is in the package`);
  }
});

test('express and pg are peer dependencies (express optional), never dependencies', () => {
  assert.equal(pkg.dependencies, undefined);
  assert.ok(pkg.peerDependencies.pg && pkg.peerDependencies.express);
  assert.equal(pkg.peerDependenciesMeta.express.optional, true);
  assert.equal(pkg.peerDependenciesMeta.pg, undefined, 'pg is required');
});

test('the tarball, installed by path, imports by the package name', () => {
  const dir = mkdtempSync(join(tmpdir(), 'idem-pack-'));
  try {
    const out = execFileSync('npm', ['pack', '--pack-destination', dir, '--json'], { cwd: pkgDir, env: npmEnv, encoding: 'utf8' });
    const tarball = join(dir, JSON.parse(out)[0].filename);
    const modDir = join(dir, 'app', 'node_modules', 'idempotency-pg');
    mkdirSync(modDir, { recursive: true });
    execFileSync('tar', ['-xzf', tarball, '-C', modDir, '--strip-components=1']);
    writeFileSync(join(dir, 'app', 'package.json'), '{"type": "module"}');
    writeFileSync(join(dir, 'app', 'main.js'),
      "import * as m from 'idempotency-pg';\n" +
      "console.log(JSON.stringify(['idempotency', 'transactional', 'koaIdempotency', 'fastifyIdempotency', 'HttpProblem']" +
      ".map((n) => typeof m[n])));\n");
    const types = JSON.parse(execFileSync(process.execPath, ['main.js'], { cwd: join(dir, 'app'), encoding: 'utf8' }));
    assert.deepEqual(types, ['function', 'function', 'function', 'function', 'function']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('index.d.ts: tsc --noEmit accepts the documented uses and refuses wrong options', () => {
  const tsc = join(pkgDir, 'node_modules', 'typescript', 'bin', 'tsc');
  try {
    execFileSync(process.execPath, [tsc, '-p', join(pkgDir, 'test', 'types', 'tsconfig.json')], { cwd: pkgDir, encoding: 'utf8' });
  } catch (e) {
    assert.fail(`tsc failed:\n${e.stdout}${e.stderr}`);
  }
});
