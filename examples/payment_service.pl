#!/usr/bin/perl
# The seed article's payment story, played by a real client against the idempotency extension.
# post_payment() is the handler an application would write; the scenes call it the way networks and
# users misbehave. Connects through the libpq environment (PGHOST, PGPORT, PGUSER, PGDATABASE) to a
# database with the extension and examples/payment_schema.sql + payment_procedure.sql loaded.
# Exits non-zero when any outcome differs from the story.
use strict;
use warnings;
use DBI;
use JSON::PP;
use Time::HiRes qw(time sleep);

my $json = JSON::PP->new->canonical;
my %reason = (201 => 'Created', 409 => 'Conflict', 422 => 'Unprocessable Content',
              500 => 'Internal Server Error', 503 => 'Service Unavailable');
my $card_network_up = 1;    # the downstream service of scene 5
my @failures;

# ---- the application ------------------------------------------------------------------------------

sub connect_server {
    my ($name) = @_;
    my $dbh = DBI->connect("dbi:Pg:application_name=$name", undef, undef,
                           {RaiseError => 1, PrintError => 0, AutoCommit => 1});
    # Pool settings of a web server: give up on a busy row quickly, never hang.
    $dbh->do("SET lock_timeout = '200ms'");
    $dbh->do("SET statement_timeout = '5s'");
    return $dbh;
}

sub json_response {
    my ($status, $body, %headers) = @_;
    return {status => $status, body => $body, headers => {'Content-Type' => 'application/json', %headers}};
}

sub error_response {
    my ($status, $error, $message, %headers) = @_;
    return json_response($status, $json->encode({error => $error, message => $message}), %headers);
}

# POST /payments. Returns {status, headers, body} plus, for the narration, outcome/stored/error.
# while_in_flight is the demo's way to act between claim and complete.
sub post_payment {
    my ($dbh, $key, $body_json, %hook) = @_;
    my $response = eval { handle_payment($dbh, $key, $body_json, %hook) };
    return $response if $response;
    my $error = $@;
    # The rollback also undoes the claim: the retry will be claimed again.
    eval { $dbh->rollback } unless $dbh->{AutoCommit};
    return {%{error_response(500, 'internal_error', 'retry with the same Idempotency-Key')}, error => $error};
}

sub handle_payment {
    my ($dbh, $key, $body_json, %hook) = @_;
    $dbh->begin_work;
    my $claim = $dbh->selectrow_hashref(
        'SELECT outcome, http_status, response_body, response_headers FROM idem_claim(?, idem_hash(?::jsonb))',
        undef, $key, $body_json);
    if ($claim->{outcome} ne 'claimed') {
        $dbh->rollback;
        return answer_without_executing($claim);
    }

    # Parsed in SQL so that the amount stays an exact numeric.
    my $payment = $dbh->selectrow_hashref(q{
        INSERT INTO payments (account, amount, currency)
        SELECT (r->>'account')::int, (r->>'amount')::numeric, r->>'currency' FROM (SELECT ?::jsonb) AS req(r)
        RETURNING account, amount,
                  jsonb_build_object('id', id, 'account', account, 'amount', amount, 'currency', currency,
                                     'status', 'succeeded', 'created_at', created_at) AS body},
        undef, $body_json);
    $dbh->do('INSERT INTO ledger (account, amount, idempotency_key) VALUES (?, -(?::numeric), ?)',
             undef, $payment->{account}, $payment->{amount}, $key);
    $dbh->do('UPDATE accounts SET balance = balance - ? WHERE id = ?',
             undef, $payment->{amount}, $payment->{account});
    $hook{while_in_flight}->() if $hook{while_in_flight};

    my $response = $card_network_up
        ? json_response(201, $payment->{body})
        : error_response(503, 'card_network_unavailable', 'try again shortly', 'Retry-After' => '1');
    # The extension decides the transaction's fate: a stored response commits together with the debit;
    # a 5xx is refused (false), so the debit and the claim roll back and the retry starts afresh.
    my ($stored) = $dbh->selectrow_array('SELECT idem_complete(?, ?, ?::jsonb, ?::jsonb)', undef,
                                         $key, $response->{status}, $response->{body},
                                         $json->encode($response->{headers}));
    $stored ? $dbh->commit : $dbh->rollback;
    return {%$response, outcome => 'claimed', stored => $stored};
}

