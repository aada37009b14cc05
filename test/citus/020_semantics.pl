# The guarantees on Citus, from every node: new key, replay, mismatch, 5xx not stored, rollback, one key in two
# scopes, bound parameters, in_progress at once while a transaction on the owner holds the key (and
# idem_keys_in_flight() on the coordinator showing it), a call that was not delegated refused where it runs,
# lease mode with a takeover, and post_payment (claim, debit and completion in one delegated transaction).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use IdemNode;

my @nodes = IdemNode->citus_cluster('semantics', 2);
my ($coordinator, $worker1, $worker2) = @nodes;
sub sql { my ($node, $statements) = @_; return scalar $node->safe_psql('app', $statements); }
sub name_of { return $_[0]->{citus_name}; }
sub hash_of { return "idem_hash('$_[0]'::text)"; }

# A key stored before distributing, local on the coordinator until idem_citus_distribute moves it.
sql($coordinator, q{BEGIN; SELECT outcome FROM idem_claim('pre-1', idem_hash('a'::text), NULL, 'acct-1');
	SELECT idem_complete('pre-1', 201, '{"pre": 1}', NULL, 'acct-1'); COMMIT});
$coordinator->citus_distribute;

# Two accounts, one on each worker.
my %account_on;
for my $i (1 .. 40)
{
	$account_on{ name_of($coordinator->citus_node_of(\@nodes, 'accounts', "acct-$i")) } //= "acct-$i";
	last if $account_on{worker1} && $account_on{worker2};
}
my ($a1, $a2) = @account_on{qw(worker1 worker2)};
note("accounts: $a1 on worker1, $a2 on worker2");

is(sql($worker2, "SELECT outcome || '|' || http_status FROM idem_claim('pre-1', ${\ hash_of('a')}, NULL, 'acct-1')"),
	'replay|201', 'a key stored before distributing replays after it');
sql($coordinator, "DELETE FROM idempotency_keys WHERE key = 'pre-1' AND scope = 'acct-1'");
is(sql($coordinator, "SELECT outcome FROM idem_claim('pre-1', ${\ hash_of('a')}, NULL, 'acct-1')"), 'claimed',
	'deleted through Citus, it is gone');

