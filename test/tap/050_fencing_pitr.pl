# Fencing numbers after a point-in-time recovery to a moment before some grants (issue 38), in both storage
# modes: leases on 20 keys are granted and taken over around a base backup; a restore point is made; then the
# keys are taken over three times more and 10 new keys are leased (grants the recovery loses while their holders
# still run). A new node recovers from the base backup and the archive to the restore point and is promoted.
# Every takeover there, and every lease of a key the recovery lost, must get a number above every number any
# grant of that key got, on either node.
# Fails on 1.3: the recovered sequence is at most 32 values past its position at the restore point, so the
# recovered node hands the lost grants' numbers again.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my @keys = map { "k$_" } 1 .. 20;
my @new_keys = map { "n$_" } 1 .. 10;
my @modes = ('table', 'partitioned');

my $old = IdemNode->create('pitr_old', { has_archiving => 1, allows_streaming => 1 });
my %handed;
for my $mode (@modes)
{
	$old->safe_psql('postgres', "CREATE DATABASE db_$mode");
	$old->safe_psql("db_$mode", 'CREATE EXTENSION idempotency');
	$old->safe_psql("db_$mode", "SELECT idem_set_storage('partitioned', '1 hour')") if $mode eq 'partitioned';
}
my $record = sub
{
	my ($mode, $got) = @_;
	push @{ $handed{$mode}{$_} }, $got->{$_} for keys %$got;
};
$record->($_, $old->lease_round("db_$_", \@keys)) for @modes;
$old->backup('base');
$record->($_, $old->lease_round("db_$_", \@keys)) for @modes;
$old->safe_psql('postgres', "SELECT pg_create_restore_point('before_lost')");

# Lost by the recovery: their holders still run.
for my $mode (@modes)
{
	$record->($mode, $old->lease_round("db_$mode", \@keys)) for 1 .. 3;
	$record->($mode, $old->lease_round("db_$mode", \@new_keys));
}
my $last_wal = $old->safe_psql('postgres', 'SELECT pg_walfile_name(pg_current_wal_lsn())');
$old->safe_psql('postgres', 'SELECT pg_switch_wal()');
ok($old->poll_query_until('postgres',
		"SELECT last_archived_wal IS NOT NULL AND last_archived_wal >= '$last_wal' FROM pg_stat_archiver"),
	'the WAL up to the last grant is archived');
$old->stop;

my $new = IdemNode->new('pitr_new');
$new->init_from_backup($old, 'base', has_restoring => 1);
$new->append_conf('postgresql.conf',
	"recovery_target_name = 'before_lost'\nrecovery_target_action = 'promote'\n");
$new->start;
ok($new->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'), 'recovered to the restore point and promoted');

for my $mode (@modes)
{
	my $db = "db_$mode";
	is($new->safe_psql($db, "SELECT (SELECT count(*) FROM idempotency_keys WHERE key LIKE 'n%')"
			. " + (SELECT count(*) FROM idempotency_keys_partitioned WHERE key LIKE 'n%')"), '0',
		"$mode: the recovery lost the new keys' grants");
	my $takeovers = $new->lease_round($db, \@keys);
	is(fencing_not_above($handed{$mode}, $takeovers), '',
		"$mode: every takeover after the recovery is above every number handed for its key");
	is(fencing_not_above($handed{$mode}, $new->lease_round($db, \@new_keys)), '',
		"$mode: a key whose grants the recovery lost gets a number above theirs");
	$record->($mode, $takeovers);
	is(fencing_not_above($handed{$mode}, $new->lease_round($db, \@keys)), '', "$mode: and rise again at the next takeover");
}

$new->stop;
done_testing();
