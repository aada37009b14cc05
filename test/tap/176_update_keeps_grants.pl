# ALTER EXTENSION idempotency UPDATE from 1.3 to the newest keeps what a DBA built on the extension (issue 38):
# every grant made on an object of the extension (EXECUTE on each function, SELECT on each table, view and
# sequence) to a role, in one database; in another, the same and a view of the DBA's own on idem_stats, granted
# to that role. After the update every object is still there with the same grant and the role reads through
# the view.
# Fails on: an update step that drops and makes again a view or function a user may have granted or built on,
# as the frozen 1.2 -> 1.3 step did with idem_stats and idem_stats_read (the grants lost; with the user's view
# in place that update failed). With IDEM_GRANTS_FROM=1.2 IDEM_GRANTS_TO=1.3 in the environment this test runs
# that step and fails: "function idem_stats_read(), view idem_stats" lost their grants.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $from = $ENV{IDEM_GRANTS_FROM} || '1.3';
my $to = $ENV{IDEM_GRANTS_TO} || '';

my $node = IdemNode->new('grants');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\nlog_statement = none\n");
$node->start;

# Every member of the extension a grant can be made on, with the role's privilege on it, one line each.
my $grants = q{
	SELECT pg_catalog.string_agg(d.description || ': ' || d.privilege, E'\n' ORDER BY d.description)
	FROM (SELECT pg_catalog.pg_describe_object(dep.classid, dep.objid, 0) AS description,
	             CASE WHEN dep.classid = 'pg_catalog.pg_proc'::regclass
	                  THEN pg_catalog.has_function_privilege('dba_reader', dep.objid, 'EXECUTE')::text
	                  ELSE pg_catalog.has_table_privilege('dba_reader', dep.objid, 'SELECT')::text END AS privilege
	      FROM pg_catalog.pg_depend dep
	      WHERE dep.refclassid = 'pg_catalog.pg_extension'::regclass AND dep.deptype = 'e'
	        AND dep.refobjid = (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'idempotency')
	        AND (dep.classid = 'pg_catalog.pg_proc'::regclass
	             OR (dep.classid = 'pg_catalog.pg_class'::regclass
	                 AND (SELECT relkind FROM pg_catalog.pg_class WHERE oid = dep.objid) IN ('r', 'p', 'v', 'S')))) d
};
my $grant_all = q{
	DO $$
	DECLARE
	    object record;
	BEGIN
	    FOR object IN
	        SELECT dep.classid, dep.objid FROM pg_catalog.pg_depend dep
	        WHERE dep.refclassid = 'pg_catalog.pg_extension'::regclass AND dep.deptype = 'e'
	          AND dep.refobjid = (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'idempotency')
	    LOOP
	        IF object.classid = 'pg_catalog.pg_proc'::regclass THEN
	            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO dba_reader', object.objid::regprocedure);
	        ELSIF object.classid = 'pg_catalog.pg_class'::regclass
	              AND (SELECT relkind FROM pg_catalog.pg_class WHERE oid = object.objid) IN ('r', 'p', 'v', 'S') THEN
	            EXECUTE pg_catalog.format('GRANT SELECT ON %s TO dba_reader', object.objid::regclass);
	        END IF;
	    END LOOP;
	END $$;
};
$node->safe_psql('postgres', 'CREATE ROLE dba_reader LOGIN');

# grants: the grants only; view: the grants and the DBA's view on idem_stats.
for my $db ('grants', 'view')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	my $sql = sub { return scalar $node->safe_psql($db, $_[0]); };
	my $as_reader = sub { return scalar $node->safe_psql($db, $_[0], extra_params => [ '-U', 'dba_reader' ]); };

	$sql->("CREATE EXTENSION idempotency VERSION '$from'");
	is($sql->("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"), $from, "$db: installed at $from");
	$sql->($grant_all);
	if ($db eq 'view')
	{
		$sql->('CREATE VIEW dba_stats AS SELECT claims, replays, keys_removed FROM idem_stats;
		        GRANT SELECT ON dba_stats TO dba_reader');
		is($as_reader->('SELECT count(*) FROM dba_stats'), '1', "$db: the role reads the view built on idem_stats");
	}
	my $before = $sql->($grants);
	unlike($before, qr/: false$/m, "$db: before the update the role has its grant on every object");
	like($before, qr/^view idem_stats: true$/m, "$db: among them SELECT on idem_stats");
	like($before, qr/^function idem_stats_read\(\): true$/m, "$db: and EXECUTE on idem_stats_read()");

	my ($rc, $out, $err) = $node->psql($db, $to eq '' ? 'ALTER EXTENSION idempotency UPDATE'
		: "ALTER EXTENSION idempotency UPDATE TO '$to'");
	is($rc, 0, "$db: ALTER EXTENSION idempotency UPDATE from $from succeeds") or diag($err);
	isnt($sql->("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"), $from,
		"$db: the extension was updated");

	# Objects the update adds have no grant yet; every object that was there keeps its own.
	my %after = map { /^(.*): (\w+)$/ ? ($1 => $2) : () } split /\n/, $sql->($grants);
	my @lost = grep { ($after{$_} // 'gone') ne 'true' } map { /^(.*): true$/ ? $1 : () } split /\n/, $before;
	is(join(', ', @lost), '', "$db: every object granted before the update is still there with its grant");
	is($as_reader->('SELECT count(*) FROM idem_stats'), '1', "$db: the role reads idem_stats");
	is($as_reader->('SELECT count(*) FROM dba_stats'), '1', "$db: the role still reads the view built on idem_stats")
	  if $db eq 'view';
}

done_testing();
