# 1.3 hardening: a role that is not superuser and can read the keys can pg_dump the database, given SELECT on the
# fencing sequence as the README's "Security" section says.
#
# Database appdb (partitioned storage, a few keys, a lease so the fencing sequence has a position) is dumped by
# reader, which has SELECT on the key tables and their partitions. Without SELECT on idempotency_fencing_numbers
# pg_dump stops with "permission denied for sequence" (pg_dump reads the position of every sequence whose
# values it dumps: the extension marks it for the dump). With the documented grant the dump succeeds, and its
# restore into a fresh database (by a superuser) has every key and the sequence's position.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $HASH = 'd' x 64;
my $node = IdemNode->create('dumper');
my $dir = PostgreSQL::Test::Utils::tempdir;
$node->safe_psql('postgres', 'CREATE ROLE reader LOGIN; CREATE DATABASE appdb; CREATE DATABASE restored');
$node->safe_psql('appdb', qq{
	CREATE EXTENSION idempotency;
	SELECT idem_set_storage('partitioned', interval '6 hours');
	BEGIN;
	SELECT idem_claim('k' || i, '$HASH') FROM generate_series(1, 5) i;
	SELECT idem_complete('k' || i, 200, '{"ok": true}') FROM generate_series(1, 5) i;
	COMMIT;
	SELECT outcome FROM idem_lease('leased', '$HASH', interval '1 hour');});
# What "can read the keys" means: SELECT on the two tables and on every partition (pg_dump reads each), and from
# 1.4 on the tombstones (keys whose response expired).
$node->safe_psql('appdb', q{
	GRANT SELECT ON idempotency_keys, idempotency_keys_partitioned, idempotency_tombstones TO reader;
	DO $$ DECLARE p record; BEGIN
		FOR p IN SELECT inhrelid::regclass AS r FROM pg_inherits
		         WHERE inhparent = 'idempotency_keys_partitioned'::regclass LOOP
			EXECUTE format('GRANT SELECT ON %s TO reader', p.r);
		END LOOP;
	END $$;});

my ($ret, $out, $err);
my @dump = ('pg_dump', '-Fc', '-h', $node->host, '-p', $node->port, '-U', 'reader', '-d', 'appdb');
($ret, $out, $err) = (0, '', '');
{
	my $ok = IPC::Run::run([ @dump, '-f', "$dir/without.dump" ], '>', \$out, '2>', \$err);
	ok(!$ok, 'without SELECT on the fencing sequence, pg_dump as reader fails');
	like($err, qr/permission denied for sequence idempotency_fencing_numbers/, 'and says which grant is missing');
}
$node->safe_psql('appdb', 'GRANT SELECT ON SEQUENCE idempotency_fencing_numbers TO reader');
{
	my $ok = IPC::Run::run([ @dump, '-f', "$dir/with.dump" ], '>', \$out, '2>', \$err);
	ok($ok, 'with the documented grant, pg_dump as reader succeeds') or diag($err);
}
my $restore_ok = IPC::Run::run([ 'pg_restore', '-h', $node->host, '-p', $node->port, '-U', 'postgres',
	'-d', 'restored', '--exit-on-error', "$dir/with.dump" ], '>', \$out, '2>', \$err);
ok($restore_ok, 'the dump restores') or diag($err);
is($node->safe_psql('restored', q{SELECT count(*) FROM idempotency_keys_partitioned}), '6',
	'every key is in the restored database');
is($node->safe_psql('restored', q{SELECT last_value FROM idempotency_fencing_numbers}),
	$node->safe_psql('appdb', q{SELECT last_value FROM idempotency_fencing_numbers}),
	"and the fencing sequence's position");
$node->stop;
done_testing();
