# Fencing numbers after an older dump is restored (issue 38), in both storage modes: leases on 20 keys are
# granted and taken over, the database is dumped, the keys are taken over twice more and 10 new keys are leased
# (the holders of those grants still run), and the older dump is restored into a new database. Every takeover
# there, and every lease of a key the dump never saw, must get a number above every number any grant of that
# key got, on either database.
# Fails on 1.3: the restored sequence's position is the dump's, so the restored database hands the numbers of the
# grants made after the dump again (the new keys' and the takeovers' alike).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

use IdemNode;

my $node = IdemNode->create('older_dump');
my $dump_dir = PostgreSQL::Test::Utils::tempdir;
my @keys = map { "k$_" } 1 .. 20;
my @new_keys = map { "n$_" } 1 .. 10;

for my $mode ('table', 'partitioned')
{
	my $db = "db_$mode";
	my %handed;
	my $record = sub { my $got = shift; push @{ $handed{$_} }, $got->{$_} for keys %$got; };
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	$node->safe_psql($db, "SELECT idem_set_storage('partitioned', '1 hour')") if $mode eq 'partitioned';
	$record->($node->lease_round($db, \@keys)) for 1 .. 2;

	my $file = "$dump_dir/$db.dump";
	$node->command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr($db), '-f', $file ], "$mode: pg_dump");

	# After the dump: more takeovers and new keys, whose holders still run when the older dump comes back.
	$record->($node->lease_round($db, \@keys)) for 1 .. 2;
	$record->($node->lease_round($db, \@new_keys));

	$node->safe_psql('postgres', "CREATE DATABASE ${db}_old");
	$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr("${db}_old"), $file ],
		"$mode: the older dump restores");
	is($node->safe_psql("${db}_old", 'SELECT idem_storage_mode()'), $mode, "$mode: restored in $mode storage");

	my $takeovers = $node->lease_round("${db}_old", \@keys);
	is(fencing_not_above(\%handed, $takeovers), '',
		"$mode: every takeover on the restored database is above every number handed for its key");
	my $fresh = $node->lease_round("${db}_old", \@new_keys);
	is(fencing_not_above(\%handed, $fresh), '',
		"$mode: a key granted only after the dump gets a number above the lost grants' on the restored database");
	$record->($takeovers);
	# Numbers keep rising per key on the restored database.
	is(fencing_not_above(\%handed, $node->lease_round("${db}_old", \@keys)), '', "$mode: and rise again at the next takeover");
}

$node->stop;
done_testing();
