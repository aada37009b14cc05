# 1.3 hardening: no DateStyle, TimeZone or default_tablespace chosen by a database owner or a session bends expiry.
#
# Six databases, three time zones (Asia/Kolkata, +05:30; the POSIX zone IST+3, UTC-3 printed "IST", which the
# default abbreviations read as another offset; Pacific/Chatham, +13:45) times the two storage modes (1-hour
# partitions, or the plain table). Each holds live keys that expire 20 min to 5 h from now (in partitions made
# ahead, in partitioned storage) and expired ones (in an expired partition and in the default partition, or in
# the table).
# (1) idem_cleanup() in a session with DateStyle 'SQL, DMY' or 'Postgres' and each zone: every expired key
#     goes, no live key does.
# (2) The same rows again, the settings now the databases' own (ALTER DATABASE ... SET), and the worker sweeps.
# (3) A database owned by a role that is not superuser sets default_tablespace to a tablespace it may not use
#     (and a longer idempotency.ttl, so the worker makes partitions): the tablespace stays empty, the partitions
#     go where their parent is.
# Fails on 1.2: idem_partitions() read the bounds back from pg_get_expr's text under the caller's settings, so a
# partition of live keys looked expired and was dropped ((1) and (2) in the IST+3 databases), and the worker made
# partitions in the tablespace named by default_tablespace ((3)).
use strict;
use warnings;

use File::Spec;
use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $HASH = 'd' x 64;
my $node = IdemNode->create('settings', "idempotency.databases = ''", 'idempotency.cleanup_interval = 1s');

sub reload_databases
{
	my ($list) = @_;
	$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.databases = '$list'");
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
}

my @zones = ('Asia/Kolkata', 'IST+3', 'Pacific/Chatham');
my @styles = ('SQL, DMY', 'Postgres', 'SQL, DMY');
my %setting;    # database => [DateStyle, TimeZone]
my @databases;
for my $i (0 .. $#zones)
{
	for my $mode ('partitioned', 'table')
	{
		my $db = "d${i}_$mode";
		push @databases, $db;
		$setting{$db} = [ $styles[$i], $zones[$i] ];
		$node->safe_psql('postgres', "CREATE DATABASE $db");
		$node->safe_psql($db, 'CREATE EXTENSION idempotency');
		$node->safe_psql($db, q{SELECT idem_set_storage('partitioned', interval '1 hour')})
		  if $mode eq 'partitioned';
	}
}

# Live keys 'live1..5' and expired keys 'old*' in the table that holds keys in that mode.
sub plant_keys
{
	my ($db) = @_;
	my $partitioned = $db =~ /partitioned/;
	my $table = $partitioned ? 'idempotency_keys_partitioned' : 'idempotency_keys';
	$node->safe_psql($db, qq{
		DELETE FROM $table WHERE key LIKE 'old%' OR key LIKE 'live%';
		INSERT INTO $table (expires_at, created_at, http_status, scope, key, request_hash)
		SELECT now() + m * interval '1 minute', now(), 200, '', 'live' || m, decode('$HASH', 'hex')
		FROM unnest(ARRAY[20, 80, 140, 200, 300]) m;
		INSERT INTO $table (expires_at, created_at, http_status, scope, key, request_hash)
		SELECT now() - interval '1 day', now() - interval '2 days', 200, '', 'old' || i, decode('$HASH', 'hex')
		FROM generate_series(1, 5) i;});
	return unless $partitioned;
	# An expired partition below the current ones, with 5 keys of its own.
	$node->safe_psql($db, q{
		SELECT idem_create_partition(min(lower_bound) - interval '3 hours', min(lower_bound) - interval '2 hours')
		FROM idem_partitions()
		WHERE NOT EXISTS (SELECT FROM idem_partitions() p WHERE p.upper_bound <= now())
		HAVING min(lower_bound) IS NOT NULL});
	$node->safe_psql($db, qq{
		INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash)
		SELECT p.lower_bound + interval '30 minutes', p.lower_bound, 200, '', 'oldpart' || i, decode('$HASH', 'hex')
		FROM (SELECT min(lower_bound) AS lower_bound FROM idem_partitions()) p, generate_series(1, 5) i;});
}

