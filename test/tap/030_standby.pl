# A preloaded primary with a streaming hot standby: the standby refuses claims with
# SQLSTATE 25006 and writes nothing, hashes fine, and never sweeps (its expired keys
# go when the primary's worker removes them); once promoted it sweeps by itself.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use IdemNode;

my $HASH = 'a' x 64;

# The primary sweeps only postgres until told otherwise, so that expired keys
# reach the standby and stay there unless the standby removes them itself.
my $primary = IdemNode->create('primary', { allows_streaming => 1 }, "idempotency.databases = 'postgres'",
	'idempotency.cleanup_interval = 1s');
$primary->safe_psql('postgres', 'CREATE DATABASE appdb');
$primary->safe_psql('appdb', 'CREATE EXTENSION idempotency');
$primary->backup('backup');

my $standby = IdemNode->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
# The standby is told to sweep appdb: it must not.
$standby->append_conf('postgresql.conf', "idempotency.databases = 'postgres, appdb'\n");
$standby->start;

$primary->safe_psql('appdb', qq{
	BEGIN;
	SELECT idem_claim('live', '$HASH', interval '1 hour');
	SELECT idem_complete('live', 201, '{"id": 7}');
	COMMIT});
$primary->insert_expired('appdb', 'old', 200);
$primary->wait_for_catchup($standby);
is($standby->count_keys('appdb', 'old'), '200', 'expired keys are replicated to the standby');

# ---- claims on the standby ----
for my $key ('live', 'new')
{
	my ($ret, $out, $err) = $standby->psql('appdb',
		"\\set VERBOSITY verbose\nSELECT * FROM idem_claim('$key', '$HASH')");
	# Fails if a standby answers claims (it cannot take the key nor store the response).
	like($err, qr/ERROR:\s+25006:/, "idem_claim('$key') on the standby raises SQLSTATE 25006");
}
# Fails if a refused claim still counts, or leaves anything behind.
is($standby->safe_psql('appdb', 'SELECT claims, replays, in_progress FROM idem_stats'), '0|0|0',
	'refused claims are not counted');
is($standby->safe_psql('appdb', 'SELECT count(*) FROM idempotency_keys'), '201', 'the standby has the same keys');
is($primary->safe_psql('appdb', "SELECT count(*) FROM idempotency_keys WHERE key = 'new'"), '0',
	'the primary has no key "new"');
is($standby->safe_psql('appdb', "SELECT idem_hash('abc')"),
	'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad', 'idem_hash works on the standby');

# ---- no sweeps on the standby ----
my $log_from = -s $standby->logfile;
my $mark = $primary->safe_psql('postgres', "SELECT now() + interval '3 s'");
my %seen;
my $start = time;
while ($primary->safe_psql('postgres', "SELECT coalesce(last_sweep_started_at > '$mark', false) FROM idem_stats") ne 't'
	&& time - $start < 15)
{
	$seen{$_}++ for split /\n/, $standby->safe_psql('postgres',
		"SELECT backend_type FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'");
	sleep 0.05;
}
# Fails if the primary's launcher does not tick, which would make the rest vacuous.
ok(time - $start < 15, 'the primary swept postgres several times meanwhile');
# Fails if the launcher is started during recovery (BgWorkerStart_ConsistentState).
is(join(',', sort keys %seen), '', 'no idempotency launcher or cleanup backend on the standby');
# A sweep on the standby would record itself (or its read-only error) in the standby's stats.
is($standby->safe_psql('appdb', q{
	SELECT last_sweep_started_at IS NULL, keys_removed, last_error IS NULL FROM idem_stats}),
	't|0|t', 'the standby has no sweep in its stats');
is($standby->log_lines($log_from, qr/ERROR|FATAL/), 0,
	'no ERROR or FATAL in the standby log');
is($standby->count_keys('appdb', 'old'), '200', 'expired keys stay on the standby while the primary keeps them');

# ---- the primary's worker removes them; the standby follows ----
$primary->safe_psql('postgres', "ALTER SYSTEM SET idempotency.databases = 'postgres, appdb'");
$primary->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(defined $primary->wait_until('appdb', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'old%'", 10),
	'the primary worker removes the expired keys');
# The sweeper commits asynchronously: its commit record may not be written yet, so the standby is waited for up
# to the primary's insert position, not its write position (a fresh-clone run read 200 keys still there).
$primary->wait_for_catchup($standby, 'replay',
	$primary->safe_psql('postgres', 'SELECT pg_current_wal_insert_lsn()'));
is($standby->count_keys('appdb', 'old'), '0', 'replay removes them on the standby');
is($standby->safe_psql('appdb', "SELECT count(*) FROM idempotency_keys WHERE key = 'live'"), '1',
	'the live key stays on the standby');
is($standby->safe_psql('appdb', 'SELECT keys_removed FROM idem_stats'), '0',
	'the standby itself removed nothing');

# ---- once promoted, the former standby sweeps ----
$standby->promote;
# Fails if the launcher registered for recovery never starts after promotion.
ok(defined $standby->wait_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'", 10),
	'after promotion the launcher runs');
$standby->insert_expired('appdb', 'promoted', 50);
ok(defined $standby->wait_until('appdb', "SELECT count(*) = 0 FROM idempotency_keys WHERE key LIKE 'promoted%'", 10),
	'and removes expired keys');
is($standby->safe_psql('appdb', "SELECT outcome FROM idem_claim('new', '$HASH')"), 'claimed',
	'and claims work');

for my $node ($primary, $standby)
{
	is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, $node->name . ': no process crashed');
	$node->stop;
}
done_testing();
