# The expiry background worker on a preloaded node: the launcher, its sweeps of
# idempotency.databases, skipped databases, reloads, failed sweeps, restarts and
# shutdown; then idem_cleanup() on a node without preloading.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use IdemNode;

my $HASH = 'a' x 64;

# Whether $regexp appears in the log after $offset within $limit seconds.
sub log_shows
{
	my ($node, $offset, $regexp, $limit) = @_;
	my $start = time;
	for (;;)
	{
		return 1 if slurp_file($node->logfile, $offset) =~ $regexp;
		return 0 if time - $start > $limit;
		sleep 0.1;
	}
}

sub launcher_pid
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'");
}

sub set_and_reload
{
	my ($node, $setting, $value) = @_;
	$node->safe_psql('postgres', "ALTER SYSTEM SET $setting = '$value'");
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
}

# Only postgres at first: appdb and noext must exist before the launcher looks at them,
# so that each is reported for the right reason. Batches of 500: the 5000 expired keys
# below take 10 batches, so a sweep that stopped after one batch would need 10 ticks.
# Unpaced until the pacing section below, so the timings above it measure the schedule alone.
my $node = IdemNode->create('worker', "idempotency.databases = 'postgres'", 'idempotency.cleanup_interval = 1s',
	'idempotency.cleanup_batch_size = 500', 'idempotency.cleanup_keys_per_second = 0');
$node->safe_psql('postgres', 'CREATE DATABASE appdb');
$node->safe_psql('postgres', 'CREATE DATABASE noext');
$node->safe_psql('appdb', 'CREATE EXTENSION idempotency');

# Fails if the launcher is not registered or has another backend_type.
ok(defined $node->wait_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'", 10),
	'pg_stat_activity shows one idempotency launcher');
my $launcher = launcher_pid($node);

my $log_from = -s $node->logfile;
set_and_reload($node, 'idempotency.databases', 'postgres, appdb, noext, missingdb');

# ---- appdb: expired keys go, live keys stay ----
$node->safe_psql('appdb', 'SELECT idem_stats_reset()');
$node->safe_psql('appdb', qq{
	DO \$\$ BEGIN
		FOR i IN 1..100 LOOP
			PERFORM idem_claim('live' || i, '$HASH', interval '1 hour');
			PERFORM idem_complete('live' || i, 201, '{"ok": true}');
		END LOOP;
	END \$\$});
