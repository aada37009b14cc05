# 1.3 hardening: a database whose SQL objects are older than the library hands nobody superuser.
#
# Database oldb is owned by mallory, a role that is not superuser; a superuser made the extension there at 1.1
# (partitioned storage) and the cluster runs the 1.3 library, as during the README's one-database-at-a-time
# update. mallory renames the extension's schema (public, which the database owner owns), makes a new schema of
# the old name with look-alikes of the functions 1.1's PL/pgSQL bodies call by name (idem_storage_mode(),
# idem_partitions(), idem_create_partition(), ...), each recording its caller and trying ALTER ROLE mallory
# SUPERUSER, and plants a sequence named like the fencing sequence (which 1.1 does not have) in the real schema.
# Then the worker sweeps oldb, a superuser calls idem_cleanup(), and an application takes a lease.
# Checks: mallory never becomes superuser, no look-alike ever runs, the planted sequence is never advanced, the
# log says why partition upkeep was refused (naming ALTER EXTENSION idempotency UPDATE), the expired keys outside
# partitions are still removed, and after the update the worker makes partitions again.
# Fails on 1.2: the worker ran 1.1's idem_premake_partitions as the (superuser) table owner, which called
# mallory's idem_storage_mode(): mallory became superuser; and the library took nextval() of the planted sequence.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $HASH = 'd' x 64;
my $node = IdemNode->create('mixed', "idempotency.databases = ''", 'idempotency.cleanup_interval = 1s');

$node->safe_psql('postgres', 'CREATE ROLE mallory LOGIN; CREATE DATABASE oldb OWNER mallory');
$node->safe_psql('oldb', q{
	CREATE EXTENSION idempotency VERSION '1.1';
	SELECT idem_set_storage('partitioned', interval '1 hour');});
$node->safe_psql('oldb', qq{
	INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash)
	SELECT now() - interval '1 day', now() - interval '2 days', 200, '', 'old' || i, decode('$HASH', 'hex')
	FROM generate_series(1, 5) i;});
is($node->safe_psql('oldb', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), '1.1',
	'oldb is at 1.1');

# mallory's move, as mallory.
my $planted = join "\n", map {
	my ($signature, $returns, $value) = @$_;
	qq{CREATE FUNCTION public.$signature RETURNS $returns LANGUAGE plpgsql AS \$f\$
	BEGIN
		INSERT INTO public.calls VALUES ('$signature', current_user, session_user);
		BEGIN
			EXECUTE 'ALTER ROLE mallory SUPERUSER';
		EXCEPTION WHEN OTHERS THEN NULL;
		END;
		RETURN $value;
	END \$f\$;
	GRANT EXECUTE ON FUNCTION public.$signature TO PUBLIC;}
} (['idem_storage_mode()', 'text', q{'partitioned'}],
   ['idem_partitions(OUT partition_name name, OUT lower_bound timestamptz, OUT upper_bound timestamptz)',
	'SETOF record', 'NEXT'],
   ['idem_create_partition(lower_bound timestamptz, upper_bound timestamptz)', 'name', q{'x'}],
   ['idem_premake_partitions()', 'integer', '0'],
   ['idem_keys_in_flight_claims(OUT scope text, OUT key text, OUT pid integer, OUT since timestamptz)',
	'SETOF record', 'NEXT']);
$planted =~ s/RETURN NEXT;/RETURN;/g;
$node->psql('oldb', qq{
	SET ROLE mallory;
	ALTER SCHEMA public RENAME TO tenant_data;
	CREATE SCHEMA public;
	CREATE TABLE public.calls (function text, by_user text, by_session text);
	GRANT INSERT ON public.calls TO PUBLIC;
	$planted
	CREATE SEQUENCE tenant_data.idempotency_fencing_numbers;}, on_error_die => 1);
is($node->safe_psql('postgres', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'}), 'f',
	'mallory is not superuser before');

my $log_from = -s $node->logfile;
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = 'oldb'; SELECT pg_reload_conf()});
my $deleted = $node->wait_until('oldb', q{
	SELECT NOT EXISTS (SELECT FROM tenant_data.idempotency_keys_partitioned WHERE key LIKE 'old%')}, 60);
ok(defined $deleted, 'the worker still removes the expired keys in the default partition');
# Two more sweeps at least.
my $mark = $node->safe_psql('postgres', 'SELECT now()');
$node->wait_until('oldb', qq{SELECT last_sweep_started_at > '$mark'::timestamptz + interval '2 s'
	FROM tenant_data.idem_stats}, 60);

# A superuser's idem_cleanup() and an application's lease in the 1.1 database under the 1.3 library.
$node->safe_psql('oldb', 'SELECT tenant_data.idem_cleanup()');
my ($ret, $out, $err) = $node->psql('oldb', qq{SELECT outcome FROM tenant_data.idem_lease('k1', '$HASH', interval '1 minute')});
diag("idem_lease in oldb: $ret '$out' $err");

is($node->safe_psql('postgres', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'}), 'f',
	'mallory never becomes superuser');
is($node->safe_psql('oldb', q{SELECT count(*) FROM public.calls}), '0', 'no look-alike ever ran')
  or diag($node->safe_psql('oldb', 'SELECT * FROM public.calls'));
is($node->safe_psql('oldb', q{SELECT is_called FROM tenant_data.idempotency_fencing_numbers}), 'f',
	'the planted sequence was never advanced');
cmp_ok($node->log_lines($log_from,
		qr/in database "oldb", the extension's SQL objects are at version 1\.1 and the library at 1\.4: partitions are neither made nor dropped until ALTER EXTENSION idempotency UPDATE/),
	'>=', 1, 'the log says why partition upkeep is refused, and what to run');
like($node->safe_psql('oldb', 'SELECT last_error FROM tenant_data.idem_stats'), qr/ALTER EXTENSION idempotency UPDATE/,
	'idem_stats.last_error says it too');

# The update makes the real fencing sequence: a relation of that name makes it fail (CREATE, never adoption), so
# the superuser drops mallory's first. Then partitions are made again: with a longer ttl, more of them.
($ret, $out, $err) = $node->psql('oldb', q{ALTER EXTENSION idempotency UPDATE});
like($err, qr/relation "idempotency_fencing_numbers" already exists/, "the update does not adopt mallory's sequence");
$node->safe_psql('oldb', q{DROP SEQUENCE tenant_data.idempotency_fencing_numbers; ALTER EXTENSION idempotency UPDATE});
is($node->safe_psql('oldb', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}), '1.4',
	'oldb is at 1.4');
my $before = $node->safe_psql('oldb', 'SELECT count(*) FROM tenant_data.idem_partitions()');
$node->safe_psql('postgres', q{ALTER DATABASE oldb SET idempotency.ttl = '30h'});
my $made = $node->wait_until('oldb', "SELECT count(*) > $before FROM tenant_data.idem_partitions()", 60);
ok(defined $made, 'after ALTER EXTENSION ... UPDATE the worker makes partitions again');
is($node->safe_psql('postgres', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'}), 'f',
	'and mallory is still not superuser');
is($node->safe_psql('oldb', q{SELECT count(*) FROM public.calls}), '0', 'and no look-alike ran');

$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = ''; SELECT pg_reload_conf()});
is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, 'no process crashed');
$node->stop;
done_testing();