sub answer_without_executing {
    my ($claim) = @_;
    my $outcome = $claim->{outcome};
    if ($outcome eq 'replay') {
        my %headers = (%{decode_json($claim->{response_headers} // '{}')}, 'Idempotent-Replayed' => 'true');
        return {status => $claim->{http_status}, headers => \%headers, body => $claim->{response_body},
                outcome => $outcome};
    }
    my $response = $outcome eq 'mismatch'
        ? error_response($claim->{http_status}, 'idempotency_key_reused',
                         'this Idempotency-Key was used with a different request body')
        : $outcome eq 'in_progress'
        ? error_response($claim->{http_status}, 'request_in_progress',
                         'a request with this Idempotency-Key is still being processed', 'Retry-After' => '1')
        : die "unknown idem_claim outcome '$outcome'\n";
    return {%$response, outcome => $outcome};
}

# ---- narration and checks --------------------------------------------------------------------------

sub scene { print "\nScene $_[0]. $_[1]\n" }
sub note  { print "     ($_[0])\n" }

sub show_request {
    my ($key, $body, $note) = @_;
    printf "  -> POST /payments  Idempotency-Key: %s%s\n     %s\n", $key, ($note ? "   [$note]" : ''), $body;
}

sub show_response {
    my ($response, $note) = @_;
    my $headers = $response->{headers};
    my @shown = map { "  $_: $headers->{$_}" } grep { $_ ne 'Content-Type' } sort keys %$headers;
    printf "  <- %d %s%s%s\n     %s\n", $response->{status}, $reason{$response->{status}} // '',
           join('', @shown), ($note ? "   [$note]" : ''), $response->{body};
}

sub check {
    my ($ok, $what) = @_;
    print $ok ? "  ok: $what\n" : "  FAILED: $what\n";
    push @failures, $what unless $ok;
}

sub replayed { ($_[0]{headers}{'Idempotent-Replayed'} // '') eq 'true' }
sub payment_id { my $body = eval { decode_json($_[0]{body}) }; $body ? $body->{id} // '?' : '?' }
sub first_line { ((split /\n/, $_[0] // '')[0] // '') =~ s/^.*?ERROR:\s*//r }

my $monitor = DBI->connect('dbi:Pg:application_name=monitor', undef, undef, {RaiseError => 1, PrintError => 0});
sub debits { scalar $monitor->selectrow_array('SELECT count(*) FROM ledger WHERE idempotency_key = ?', undef, $_[0]) }
sub ledger_state { join ' / ', $monitor->selectrow_array('SELECT count(*), coalesce(sum(amount), 0) FROM ledger') }

# ---- the story -------------------------------------------------------------------------------------

my $server1 = connect_server('server-1');
my $server2 = connect_server('server-2');    # retries often land on another replica
my %key = (
    lost     => '3f6c2a9e-8d41-4b7a-9c25-1e0b7d4f6a01',
    double   => 'b5e1d7c3-2a96-4f08-8e4b-6c3a9f1d2b02',
    crash    => '7a2e4c1b-5f83-4d69-a0b7-9e6d2c8f4e04',
    outage   => 'c9d3f5a7-1b2e-4c84-9d6f-3a8e7b5c1d05',
    function => 'e4b8a6c2-9f1d-4e73-b5a0-2d7c9e3f8a06',
);

scene(1, 'The response is lost on the way back; the client retries');
my $body1 = '{"account": 1, "amount": 100.00, "currency": "USD"}';
show_request($key{lost}, $body1);
my $lost = post_payment($server1, $key{lost}, $body1);
show_response($lost);
note('the network drops this response: the client only sees a timeout and retries');
show_request($key{lost}, $body1, 'retry');
my $retry1 = post_payment($server2, $key{lost}, $body1);
show_response($retry1);
check($lost->{status} == 201 && $retry1->{status} == 201 && replayed($retry1) && $retry1->{body} eq $lost->{body},
      'the retry replays the lost response byte for byte: payment ' . payment_id($lost));
check(debits($key{lost}) == 1, 'account 1 debited once');

scene(2, 'A double click: the second request arrives while the first is in flight');
my $body2 = '{"account": 2, "amount": 25.00, "currency": "USD"}';
my ($second, $second_ms);
show_request($key{double}, $body2, 'first click, server 1');
my $started = time;
my $first = post_payment($server1, $key{double}, $body2, while_in_flight => sub {
    note('server 1 has claimed the key and written the debit; its transaction is still open');
    show_request($key{double}, $body2, 'second click, server 2');
    my $t = time;
    $second = post_payment($server2, $key{double}, $body2);
    $second_ms = (time - $t) * 1000;
    show_response($second, sprintf('after %.1f ms', $second_ms));
    sleep 0.3;    # the first request is slow (the card network), and stays in flight
});
my $first_ms = (time - $started) * 1000;
show_response($first, sprintf('first click, after %.0f ms', $first_ms));
show_request($key{double}, $body2, 'retry after the 409');
my $retry2 = post_payment($server2, $key{double}, $body2);
show_response($retry2);
check($second->{status} == 409 && $second_ms < 250,
      sprintf('the second click is answered 409 at once (%.1f ms), while the first is in flight (%.0f ms)',
              $second_ms, $first_ms));
check($first->{status} == 201 && replayed($retry2) && $retry2->{body} eq $first->{body},
      'the retry replays the first response: payment ' . payment_id($first));
check(debits($key{double}) == 1, 'account 2 debited once');

scene(3, 'The retry of scene 1 comes back with a tampered amount');
my $before = ledger_state();
my $tampered = '{"account": 1, "amount": 999999, "currency": "USD"}';
show_request($key{lost}, $tampered, 'same key, other body');
my $mismatch = post_payment($server1, $key{lost}, $tampered);
show_response($mismatch);
check($mismatch->{status} == 422, 'refused with 422, not a replay of the $100 receipt');
check(ledger_state() eq $before, "ledger unchanged (rows / sum: $before)");

scene(4, 'The database fails in the middle of the transaction');
my $back_office = DBI->connect('dbi:Pg:application_name=back-office', undef, undef,
                               {RaiseError => 1, PrintError => 0, AutoCommit => 1});
$back_office->begin_work;
$back_office->do('SELECT 1 FROM accounts WHERE id = 3 FOR NO KEY UPDATE');
note("a back-office job holds account 3's row lock; the servers' lock_timeout is 200 ms");
my $body4 = '{"account": 3, "amount": 40.00, "currency": "USD"}';
show_request($key{crash}, $body4);
my $crash = post_payment($server1, $key{crash}, $body4);
show_response($crash);
note('database: ' . first_line($crash->{error}) . '; payment, debit and claim rolled back');
my $debits_after_crash = debits($key{crash});
$back_office->rollback;
note('the back-office job ends');
show_request($key{crash}, $body4, 'retry');
my $retry4 = post_payment($server2, $key{crash}, $body4);
show_response($retry4);
check($crash->{status} == 500 && $debits_after_crash == 0, 'the failed attempt left no debit and no stored response');
check($retry4->{status} == 201 && ($retry4->{outcome} // '') eq 'claimed',
      'the retry was claimed again and executed: payment ' . payment_id($retry4));
check(debits($key{crash}) == 1, 'account 3 debited once');

scene(5, 'The card network is down: 503, which must not be cached');
my $body5 = '{"account": 4, "amount": 60.00, "currency": "USD"}';
$card_network_up = 0;
show_request($key{outage}, $body5);
my $outage = post_payment($server1, $key{outage}, $body5);
show_response($outage);
note('idem_complete(key, 503, ...) returned ' . ($outage->{stored} ? 'true' : 'false')
     . ': nothing stored, the handler rolled back its debit');
my $debits_after_outage = debits($key{outage});
$card_network_up = 1;
note('the card network is back');
show_request($key{outage}, $body5, 'retry');
my $retry5 = post_payment($server2, $key{outage}, $body5);
show_response($retry5);
check($outage->{status} == 503 && defined $outage->{stored} && !$outage->{stored} && $debits_after_outage == 0,
      'the 503 was neither stored nor debited');
check($retry5->{status} == 201 && ($retry5->{outcome} // '') eq 'claimed',
      'the retry was claimed and executed: payment ' . payment_id($retry5));
check(debits($key{outage}) == 1, 'account 4 debited once');

scene(6, 'The same flow as one stored function (examples/payment_procedure.sql)');
my $body6 = '{"account": 5, "amount": 15.00, "currency": "USD"}';
my @calls;
for my $server ($server1, $server2) {
    print "  -> SELECT * FROM post_payment('$key{function}', '$body6')\n";
    my $row = $server->selectrow_hashref('SELECT status, body, replayed FROM post_payment(?, ?::jsonb)',
                                         undef, $key{function}, $body6);
    printf "  <- status %d, replayed %s\n     %s\n", $row->{status}, $row->{replayed} ? 'true' : 'false', $row->{body};
    push @calls, $row;
}
check($calls[0]{status} == 201 && !$calls[0]{replayed} && $calls[1]{status} == 201 && $calls[1]{replayed}
      && $calls[1]{body} eq $calls[0]{body}, 'the second call replays the first');
check(debits($key{function}) == 1, 'account 5 debited once');

print "\nThe ledger, grouped by Idempotency-Key\n";
my $ledger = $monitor->selectall_arrayref(q{
    SELECT idempotency_key, min(account) AS account, count(*) AS debits, sum(amount) AS amount
    FROM ledger GROUP BY idempotency_key ORDER BY min(id)}, {Slice => {}});
printf "  %-36s  %7s  %6s  %8s\n", 'idempotency_key', 'account', 'debits', 'amount';
printf "  %-36s  %7d  %6d  %8s\n", @$_{qw(idempotency_key account debits amount)} for @$ledger;
my %debits_by_key = map { $_->{idempotency_key} => $_->{debits} } @$ledger;
check(join(',', sort keys %debits_by_key) eq join(',', sort values %key)
      && !grep({ $_ != 1 } values %debits_by_key), 'exactly one debit for every key, no other debits');
my ($unbalanced) = $monitor->selectrow_array(q{
    SELECT count(*) FROM accounts a
    WHERE a.balance <> a.opening_balance + (SELECT coalesce(sum(amount), 0) FROM ledger l WHERE l.account = a.id)});
check($unbalanced == 0, 'every balance equals its opening balance plus its ledger');
my ($stored, $statuses) = $monitor->selectrow_array(
    q{SELECT count(*), coalesce(string_agg(DISTINCT http_status::text, ','), 'none') FROM idempotency_keys});
check($stored == 5 && $statuses eq '201', "stored responses: $stored, status $statuses (no 5xx)");

$_->disconnect for $server1, $server2, $back_office, $monitor;
if (@failures) {
    print "\n", scalar(@failures), " check(s) FAILED\n";
    exit 1;
}
print "\nAll checks passed: every payment was debited exactly once.\n";