$node->insert_expired('appdb', 'expired', 5000);
my $took = $node->wait_until('appdb', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'expired%'", 30);
# Fails if the worker does not sweep appdb, or only every few intervals, or one batch per tick.
ok(defined $took && $took <= 5,
	sprintf('5000 expired keys removed within three 1s intervals (took %s s)',
		defined $took ? sprintf('%.1f', $took) : 'forever'));
# Fails if the sweep deletes keys that have not expired.
is($node->count_keys('appdb', 'live'), '100', 'the 100 live keys stay');
# Fails if the sweeper does not count its deletes or report its sweep to idem_stats.
is($node->safe_psql('appdb', q{
	SELECT shared, keys_removed >= 5000, last_sweep_database IN ('postgres', 'appdb'),
	       last_sweep_started_at > now() - interval '1 minute', last_sweep_duration_ms >= 0,
	       last_sweep_removed IS NOT NULL, last_error IS NULL, last_error_database IS NULL
	FROM idem_stats}), 't|t|t|t|t|t|t|t', 'idem_stats: keys_removed >= 5000, last sweep filled, no error');

# ---- noext (no extension) and missingdb (no database): said once, no errors ----
# Fail if a skipped database is not reported, or for the wrong reason.
ok(log_shows($node, $log_from, qr/database "noext" has no idempotency extension; skipping/, 10),
	'the log says noext has no extension');
ok(log_shows($node, $log_from, qr/database "missingdb" in idempotency\.databases does not exist or refuses connections; skipping/, 10),
	'the log says missingdb does not exist');
# At least three more ticks: a sweep started 3 s after this point.
my $mark = $node->safe_psql('postgres', 'SELECT now() + interval \'3 s\'');
ok(defined $node->wait_until('postgres', "SELECT last_sweep_started_at > '$mark' FROM idem_stats", 15),
	'the launcher keeps ticking');
# Fail if the skip notice is repeated each tick.
is($node->log_lines($log_from, qr/"noext" .*skipping/), 1, 'noext: one "skipping" line over several ticks');
is($node->log_lines($log_from, qr/"missingdb" .*skipping/), 1, 'missingdb: one "skipping" line over several ticks');
# Fails if a sweeper is started in missingdb (FATAL: database does not exist) or errors in noext.
is($node->log_lines($log_from, qr/(ERROR|FATAL):.*(noext|missingdb)/), 0,
	'no ERROR or FATAL lines about noext or missingdb');

# Once the extension exists, noext is cleaned and that is said once.
$node->safe_psql('noext', 'CREATE EXTENSION idempotency');
$node->insert_expired('noext', 'expired', 50);
# Fails if the launcher never looks at a skipped database again.
ok(defined $node->wait_until('noext', "SELECT count(*) = 0 FROM idempotency_keys", 10),
	'noext: expired keys removed after CREATE EXTENSION');
my $mark2 = $node->safe_psql('postgres', 'SELECT now() + interval \'2 s\'');
$node->wait_until('postgres', "SELECT last_sweep_started_at > '$mark2' FROM idem_stats", 15);
is($node->log_lines($log_from, qr/cleaning database "noext"/), 1, 'the log says "cleaning database "noext"" once');
is($node->log_lines($log_from, qr/"noext" .*skipping/), 1, 'and no new "skipping" line for noext');

# ---- a failing sweep is logged, recorded, and the launcher carries on ----
$node->safe_psql('appdb', q{
	CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'idem test: delete refused'; END $$;
	CREATE TRIGGER refuse_delete BEFORE DELETE ON idempotency_keys
		FOR EACH ROW EXECUTE FUNCTION refuse_delete();
	-- The sweep fires no ordinary trigger (session_replication_role = replica); one its owner enables ALWAYS
	-- fires, as the owner.
	ALTER TABLE idempotency_keys ENABLE ALWAYS TRIGGER refuse_delete});
my $err_from = -s $node->logfile;
$node->insert_expired('appdb', 'refused', 20);
$node->insert_expired('noext', 'after', 20);
# Fails if a sweep's error is not copied to idem_stats.
ok(defined $node->wait_until('appdb', q{
		SELECT last_error LIKE '%delete refused%' AND last_error_database = 'appdb'
		       AND last_error_at > now() - interval '1 minute' FROM idem_stats}, 10),
	'idem_stats.last_error shows the failed sweep of appdb');
# Fails if the sweeper swallows the error instead of logging it.
ok(log_shows($node, $err_from, qr/ERROR:.*idem test: delete refused/, 5), 'the log has the ERROR');
# noext comes after appdb in the list. Fails if a failed sweep ends the tick or the launcher.
ok(defined $node->wait_until('noext', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'after%'", 10),
	'databases after the failing one are still swept');
is($node->count_keys('appdb', 'refused'), '20', 'the failed delete removed nothing');
$node->safe_psql('appdb', 'DROP TRIGGER refuse_delete ON idempotency_keys');
# Fails if appdb is given up after an error.
ok(defined $node->wait_until('appdb', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'refused%'", 10),
	'after the trigger is dropped the keys are removed');
# Fails if the error took the launcher down (it would be restarted with a new pid).
is(launcher_pid($node), $launcher, 'the launcher did not restart');

# ---- the launcher comes back after being terminated ----
$node->safe_psql('postgres', "SELECT pg_terminate_backend($launcher)");
$took = $node->wait_until('postgres', qq{
	SELECT count(*) = 1 FROM pg_stat_activity
	WHERE backend_type = 'idempotency launcher' AND pid <> $launcher}, 30);
# Fails with bgw_restart_time = BGW_NEVER_RESTART or a long one.
ok(defined $took && $took <= 10,
	sprintf('a new launcher within 10 s of pg_terminate_backend (took %s s)',
		defined $took ? sprintf('%.1f', $took) : 'forever'));
$node->insert_expired('appdb', 'restarted', 100);
ok(defined $node->wait_until('appdb', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'restarted%'", 10),
	'the new launcher cleans');

# ---- a reload changes the interval, both ways ----
set_and_reload($node, 'idempotency.cleanup_interval', '60s');
sleep 2;    # lets a tick that began before the reload finish
$node->insert_expired('appdb', 'slow', 100);
sleep 5;
# Fails if the launcher ignores SIGHUP and keeps sweeping every second.
is($node->count_keys('appdb', 'slow'), '100', 'with cleanup_interval = 60s keys stay for 5 s');
set_and_reload($node, 'idempotency.cleanup_interval', '1s');
$took = $node->wait_until('appdb', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'slow%'", 30);
# Fails if the new interval is applied only after the 60 s wait already begun.
ok(defined $took && $took <= 3,
	sprintf('back to 1s: the keys are removed within 3 s (took %s s)',
		defined $took ? sprintf('%.1f', $took) : 'forever'));

# ---- pacing: idempotency.cleanup_keys_per_second holds a sweep to its rate ----
# 3000 keys at 1000 keys/s in batches of 500: the sixth batch starts 2.5 s after the
# first; unpaced they all go within a second of the insert. A reload reaches the sweep
# in progress.
set_and_reload($node, 'idempotency.cleanup_keys_per_second', '1000');
$node->insert_expired('appdb', 'paced', 3000);
$took = $node->wait_until('appdb', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'paced%'", 30);
# Fails if the sweeper ignores the setting and deletes at full speed.
ok(defined $took && $took >= 2,
	sprintf('3000 keys at 1000 keys/s: removed %s s after the insert (at least 2)',
		defined $took ? sprintf('%.1f', $took) : 'never'));
# A slower pace lengthens the wait of a sweep under way too: let the last one end first.
ok(defined $node->wait_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup'", 30),
	'the sweep at 1000 keys/s has ended');
set_and_reload($node, 'idempotency.cleanup_keys_per_second', '10');
$node->insert_expired('appdb', 'crawl', 3000);    # 300 s at this pace
ok(defined $node->wait_until('appdb', "SELECT count(*) < 3000 FROM idempotency_keys WHERE key LIKE 'crawl%'", 30),
	'a sweep at 10 keys/s has begun');
set_and_reload($node, 'idempotency.cleanup_keys_per_second', '0');
$took = $node->wait_until('appdb', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'crawl%'", 30);
# Fails if the sweeper reads the pace only when it starts (the rest would take 300 s).
ok(defined $took && $took <= 10,
	sprintf('a reload to 0 speeds up the running sweep: done in %s s',
		defined $took ? sprintf('%.1f', $took) : 'forever'));

# A sweep held back (here by a reload to 1 key/s, 500 s per batch) goes on at its pace once
# released, instead of deleting at full speed until it has caught up with the time it lost.
set_and_reload($node, 'idempotency.cleanup_keys_per_second', '500');
$node->insert_expired('appdb', 'held', 6000);    # 12 s at this pace, one batch of 500 a second
ok(defined $node->wait_until('appdb', "SELECT count(*) <= 5000 FROM idempotency_keys WHERE key LIKE 'held%'", 30),
	'a sweep at 500 keys/s has deleted two batches');
set_and_reload($node, 'idempotency.cleanup_keys_per_second', '1');
sleep 2;    # a batch under way when the reload came finishes
my $held = $node->safe_psql('appdb', "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'held%'");
sleep 3;
is($node->safe_psql('appdb', "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'held%'"),
	$held, "at 1 key/s the sweep pauses ($held keys left)");
set_and_reload($node, 'idempotency.cleanup_keys_per_second', '500');
sleep 2;
my $left = $node->safe_psql('appdb', "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'held%'");
# Fails if the sweep catches up on the 5 s it was held: then all of them go at once.
ok($left > 0 && $left >= $held - 2000,
	"released, the sweep goes on at 500 keys/s: $left of $held keys left 2 s later (at least "
	  . ($held - 2000) . ')');
ok(defined $node->wait_until('appdb', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'held%'", 60),
	'and finishes');
set_and_reload($node, 'idempotency.cleanup_keys_per_second', '0');

# ---- idempotency.cleanup_wal_compression: the sweeper compresses its full-page images ----
# 3000 expired keys, their hint bits set (with data checksums, initdb's default from 18 on, the
# session setting them after the checkpoint would log the pages itself) and a checkpoint taken
# while appdb is off the list; then appdb is listed again, and the sweep logs each page it deletes
# from whole, once: the WAL from the checkpoint until the last key is gone is nearly all the
# sweep's. pglz is in every build; the default is lz4 where the server has it.
sub sweep_wal_bytes
{
	my ($node, $prefix) = @_;
	set_and_reload($node, 'idempotency.databases', 'postgres, noext, missingdb');
	sleep 2.5;    # two ticks: the launcher has read the list again
	$node->wait_until('postgres', q{SELECT count(*) = 0 FROM pg_stat_activity
		WHERE backend_type = 'idempotency cleanup' AND datname = 'appdb'}, 10);
	$node->safe_psql('appdb', qq{
		INSERT INTO idempotency_keys
		SELECT now() - interval '1 hour', now() - interval '2 hours', 200, '', '$prefix' || i,
		       sha256(i::text::bytea), NULL, '{"status": "succeeded", "amount": 1250, "currency": "eur"}'
		FROM generate_series(1, 3000) i});
	$node->safe_psql('appdb', "SELECT count(*) FROM idempotency_keys WHERE key LIKE '$prefix%'");
	$node->safe_psql('appdb', 'CHECKPOINT');
	# The insert position, not pg_current_wal_lsn()'s write position: the sweeper commits
	# asynchronously, so its WAL may not be written yet when the last key is seen gone.
	my $from = $node->safe_psql('appdb', 'SELECT pg_current_wal_insert_lsn()');
	set_and_reload($node, 'idempotency.databases', 'postgres, appdb, noext, missingdb');
	my $took = $node->wait_until('appdb', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE '$prefix%'", 30);
	return undef unless defined $took;
	return $node->safe_psql('appdb', "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$from')");
}
{
	set_and_reload($node, 'idempotency.cleanup_wal_compression', 'off');
	my $plain_wal = sweep_wal_bytes($node, 'uncompressed');
	set_and_reload($node, 'idempotency.cleanup_wal_compression', 'pglz');
	my $pglz_wal = sweep_wal_bytes($node, 'pglz');
	# Fails if the sweeper does not take its wal_compression from the setting.
	# A window that caught no WAL (0 B) would pass the ratio alone: it must hold at least the 3000
	# delete records (about 50 B each), compressed or not.
	ok(defined $plain_wal && defined $pglz_wal && $pglz_wal > 3000 * 40 && $pglz_wal < 0.8 * $plain_wal,
		sprintf('a sweep of 3000 keys writes %s B of WAL uncompressed, %s B with pglz (less than 0.8x)',
			$plain_wal // 'never done', $pglz_wal // 'never done'));
}
# Fails if the sweeper's setting leaks into other sessions.
is($node->safe_psql('appdb', 'SHOW wal_compression'), 'off', 'other sessions keep the server\'s wal_compression');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET idempotency.cleanup_wal_compression');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');

# ---- SIGTERM: a fast stop does not wait for a sweep in progress ----
$node->safe_psql('appdb', q{
	CREATE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN PERFORM pg_sleep(0.1); RETURN OLD; END $$;
	CREATE TRIGGER slow_delete BEFORE DELETE ON idempotency_keys
		FOR EACH ROW EXECUTE FUNCTION slow_delete();
	ALTER TABLE idempotency_keys ENABLE ALWAYS TRIGGER slow_delete});
$node->insert_expired('appdb', 'sleepy', 1000);    # a 100 s sweep
ok(defined $node->wait_until('postgres', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		WHERE backend_type = 'idempotency cleanup' AND wait_event = 'PgSleep'}, 10),
	'a sweep is in progress');
my $stop_start = time;
my $stopped = $node->stop('fast', fail_ok => 1);
my $stop_took = time - $stop_start;
# Fails if the sweeper or the launcher ignores SIGTERM (pg_ctl would wait up to 60 s).
ok($stopped && $stop_took < 5, sprintf('fast stop with a sweep running took %.1f s', $stop_took));
# Fails on a crash of a worker at any point above.
is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, 'no process crashed');

# ---- without preloading: no worker, idem_cleanup() by hand, per-backend stats ----
my $plain = IdemNode->create('plain', { preload => 0 });
is($plain->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'"),
	'0', 'not preloaded: no launcher');
is($plain->safe_psql('postgres', qq{
	BEGIN;
	SELECT outcome FROM idem_claim('k1', '$HASH', interval '1 hour');
	SELECT idem_complete('k1', 201, '{"id": 1}');
	COMMIT;
	SELECT outcome, http_status, response_body FROM idem_claim('k1', '$HASH')}),
	"claimed\nt\nreplay|201|{\"id\": 1}", 'not preloaded: claim, complete, replay');
# Fails if idem_keys_in_flight() needs the shared memory only preloading makes.
is($plain->safe_psql('postgres', qq{
	BEGIN;
	SELECT outcome FROM idem_claim('held', '$HASH');
	SELECT count(*) FROM idem_keys_in_flight();
	ROLLBACK}),
	"claimed\n0", 'not preloaded: a held claim is not listed and idem_keys_in_flight() does not fail');
$plain->insert_expired('postgres', 'old', 37);
# Fails if idem_cleanup() misses keys, deletes live ones, or the counters claim to be shared.
is($plain->safe_psql('postgres', q{
	SELECT idem_cleanup();
	SELECT shared, keys_removed FROM idem_stats;
	SELECT count(*) FROM idempotency_keys}),
	"37\nf|37\n1", 'idem_cleanup() returns 37, idem_stats is per backend (shared = false), k1 stays');
$plain->stop;

done_testing();
