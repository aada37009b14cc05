# pgbench load on hot keys: 16 clients for 15 s over 5,000 keys, ~1 request in 20 ends
# in a 503, under READ COMMITTED and REPEATABLE READ (40001 retried by --max-tries).
# Fails on: ledger rows != stored completions, a key executed twice, a stored 5xx, a key
# in_progress after the run, or any failed transaction that pgbench could not retry.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IPC::Run ();
use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $KEYS    = 5000;
my $CLIENTS = 16;
my $SECONDS = 15;

my $node = IdemNode->create('pgbench', 'max_connections = 40');
my $key_table = $node->key_table;
$node->safe_psql('postgres', 'CREATE TABLE ledger (key text NOT NULL, exec text NOT NULL);
	CREATE INDEX ON ledger (key)');
my $work = PostgreSQL::Test::Utils::tempdir();

# One request: a first read (as a handler that loads the account; under REPEATABLE READ
# it takes the snapshot, so a completion committed before the claim raises 40001), the
# claim; if claimed, 1 in 20 fails with a 503 (nothing executed, nothing stored), the
# others execute (ledger row, 1 ms of work) and store 201. Other outcomes just end.
sub script
{
	my ($level, $prefix) = @_;
	return <<"EOF";
\\set k random(1, $KEYS)
\\set fail random(1, 20)
\\set r random(1, 1000000000)
BEGIN ISOLATION LEVEL $level;
SELECT count(*) FROM ledger WHERE key = '$prefix' || :k;
SELECT (outcome = 'claimed')::int AS claimed FROM idem_claim('$prefix' || :k, idem_hash('$prefix' || :k)) \\gset
\\if :claimed
\\if :fail = 1
SELECT idem_complete('$prefix' || :k, 503);
\\else
INSERT INTO ledger (key, exec) VALUES ('$prefix' || :k, :client_id || '-' || :r);
\\sleep 1 ms
SELECT idem_complete('$prefix' || :k, 201, jsonb_build_object('exec', :client_id || '-' || :r));
\\endif
\\endif
END;
EOF
}

my $stats_sql = 'SELECT claims, replays, in_progress, completions_stored, released_5xx FROM idem_stats';

for my $level ('READ COMMITTED', 'REPEATABLE READ')
{
	(my $prefix = lc $level) =~ s/(\w)\w* (\w)\w*/$1$2-k/;    # rc-k, rr-k
	my $file = "$work/$prefix.sql";
	open my $fh, '>', $file or die;
	print $fh script($level, $prefix);
	close $fh;

	my @before = split /\|/, $node->safe_psql('postgres', $stats_sql);
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[ 'pgbench', '-n', '-h', $node->host, '-p', $node->port, '-c', $CLIENTS, '-j', 2,
			'-T', $SECONDS, '--max-tries=10', '--failures-detailed', '-f', $file, 'postgres' ],
		'>', \$out, '2>', \$err, IPC::Run::timeout($SECONDS + 120));
	my @after = split /\|/, $node->safe_psql('postgres', $stats_sql);
	my %delta;
	@delta{qw(claims replays in_progress stored released_5xx)} = map { $after[$_] - $before[$_] } 0 .. 4;

	my %bench;
	$bench{processed} = $1 if $out =~ /number of transactions actually processed: (\d+)/;
	$bench{failed}    = $1 if $out =~ /number of failed transactions: (\d+)/;
	$bench{serialization_failures} = $1 if $out =~ /number of serialization failures: (\d+)/;
	$bench{retried}   = $1 if $out =~ /number of transactions retried: (\d+)/;
	$bench{retries}   = $1 if $out =~ /total number of retries: (\d+)/;
	$bench{tps}       = $1 if $out =~ /tps = ([\d.]+)/;

	my ($ledger, $stored, $dupes, $stored_5xx) = split /\|/, $node->safe_psql('postgres', qq{
		SELECT (SELECT count(*) FROM ledger WHERE key LIKE '$prefix%'),
		       (SELECT count(*) FROM $key_table WHERE key LIKE '$prefix%'),
		       (SELECT count(*) FROM (SELECT key FROM ledger WHERE key LIKE '$prefix%'
		                              GROUP BY key HAVING count(*) > 1) d),
		       (SELECT count(*) FROM $key_table WHERE key LIKE '$prefix%' AND http_status >= 500)});
	# Every key now: replay (completed) or claimed (never completed), never in_progress.
	my %final = map { split /\|/ } split /\n/, $node->safe_psql('postgres', qq{
		BEGIN;
		SELECT c.outcome, count(*) FROM generate_series(1, $KEYS) g,
		       idem_claim('$prefix' || g, idem_hash('$prefix' || g)) c GROUP BY 1;
		ROLLBACK;});

	diag(sprintf('pgbench %s: %s tps, %s transactions, failed %s, serialization failures %s, '
		  . 'retried %s (%s retries); claims %d, replays %d, in_progress %d, stored %d, 5xx released %d; '
		  . 'ledger %d, stored rows %d, keys with two ledger rows %d, stored 5xx %d; after: %s',
		$level, map({ $bench{$_} // '?' } qw(tps processed failed serialization_failures retried retries)),
		@delta{qw(claims replays in_progress stored released_5xx)}, $ledger, $stored, $dupes, $stored_5xx,
		join(', ', map { "$_ $final{$_}" } sort keys %final)));
	diag("pgbench stderr: $err") if $err =~ /\S/;

	ok($ok, "$level: pgbench exited 0");
	unlike($err, qr/aborted|error/i, "$level: no client aborted");
	is($bench{failed}, 0, "$level: 0 failed transactions (40001 retried within 10 tries)");
	cmp_ok($bench{processed} // 0, '>', 2 * $KEYS, "$level: the hot keys were hit repeatedly");
	cmp_ok($delta{released_5xx}, '>', 0, "$level: some requests ended in a 503");
	cmp_ok($delta{in_progress}, '>', 0, "$level: concurrent duplicates met (in_progress answers)");
	is($ledger, $stored, "$level: ledger rows = completed keys");
	is($dupes, 0, "$level: 0 keys with two ledger rows");
	is($stored_5xx, 0, "$level: 0 stored 5xx");
	is($final{in_progress} // 0, 0, "$level: 0 keys stuck in progress");
	is(($final{replay} // 0) + ($final{claimed} // 0), $KEYS, "$level: every key replays or is claimable");
	is($final{replay} // 0, $stored, "$level: the stored keys are the ones that replay");
}

done_testing();
