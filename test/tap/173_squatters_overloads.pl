# 1.3 hardening: a domain squatter and overloads leave partition upkeep working.
#
# Partitioned storage with 1-hour partitions. A role with CREATE on the extension's schema (public here) makes a
# domain named like the next partition the worker will make (a table's name is taken in pg_type too, by its row
# type), and overloads, each with a defaulted extra argument, of the functions the upkeep used to call by name:
# idem_partitions(), idem_create_partition(timestamptz, timestamptz), idem_storage_mode(),
# idem_keys_in_flight_claims(). Each overload records that it ran. A longer idempotency.ttl then makes the
# worker make partitions, the first name squatted; an expired partition and expired keys in the default
# partition wait to be removed.
# Checks: partitions past the squatted name are made (under another name for the squatted one), the expired
# partition is dropped, the expired keys are deleted, the log names the squatted name, the domain is untouched,
# no overload ran, and the direct SQL calls idem_premake_partitions() and idem_drop_expired_partitions() work.
# Fails on 1.2: only pg_class was checked for the name, so CREATE TABLE failed on the domain's type and no
# partition was made; and the PL/pgSQL upkeep called idem_partitions() by name, which the overload made
# ambiguous (42725), so no partition was made or dropped.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $HASH = 'd' x 64;
my $node = IdemNode->create('overloads', "idempotency.databases = ''", 'idempotency.cleanup_interval = 1s',
	"idempotency.ttl = '1h'");
$node->safe_psql('postgres', 'CREATE ROLE tenant LOGIN; CREATE DATABASE appdb');
$node->safe_psql('appdb', q{
	CREATE EXTENSION idempotency;
	GRANT CREATE ON SCHEMA public TO tenant;
	SELECT idem_set_storage('partitioned', interval '1 hour');});
my $past = $node->safe_psql('appdb', q{
	SELECT idem_create_partition(min(lower_bound) - interval '2 hours', min(lower_bound) - interval '1 hour')
	FROM idem_partitions()});
$node->safe_psql('appdb', qq{
	INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash)
	SELECT lower_bound + interval '30 minutes', lower_bound, 200, '', 'past' || i, decode('$HASH', 'hex')
	FROM idem_partitions(), generate_series(1, 5) i WHERE partition_name = '$past';
	INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash)
	SELECT now() - interval '1 day', now() - interval '2 days', 200, '', 'expired' || i, decode('$HASH', 'hex')
	FROM generate_series(1, 5) i;});
my $newest_upper = $node->safe_psql('appdb', 'SELECT max(upper_bound) FROM idem_partitions()');
my $squatted = $node->safe_psql('appdb', qq{
	SELECT 'idempotency_keys_p' || to_char(timestamptz '$newest_upper' AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS')});

my $record = q{INSERT INTO public.overload_calls VALUES (current_user)};
$node->psql('appdb', qq{
	SET ROLE tenant;
	CREATE TABLE public.overload_calls (by_user text);
	GRANT INSERT ON public.overload_calls TO PUBLIC;
	CREATE DOMAIN public.$squatted AS integer;
	CREATE FUNCTION public.idem_partitions(x integer DEFAULT 0, OUT partition_name name,
		OUT lower_bound timestamptz, OUT upper_bound timestamptz) RETURNS SETOF record
		LANGUAGE plpgsql AS \$\$ BEGIN $record; RETURN; END \$\$;
	CREATE FUNCTION public.idem_create_partition(lower_bound timestamptz, upper_bound timestamptz,
		x integer DEFAULT 0) RETURNS name LANGUAGE plpgsql AS \$\$ BEGIN $record; RETURN 'x'; END \$\$;
	CREATE FUNCTION public.idem_storage_mode(x integer DEFAULT 0) RETURNS text
		LANGUAGE plpgsql AS \$\$ BEGIN $record; RETURN 'table'; END \$\$;
	CREATE FUNCTION public.idem_keys_in_flight_claims(x integer DEFAULT 0, OUT scope text, OUT key text,
		OUT pid integer, OUT since timestamptz) RETURNS SETOF record
		LANGUAGE plpgsql AS \$\$ BEGIN $record; RETURN; END \$\$;}, on_error_die => 1);
diag("newest partition ends at $newest_upper; squatted by a domain: $squatted");


$node->safe_psql('appdb', q{ALTER DATABASE appdb SET idempotency.ttl = '4h'});
my $log_from = -s $node->logfile;
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = 'appdb'; SELECT pg_reload_conf()});

my $expired_gone = $node->wait_until('appdb', q{
	SELECT NOT EXISTS (SELECT FROM idempotency_keys_partitioned WHERE key LIKE 'expired%')}, 60);
ok(defined $expired_gone, 'the expired keys in the default partition are deleted');
my $dropped = $node->wait_until('appdb', qq{
	SELECT to_regclass('public.$past') IS NULL
	   AND NOT EXISTS (SELECT FROM idempotency_keys_partitioned WHERE key LIKE 'past%')}, 60);
ok(defined $dropped, 'the expired partition is dropped');
my $made;
# idem_partitions() itself is ambiguous for an untyped call now: ask the catalog (and the function by OID).
$made = $node->wait_until('appdb', qq{
	SELECT count(*) >= 3 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	WHERE i.inhparent = 'idempotency_keys_partitioned'::regclass
	  AND c.relname >= '$squatted'}, 60);
ok(defined $made, 'partitions from the squatted name on are made');
is($node->safe_psql('appdb', qq{
	SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	WHERE i.inhparent = 'idempotency_keys_partitioned'::regclass AND c.relname LIKE '${squatted}\\_%'}),
	'1', 'the squatted partition is made under another name');
cmp_ok($node->log_lines($log_from, qr/LOG:(?!\s+statement:).*\b\Q$squatted\E\b/), '>=', 1,
	'a LOG line names the squatted name');
is($node->safe_psql('appdb', qq{SELECT typtype FROM pg_type WHERE typname = '$squatted'
	AND typnamespace = 'public'::regnamespace}), 'd', 'the domain is untouched');
# The direct calls, as the owner, with the overloads in place.
my ($ret, $out, $err) = $node->psql('appdb', 'SELECT * FROM idem_drop_expired_partitions()');
is($ret, 0, 'idem_drop_expired_partitions() runs despite the overloads') or diag($err);
($ret, $out, $err) = $node->psql('appdb', 'SELECT idem_premake_partitions()');
is($ret, 0, 'idem_premake_partitions() runs despite the overloads') or diag($err);
is($node->safe_psql('appdb', 'SELECT count(*) FROM public.overload_calls'), '0', 'no overload ever ran');
is($node->log_lines($log_from, qr/42725|is not unique/), 0, 'no call was ambiguous');

$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.databases = ''; SELECT pg_reload_conf()});
is($node->log_lines(0, qr/terminated by signal|PANIC/), 0, 'no process crashed');
$node->stop;
done_testing();
