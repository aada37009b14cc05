# ALTER EXTENSION idempotency UPDATE from 1.2 to 1.3 keeps every key stored by the 1.2 clients replaying through
# the 1.3 statements (issue 30), in both storage modes. Keys are stored through the clients' 1.2 statements
# (clients/go/idempotency.go claimSQL and completeSQL; Node.js and Python send the same composition) with
# request bodies spelled every way a retry may spell them (key order, white space, escapes, number forms), then
# the database is updated, and each key is claimed again through idem_claim_request with the request's raw
# bytes: the answer is the replay, with the bytes the 1.2 client sent on the first response. Then the 1.3
# completion stores bytes in the updated tables (an insert, the replacement of an expired row, a lease takeover
# of such a row) in both modes.
# Fails on: a fingerprint that differs from 1.2's (mismatch instead of replay), a 1.2 body that does not come
# back as the bytes first sent, an update that misses the columns in either table or in a partition, a bytes
# row that a replacement or lease takeover leaves behind.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use DBI;
use DBD::Pg qw(:pg_types);
use Time::HiRes;
use PostgreSQL::Test::Utils;
use Test::More;

use IdemNode;

my $node = IdemNode->new('update_1_2');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\nlog_statement = none\n");
$node->start;

# The Go client's 1.2 statements, verbatim.
my $claim_1_2 = q{SELECT c.outcome, c.http_status, c.response_body::text, c.response_headers::text
FROM idem_claim($1::text,
                idem_hash(jsonb_build_object('method', $2::text, 'path', $3::text, 'body', $4::jsonb)),
                $5::interval, $6::text) AS c};
my $complete_1_2 = q{SELECT idem_complete($1::text, $2::int, $3::jsonb, $4::jsonb, $5::text), $3::jsonb::text};

# The 1.3 statements as the contract gives them.
my $claim_1_3 = q{SELECT (c).outcome, (c).http_status, (c).content_type, (c).headers::text, (c).body
FROM (SELECT idem_claim_request($1, $2, $3, $4, $5, $6, $7) AS c) AS s};
my $complete_1_3 = q{SELECT idem_complete_request($1, $2, $3, $4, $5, $6)};

# Request bodies as clients send them: one payment, spelled many ways.
sub request_body
{
	my ($i) = @_;
	my @spellings = (
		qq({"amount_cents": $i, "currency": "EUR"}),
		qq({"currency":"EUR","amount_cents":$i}),
		qq(  {\n\t"amount_cents" : $i ,\r\n "currency" : "\\u0045UR" }  ),
		qq({"amount_cents": $i.0, "currency": "EUR", "note": "caf\\u00e9 \\ud83d\\ude00 é \\"q\\" \\/"}),
		qq({"amount_cents": ${i}e0, "currency": "EUR", "meta": {"b": [1, 1e2, -0, 0.50], "a": null}}),
		qq({"amount_cents": 1, "amount_cents": $i, "currency": "EUR", "tags": ["x", {"z": true, "y": false}]}),
		qq({"amount_cents": $i, "currency": "EUR", "memo": "line\\nbreak\\ttab\\u001f"}),
	);
	return $spellings[$i % @spellings];
}

my %databases = (plain => 'table', parted => 'partitioned');
my $keys = 140;