sub keys_left
{
	my ($db, $prefix) = @_;
	my $table = $db =~ /partitioned/ ? 'idempotency_keys_partitioned' : 'idempotency_keys';
	return $node->safe_psql($db, "SELECT count(*) FROM $table WHERE key LIKE '$prefix%'");
}

# ---- (1) idem_cleanup() under the session's settings ----
for my $db (@databases)
{
	plant_keys($db);
	my ($style, $zone) = @{ $setting{$db} };
	my $removed = $node->safe_psql($db, "SET DateStyle = '$style'; SET TimeZone = '$zone'; SELECT idem_cleanup()");
	is(keys_left($db, 'live'), 5, "$db: idem_cleanup() under DateStyle '$style', TimeZone '$zone' keeps every live key");
	is(keys_left($db, 'old'), 0, "$db: and removes every expired one ($removed)");
}

# ---- (2) the worker under the databases' settings ----
for my $db (@databases)
{
	plant_keys($db);
	my ($style, $zone) = @{ $setting{$db} };
	$node->safe_psql('postgres', "ALTER DATABASE $db SET DateStyle = '$style'; ALTER DATABASE $db SET TimeZone = '$zone'");
}
reload_databases(join ',', @databases);
for my $db (@databases)
{
	my $took = $node->wait_until($db, q{SELECT NOT EXISTS (SELECT FROM idempotency_keys WHERE key LIKE 'old%')
	                                     AND NOT EXISTS (SELECT FROM idempotency_keys_partitioned WHERE key LIKE 'old%')}, 60);
	ok(defined $took, "$db: the worker removes every expired key under the database's DateStyle and TimeZone");
}
# Two more sweeps of every database: nothing live goes later either.
my $mark = $node->safe_psql('postgres', 'SELECT now()');
$node->wait_until('postgres', qq{SELECT last_sweep_started_at > '$mark'::timestamptz + interval '2 s' FROM idem_stats}, 60);
for my $db (@databases)
{
	is(keys_left($db, 'live'), 5, "$db: the worker keeps every live key");
}
reload_databases('');

# ---- (3) a tablespace the database owner may not use ----
# Absolute: a tablespace's location must be, and basedir is relative when TESTDIR is.
my $dir = File::Spec->rel2abs($node->basedir . '/forbidden_space');
mkdir $dir or die "mkdir $dir: $!";
$node->safe_psql('postgres', qq{
	CREATE ROLE dbowner LOGIN;
	CREATE TABLESPACE forbidden LOCATION '$dir';
	CREATE DATABASE spacedb OWNER dbowner;});
$node->safe_psql('spacedb', q{CREATE EXTENSION idempotency; SELECT idem_set_storage('partitioned', interval '1 hour')});
my $before = $node->safe_psql('spacedb', 'SELECT count(*) FROM idem_partitions()');
# The owner may set both: default_tablespace is a user setting, checked only when a relation is made.
$node->psql('spacedb', q{SET ROLE dbowner;
	ALTER DATABASE spacedb SET default_tablespace = forbidden;
	ALTER DATABASE spacedb SET idempotency.ttl = '30h';}, on_error_die => 1);
my ($ret, $out, $err) = $node->psql('spacedb', q{SET ROLE dbowner; CREATE TABLE mine (i int)});
like($err, qr/permission denied for tablespace forbidden/, 'the owner may not make a table in the tablespace itself');
reload_databases('spacedb');
my $made = $node->wait_until('spacedb', "SELECT count(*) >= $before + 5 FROM idem_partitions()", 60);
ok(defined $made, 'the worker made the partitions the longer ttl needs');
is($node->safe_psql('spacedb', q{SELECT count(*) FROM pg_class
	WHERE reltablespace = (SELECT oid FROM pg_tablespace WHERE spcname = 'forbidden')}),
	'0', 'no partition and no index is in the forbidden tablespace');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_tablespace_databases(
	(SELECT oid FROM pg_tablespace WHERE spcname = 'forbidden'))}), '0', 'the tablespace stays empty');
reload_databases('');

is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, 'no process crashed');
$node->stop;
done_testing();
