# Fencing numbers across a blue/green switchover by logical replication (issue 38), in both storage modes: the
# key tables are published (the partitioned one through its root; it and its partitions have no primary key, so
# they get REPLICA IDENTITY FULL) and subscribed to by a second node; leases on 20 keys are granted and taken
# over on the publisher, before and after the initial copy; once the subscriber has caught up the subscription
# is dropped and the keys are taken over there. Every takeover on the new node must get a number above every
# number the old node handed for that key (sequences do not travel with logical replication).
# Fails on 1.3: the new node's sequence starts at 1, so its takeovers get 1..20 where the old node handed more.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my @keys = map { "k$_" } 1 .. 20;

my $blue = IdemNode->create('blue', { allows_streaming => 'logical' });
my $green = IdemNode->create('green', { allows_streaming => 'logical' });

for my $mode ('table', 'partitioned')
{
	my $db = "db_$mode";
	my %handed;
	my $record = sub { my $got = shift; push @{ $handed{$_} }, $got->{$_} for keys %$got; };
	for my $node ($blue, $green)
	{
		$node->safe_psql('postgres', "CREATE DATABASE $db");
		$node->safe_psql($db, 'CREATE EXTENSION idempotency');
		$node->safe_psql($db, "SELECT idem_set_storage('partitioned', '1 hour')") if $mode eq 'partitioned';
	}
	# A partition has no primary key: UPDATEs (takeovers) need a replica identity to be published.
	$blue->safe_psql($db, q{
		SELECT format('ALTER TABLE %s REPLICA IDENTITY FULL', inhrelid::regclass)
		FROM pg_inherits WHERE inhparent = 'idempotency_keys_partitioned'::regclass \gexec
		ALTER TABLE idempotency_keys_partitioned REPLICA IDENTITY FULL;
		CREATE PUBLICATION idem FOR TABLE idempotency_keys, idempotency_keys_partitioned
		    WITH (publish_via_partition_root = true);});
	$record->($blue->lease_round($db, \@keys)) for 1 .. 2;

	my $sub = "green_$mode";
	$green->safe_psql($db, "CREATE SUBSCRIPTION $sub CONNECTION '" . $blue->connstr . " dbname=$db' PUBLICATION idem");
	ok($green->poll_query_until($db, "SELECT bool_and(srsubstate IN ('r', 's')) FROM pg_subscription_rel"),
		"$mode: the initial copy is done");
	$record->($blue->lease_round($db, \@keys)) for 1 .. 3;
	$blue->wait_for_catchup($sub);

	# The switchover: the subscription goes, the green node takes the traffic.
	$green->safe_psql($db, "ALTER SUBSCRIPTION $sub DISABLE");
	$green->safe_psql($db, "ALTER SUBSCRIPTION $sub SET (slot_name = NONE)");
	$green->safe_psql($db, "DROP SUBSCRIPTION $sub");
	$blue->safe_psql($db, "SELECT pg_drop_replication_slot('$sub')");
	is($green->safe_psql($db, "SELECT count(*) FROM idem_keys_in_flight_claims()"), '0', "$mode: no lease held on green");

	my $takeovers = $green->lease_round($db, \@keys);
	is(fencing_not_above(\%handed, $takeovers), '',
		"$mode: every takeover on the new node is above every number the old node handed for its key");
	$record->($takeovers);
	is(fencing_not_above(\%handed, $green->lease_round($db, \@keys)), '', "$mode: and rise again at the next takeover");
}

$blue->stop;
$green->stop;
done_testing();