for my $db (sort keys %databases)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION idempotency VERSION '1.2'");
	$node->safe_psql($db, "SELECT idem_set_storage('partitioned', '1 hour')")
	  if $databases{$db} eq 'partitioned';
	is($node->safe_psql($db, 'SELECT idem_storage_mode()'), $databases{$db}, "$db: $databases{$db} storage at 1.2");

	my $dbh = DBI->connect($node->dsn(dbname => $db), undef, undef,
		{ AutoCommit => 1, RaiseError => 1, PrintError => 0, pg_enable_utf8 => 0 });
	my %sent;    # key => the first response's bytes, as the 1.2 client sent them
	for my $i (1 .. $keys)
	{
		my ($key, $account) = ("pay-$i", 'acct_' . ($i % 3));
		$dbh->begin_work;
		my ($outcome) = $dbh->selectrow_array($claim_1_2, undef, $key, 'POST', '/payments', request_body($i),
			undef, $account);
		die "claim $key: $outcome" unless $outcome eq 'claimed';
		my $response = qq({"payment_id":$i,"account":"$account","amount_cents":$i,"currency":"EUR","note":"\\u00e9"});
		my ($stored, $text) = $dbh->selectrow_array($complete_1_2, undef, $key, 201, $response,
			qq({"Content-Type": "application/json", "Location": "/payments/$i"}), $account);
		$dbh->commit;
		$sent{$key} = $text;
	}
	is(scalar(keys %sent), $keys, "$db: $keys keys stored through the 1.2 client statements");
	$dbh->disconnect;

	$node->safe_psql($db, "ALTER EXTENSION idempotency UPDATE TO '1.3'");
	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"), '1.3',
		"$db: updated to 1.3");
	is($node->safe_psql($db, 'SELECT idem_storage_mode()'), $databases{$db}, "$db: storage mode kept");
	is($node->safe_psql($db, q{SELECT count(*) FILTER (WHERE NOT EXISTS (SELECT FROM pg_attribute a
		WHERE a.attrelid = c.oid AND a.attname IN ('response_bytes', 'response_content_type') AND NOT a.attisdropped
		HAVING count(*) = 2)) || ' of ' || count(*)
		FROM pg_class c WHERE c.relname LIKE 'idempotency_keys%' AND c.relkind IN ('r', 'p')}),
		$databases{$db} eq 'partitioned' ? '0 of ' . $node->safe_psql($db,
			q{SELECT count(*) FROM pg_class WHERE relname LIKE 'idempotency_keys%' AND relkind IN ('r', 'p')}) : '0 of 3',
		"$db: every key table and partition has the 1.3 columns");

	$dbh = DBI->connect($node->dsn(dbname => $db), undef, undef,
		{ AutoCommit => 1, RaiseError => 1, PrintError => 0, pg_enable_utf8 => 0 });
	my $claim = $dbh->prepare($claim_1_3);
	my (%outcomes, @wrong);
	for my $i (1 .. $keys)
	{
		my ($key, $account) = ("pay-$i", 'acct_' . ($i % 3));
		# The request as it arrived: its bytes; with and without its content type (both are JSON).
		for my $content_type ('application/json', undef)
		{
			$dbh->begin_work;
			$claim->bind_param(1, $key);
			$claim->bind_param(2, $account);
			$claim->bind_param(3, 'POST');
			$claim->bind_param(4, '/payments');
			$claim->bind_param(5, undef);
			$claim->bind_param(6, $content_type);
			$claim->bind_param(7, request_body($i), { pg_type => PG_BYTEA });
			$claim->execute;
			my ($outcome, $status, $type, $headers, $body) = $claim->fetchrow_array;
			$dbh->rollback;
			$outcomes{$outcome}++;
			push @wrong, "$key: $outcome $status <" . ($body // 'NULL') . "> sent <$sent{$key}>"
			  unless $outcome eq 'replay' && $status == 201 && defined $body && $body eq $sent{$key}
			  && !defined $type
			  # 1.4 (rule key-lifetime): the stored headers, then the key's expiry the server adds
			  && index($headers, qq({"Location": "/payments/$i", "Content-Type": "application/json", "Idempotency-Key-Expires": ")) == 0
			  && $headers =~ /"Idempotency-Key-Expires": "(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT"\}$/;
		}
	}
	is_deeply(\%outcomes, { replay => 2 * $keys }, "$db: every 1.2 key replays through idem_claim_request");
	is_deeply(\@wrong, [], "$db: ... with the status, headers and the body bytes the 1.2 client sent");

	# A retry with a query string or another body is another request.
	is($node->safe_psql($db, q{SELECT (idem_claim_request('pay-1', 'acct_1', 'POST', '/payments', 'ref=2',
		'application/json', convert_to('{"amount_cents": 1, "currency": "EUR"}', 'UTF8'))).outcome}),
		'mismatch', "$db: the same key with a query string is a mismatch");
	is($node->safe_psql($db, q{SELECT (idem_claim_request('pay-1', 'acct_1', 'POST', '/payments', NULL,
		'application/json', convert_to('{"amount_cents": 2, "currency": "EUR"}', 'UTF8'))).outcome}),
		'mismatch', "$db: the same key with another body is a mismatch");
	# The 1.2 statements still work on the updated database, for a key stored by 1.3 as well.
	$dbh->begin_work;
	$claim->execute('new-1', 'acct_1', 'POST', '/payments', undef, 'application/json', '{"amount_cents": 9}');
	is(($claim->fetchrow_array)[0], 'claimed', "$db: a new key is claimed through idem_claim_request");
	my ($ok) = $dbh->selectrow_array($complete_1_3, undef, 'new-1', 'acct_1', 201, 'application/json',
		'{"Location": "/payments/9"}', '{"payment_id":9}');
	$dbh->commit;
	is($ok, 1, "$db: and completed with bytes");
	is(join('|', $dbh->selectrow_array($claim_1_2, undef, 'new-1', 'POST', '/payments', '{"amount_cents":9}', undef, 'acct_1')),
		'replay|201|{"payment_id": 9}|{"Location": "/payments/9"}',
		"$db: the 1.2 client statement replays a bytes key (JSON body as jsonb)");

	# An expired bytes row is replaced by a new completion, and a lease takeover clears it.
	my $table = $databases{$db} eq 'partitioned' ? 'idempotency_keys_partitioned' : 'idempotency_keys';
	for my $step (['exp-1', 'text/plain', 'first'], ['exp-1', 'text/html', '<b>second</b>'])
	{
		$dbh->begin_work;
		$dbh->do(q{SELECT idem_claim_request($1, '', 'POST', '/e', NULL, 'text/plain', 'x', interval '1 millisecond')},
			undef, $step->[0]);
		$dbh->do($complete_1_3, undef, $step->[0], '', 200, $step->[1], undef, $step->[2]);
		$dbh->commit;
		Time::HiRes::sleep(0.05);
	}
	is($node->safe_psql($db, qq{SELECT response_content_type || ' ' || convert_from(response_bytes, 'UTF8') || ' '
		|| count(*) OVER () FROM $table WHERE key = 'exp-1' ORDER BY expires_at DESC LIMIT 1}) =~ s/ \d+$//r,
		'text/html <b>second</b>', "$db: an expired bytes row is replaced by the new completion's bytes");
	$node->safe_psql($db, q{SELECT idem_lease('exp-1', idem_fingerprint('POST', '/e', NULL, 'text/plain', 'x'), '1 min')});
	is($node->safe_psql($db, qq{SELECT count(*) FILTER (WHERE response_bytes IS NOT NULL OR response_content_type IS NOT NULL)
		|| ' of ' || count(*) FROM $table WHERE key = 'exp-1' AND lease_token IS NOT NULL}), '0 of 1',
		"$db: a lease taking an expired bytes row over clears its bytes");
	$dbh->disconnect;
}

done_testing();
