# Install script: an unprivileged user with CREATE on public pre-creates, one at a time,
# an object with the name (and, for functions, the signature) of each object the
# extension installs there. A superuser's CREATE EXTENSION must then fail instead of
# adopting it. The list is read from a real installation, so new objects are covered.
# Fails on: CREATE EXTENSION succeeding over an impostor (CREATE OR REPLACE or IF NOT
# EXISTS in the script), an impostor becoming a member of the extension, or a clean
# database where CREATE EXTENSION does not work (the control case).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $node = IdemNode->create('install');

# Impostors for every object in the extension's schema after a clean install: relations
# (tables, partitions, indexes, views: their names share one namespace, so a table
# stands in for each) and functions with the same argument types. Not the indexes that
# partitions inherit: PostgreSQL names those itself, skipping names already taken.
my @impostors = split /\n/, $node->safe_psql('postgres', q{
	SELECT format('CREATE TABLE public.%I (impostor int)', c.relname)
	FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND NOT (c.relkind = 'i' AND c.relispartition)
	UNION ALL
	SELECT format('CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
	              p.proname, pg_get_function_arguments(p.oid),
	              -- The extension's own row types do not exist before it is installed.
	              CASE WHEN t.typtype = 'c' THEN 'record' ELSE pg_get_function_result(p.oid) END,
	              'BEGIN RAISE EXCEPTION ''impostor''; END')
	FROM pg_proc p JOIN pg_type t ON t.oid = p.prorettype
	WHERE p.pronamespace = 'public'::regnamespace
	ORDER BY 1});
my $functions = grep { /^CREATE FUNCTION/ } @impostors;
cmp_ok($functions, '>=', 6, "found the extension's functions ($functions)");
cmp_ok(@impostors - $functions, '>=', 3, 'found its relations (' . (@impostors - $functions) . ')');

$node->safe_psql('postgres', q{
	CREATE ROLE mallory LOGIN;
	CREATE DATABASE victim;});
$node->safe_psql('victim', 'GRANT CREATE ON SCHEMA public TO mallory');

my (@adopted, @errors);
for my $impostor (@impostors)
{
	my ($name) = $impostor =~ /public\.("?[\w]+"?)/;
	$node->safe_psql('victim', "SET ROLE mallory; $impostor");
	my ($ret, $out, $err) = $node->psql('victim', 'CREATE EXTENSION idempotency');
	my $state = $node->safe_psql('victim', q{
		SELECT (SELECT count(*) FROM pg_extension WHERE extname = 'idempotency')
		     + (SELECT count(*) FROM pg_depend WHERE deptype = 'e'
		        AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency'))});
	push @adopted, $name if $ret == 0 || $state != 0;
	$err =~ s/^.*ERROR:\s*//s;
	push @errors, "$name: " . (split /\n/, $err)[0];
	$node->safe_psql('victim', 'DROP EXTENSION IF EXISTS idempotency CASCADE') if $ret == 0;
	$node->safe_psql('victim', 'DROP OWNED BY mallory; GRANT CREATE ON SCHEMA public TO mallory');
}
diag('install_script: CREATE EXTENSION over each impostor: ' . join('; ', @errors));
is(scalar(@adopted), 0, 'CREATE EXTENSION fails over every one of ' . scalar(@impostors) . ' impostors')
  or diag("adopted: @adopted");
# CREATE OR REPLACE (extension/functions.sql) meets an impostor with "is not a member of extension".
ok(!grep({ !/already exists|is not a member of extension "idempotency"/ } @errors),
	'each failure is an "already exists" or "not a member" conflict');

# Control: the same database without impostors installs.
my ($ret, $out, $err) = $node->psql('victim', 'CREATE EXTENSION idempotency');
is($ret, 0, 'control: CREATE EXTENSION succeeds once the impostors are gone') or diag($err);

done_testing();