for my $from (@nodes)
{
	for my $account ($a1, $a2)
	{
		my $key = 'k-' . name_of($from) . "-$account";
		my $label = name_of($from) . ", $account";
		is((split /\n/, sql($from, "BEGIN; SELECT outcome FROM idem_claim('$key', ${\ hash_of('a')}, NULL, '$account');
			SELECT idem_complete('$key', 201, '{\"id\": 1}', NULL, '$account'); COMMIT"))[0],
			'claimed', "$label: new key");
		for my $again (@nodes)
		{
			is(sql($again, "SELECT outcome || '|' || http_status || '|' || response_body
			                FROM idem_claim('$key', ${\ hash_of('a')}, NULL, '$account')"),
				'replay|201|{"id": 1}', "$label: replay from " . name_of($again));
		}
		is(sql($from, "SELECT outcome || '|' || http_status
		               FROM idem_claim('$key', ${\ hash_of('b')}, NULL, '$account')"),
			'mismatch|422', "$label: mismatch");
		is(join('|', split /\n/, sql($from,
			"BEGIN; SELECT outcome FROM idem_claim('5xx-$key', ${\ hash_of('a')}, NULL, '$account');
			 SELECT idem_complete('5xx-$key', 503, NULL, NULL, '$account'); COMMIT;
			 SELECT outcome FROM idem_claim('5xx-$key', ${\ hash_of('a')}, NULL, '$account')")),
			'claimed|f|claimed', "$label: 5xx not stored");
		is(join('|', split /\n/, sql($from,
			"BEGIN; SELECT outcome FROM idem_claim('rb-$key', ${\ hash_of('a')}, NULL, '$account'); ROLLBACK;
			 SELECT outcome FROM idem_claim('rb-$key', ${\ hash_of('a')}, NULL, '$account')")),
			'claimed|claimed', "$label: rollback frees the key");
	}
}

# Unscoped keys (scope '') all live in one shard: claimed, completed and replayed in one session on the node
# that holds it (the direct path remembers the unscoped scope's shard like any other), and replayed from every
# node.
my $unscoped_owner = $coordinator->citus_node_of(\@nodes, 'idempotency_keys', '');
is(join('|', split /\n/, sql($unscoped_owner, "BEGIN; SELECT outcome FROM idem_claim('unscoped-1', ${\ hash_of('a')});
	SELECT idem_complete('unscoped-1', 201, '{\"unscoped\": 1}'); COMMIT;
	SELECT outcome FROM idem_claim('unscoped-1', ${\ hash_of('a')});
	SELECT outcome FROM idem_claim('unscoped-1', ${\ hash_of('b')})")),
	'claimed|t|replay|mismatch', 'unscoped, on the node of its shard: claimed, then replay and mismatch in one session');
for my $from (@nodes)
{
	is(sql($from, "SELECT outcome || '|' || response_body FROM idem_claim('unscoped-1', ${\ hash_of('a')})"),
		'replay|{"unscoped": 1}', 'unscoped: replays from ' . name_of($from));
}

# One key in two scopes on two workers is two keys.
sql($coordinator, "BEGIN; SELECT outcome FROM idem_claim('shared-key', ${\ hash_of('a')}, NULL, '$a1');
	SELECT idem_complete('shared-key', 201, '{\"scope\": 1}', NULL, '$a1'); COMMIT");
is(join('|', split /\n/, sql($coordinator,
	"SELECT outcome FROM idem_claim('shared-key', ${\ hash_of('a')}, NULL, '$a1');
	SELECT outcome FROM idem_claim('shared-key', ${\ hash_of('b')}, NULL, '$a2')")),
	'replay|claimed', 'one key, two scopes on two workers: two keys');

# Bound parameters (extended protocol, as drivers send them) are delegated too: Citus plans the call for the value.
my $h = sql($coordinator, "SELECT idem_hash('a'::text)");
for my $from ($coordinator, $worker2)
{
	my $key = 'bp-' . name_of($from);
	is(join('|', split /\n/, sql($from, join("\n", 'BEGIN;',
		"SELECT outcome FROM idem_claim(\$1, \$2, NULL, \$3) \\bind $key $h $a1 \\g",
		"SELECT idem_complete(\$1, 201, NULL, NULL, \$2) \\bind $key $a1 \\g", 'COMMIT;',
		"SELECT outcome FROM idem_claim(\$1, \$2, NULL, \$3) \\bind $key $h $a1 \\g"))),
		'claimed|t|replay', 'bound parameters from ' . name_of($from)
		  . ': claim and completion in a transaction, then a replay');
}

# in_progress at once from every node while a transaction on the owner holds the key; the holder then rolls back.
for my $holder_node ($coordinator, $worker1)
{
	my $key = 'held-' . name_of($holder_node);
	my $holder = $holder_node->background_psql('app');
	$holder->query_safe("BEGIN");
	$holder->query_safe("SELECT outcome FROM idem_claim('$key', ${\ hash_of('a')}, NULL, '$a2')");
	for my $from (@nodes)
	{
		my $started = time;
		my $outcome = sql($from, "SELECT outcome || '|' || http_status
		                         FROM idem_claim('$key', ${\ hash_of('a')}, NULL, '$a2')");
		my $ms = int((time - $started) * 1000);
		my $label = 'held through ' . name_of($holder_node);
		is($outcome, 'in_progress|409', "$label: in_progress from " . name_of($from));
		# At once: with room for two busy cores.
		cmp_ok($ms, '<', 3000, "$label: answered from " . name_of($from) . ' in under 3 s');
	}
	if ($holder_node == $coordinator)
	{
		is(sql($coordinator, "SELECT key || '|' || holder FROM idem_keys_in_flight() WHERE key = '$key'"),
			"$key|transaction\@127.0.0.1:${\ $worker2->port}",
			'idem_keys_in_flight() on the coordinator lists the claim held on worker2');
	}
	$holder->query_safe("ROLLBACK");
	$holder->quit;
	is(sql($worker1, "SELECT outcome FROM idem_claim('$key', ${\ hash_of('a')}, NULL, '$a2')"), 'claimed',
		'held through ' . name_of($holder_node) . ': after its rollback the key is free');
}

# A call that Citus does not delegate (a PL/pgSQL simple expression) runs where it is and is refused there.
$coordinator->fails_like('app', "DO \$\$ BEGIN PERFORM idem_claim('nd-1', idem_hash('a'::text), NULL, '$a1'); END \$\$",
	qr/the key's shard is not on this node/, 'not delegated, on the coordinator: refused');
$worker2->fails_like('app', "DO \$\$ BEGIN PERFORM idem_claim('nd-1', idem_hash('a'::text), NULL, '$a1'); END \$\$",
	qr/Scope "$a1" lives in shard [0-9]+ of idempotency_keys, on 127.0.0.1:${\ $worker1->port}/,
	'not delegated, on the other worker: refused');
is(sql($worker1, "DO \$\$ BEGIN PERFORM idem_claim('nd-1', idem_hash('a'::text), NULL, '$a1'); END \$\$;
	SELECT 'claimed'"),
	'claimed', 'not delegated, on the owner itself: served');

# Lease mode with a takeover, from the coordinator and a worker.
for my $from ($coordinator, $worker2)
{
	my $key = 'lease-' . name_of($from);
	my $label = name_of($from);
	# A 5-second lease: the two calls below fit in it with both cores busy; then wait until it has run out.
	my ($token, $until) = split /\|/,
	  sql($from, "SELECT lease_token, lease_until
	              FROM idem_lease('$key', ${\ hash_of('a')}, '5 seconds', NULL, '$a1')");
	is(length($token), 36, "$label: lease granted");
	sql($from, "SELECT idem_checkpoint('$key', '$token', 'charged', '{\"charge\": \"ch_1\"}', '$a1')");
	is(sql($worker1, "SELECT outcome FROM idem_lease('$key', ${\ hash_of('a')}, '1 second', NULL, '$a1')"),
		'in_progress', "$label: lease in_progress while it runs");
	sql($from, "SELECT pg_sleep(greatest(0, extract(epoch FROM '$until'::timestamptz - clock_timestamp()) + 0.2))");
	is(sql($worker2, "SELECT outcome || '|' || recovery_point || '|' || recovery_state
	                  FROM idem_lease('$key', ${\ hash_of('a')}, '30 seconds', NULL, '$a1')"),
		'claimed|charged|{"charge": "ch_1"}', "$label: takeover after the lease ran out resumes at the recovery point");
	$from->fails_like('app', "SELECT idem_lease_complete('$key', '$token', 201, NULL, NULL, '$a1')",
		qr/55000|lease/, "$label: the stale holder is fenced");
}

# post_payment: claim, debit and completion in one delegated transaction, from every node.
for my $from (@nodes)
{
	for my $account ($a1, $a2)
	{
		my $key = 'pay-' . name_of($from) . "-$account";
		my $label = name_of($from) . ", $account";
		is(sql($from, "SELECT post_payment('$account', '$key', 7)->>'outcome'"), 'claimed', "$label: post_payment");
		is(sql($from, "SELECT (p->>'outcome') || '|' || (p->'body')::text FROM post_payment('$account', '$key', 7) p"),
			'replay|{"debited": 7}', "$label: post_payment retried: replay");
		is(sql($from, "BEGIN; SELECT post_payment('$account', 'tx-$key', 3)->>'outcome'; COMMIT"), 'claimed',
			"$label: post_payment inside a transaction block");
	}
}
is(sql($coordinator, "SELECT (SELECT count(*) FROM (SELECT 1 FROM ledger GROUP BY account, payment_key
	                                                 HAVING count(*) > 1) d)
	|| '|' || (SELECT count(*) FROM ledger)"), '0|12', 'each payment debited once');
is(sql($coordinator, "SELECT count(*) FROM accounts a
	WHERE a.balance <> 1000000 - coalesce((SELECT sum(amount) FROM ledger l WHERE l.account = a.account), 0)"),
	'0', 'balances match the ledger');

done_testing();
