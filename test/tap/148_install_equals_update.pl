# A fresh 1.4 install and a database updated 1.0 -> 1.1 -> 1.2 -> 1.3 -> 1.4 have identical objects: the schema that
# pg_dump --binary-upgrade writes member by member (definitions, columns, comments, privileges, the extension's
# configuration tables), with OIDs, transaction ids and pg_dump's random \restrict key taken out.
# Fails on: an update script that misses or adds anything a fresh install has (a comment, a grant, a function
# body, a column, its order), or the other way round.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $node = IdemNode->create('install_equals_update');

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', 'CREATE DATABASE updated');
$node->safe_psql('updated', "CREATE EXTENSION idempotency VERSION '1.0'");
$node->safe_psql('updated', "ALTER EXTENSION idempotency UPDATE TO '1.1'");
$node->safe_psql('updated', "ALTER EXTENSION idempotency UPDATE TO '1.2'");
$node->safe_psql('updated', "ALTER EXTENSION idempotency UPDATE TO '1.3'");
$node->safe_psql('updated', 'ALTER EXTENSION idempotency UPDATE');

is($node->safe_psql($_, "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"), '1.4',
	"$_ is at 1.4") for qw(fresh updated);

sub schema_of
{
	my ($db) = @_;
	my ($stdout, $stderr);
	IPC::Run::run([ 'pg_dump', '--binary-upgrade', '--schema-only', '-d', $node->connstr($db) ],
		'>', \$stdout, '2>', \$stderr)
	  or die "pg_dump $db failed: $stderr";
	my @lines;
	for (split /\n/, $stdout)
	{
		next if /^\\(un)?restrict / || /binary_upgrade_set_next_/ || /relfrozenxid|relminmxid/
		  || /^WHERE oid = / || /^-- (Dumped|Name:)/ || /^$/;
		# The configuration tables' OIDs differ; their number and filters do not.
		s/(binary_upgrade_create_empty_extension\('idempotency', '[^']*', \w+, '[^']*', )'\{[0-9,]*\}'/$1'{oids}'/;
		push @lines, $_;
	}
	return join("\n", @lines);
}

my $fresh = schema_of('fresh');
my $updated = schema_of('updated');
cmp_ok(length($fresh), '>', 10000, 'pg_dump wrote the extension member by member');
like($fresh, qr/CREATE FUNCTION public\.idem_storage_mode\(\).*?BEGIN ATOMIC/s,
	'the dump carries the function definitions');
my @diff = grep { $_ } map {
	my @f = split /\n/, $fresh;
	my @u = split /\n/, $updated;
	my $n = @f > @u ? @f : @u;
	map { ($f[$_] // '') ne ($u[$_] // '') ? "line $_: fresh <$f[$_]> updated <$u[$_]>" : undef } 0 .. $n - 1
} 1;
is(scalar(@diff), 0, 'a fresh 1.4 install and 1.0 -> 1.1 -> 1.2 -> 1.3 -> 1.4 dump the same schema')
  or diag(join("\n", @diff[0 .. ($#diff < 9 ? $#diff : 9)]));

$node->stop;
done_testing();
