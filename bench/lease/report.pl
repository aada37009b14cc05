#!/usr/bin/perl
# bench/lease/report.pl OUT-DIR: medians of OUT-DIR/raw.csv (bench/lease/run.sh) into OUT-DIR/summary.md, printed.
use strict;
use warnings;

my $out = shift or die "usage: report.pl OUT-DIR\n";
my (%tps, %wal, @settings, %seen);
open my $raw, '<', "$out/raw.csv" or die "$out/raw.csv: $!\n";
<$raw>;
while (<$raw>) {
    chomp;
    my ($section, $sync, $clients, $variant, $round, $metric, $value) = split /,/;
    if ($section eq 'tps') {
        $tps{"$sync,$clients"}{$variant}{$round} = $value;
        push @settings, "$sync,$clients" unless $seen{"$sync,$clients"}++;
    } elsif ($section eq 'wal') {
        $wal{$variant}{$metric} = $value;
    }
}
close $raw;

sub median {
    my @v = sort { $a <=> $b } @_;
    return undef unless @v;
    return @v % 2 ? $v[$#v / 2] : ($v[@v / 2 - 1] + $v[@v / 2]) / 2;
}

# Ratio of the medians, and the median and range of the per-round ratios (the variants of a round ran
# back to back, so a round's ratio cancels what the machine did during that round).
sub ratios {
    my ($by, $num, $den) = @_;
    my @rounds = grep { exists $by->{$den}{$_} } sort { $a <=> $b } keys %{ $by->{$num} };
    my @r = sort { $a <=> $b } map { $by->{$num}{$_} / $by->{$den}{$_} } @rounds;
    my $of_medians = median(values %{ $by->{$num} }) / median(values %{ $by->{$den} });
    return sprintf('%.2f (rounds %.2f, %.2f to %.2f)', $of_medians, median(@r), $r[0], $r[-1]);
}

my $md = '';
if (open my $meta, '<', "$out/meta.txt") {
    $md .= join('', map { "- $_" } <$meta>) . "\n";
}
$md .= "Requests/s, median of the rounds (one request = one pgbench transaction: lease and floor are two database\n"
    . "transactions each, txn10 is one). Ratios: of the medians, then the median and range of the per-round ratios.\n\n";
$md .= "| synchronous_commit | clients | lease | floor | 1.0 txn | lease/floor | lease/1.0 |\n";
$md .= "|---|---:|---:|---:|---:|---|---|\n";
for my $s (@settings) {
    my ($sync, $clients) = split /,/, $s;
    my $by = $tps{$s};
    $md .= sprintf("| %s | %d | %.0f | %.0f | %.0f | %s | %s |\n", $sync, $clients,
        (map { median(values %{ $by->{$_} }) } qw(lease floor txn10)),
        ratios($by, 'lease', 'floor'), ratios($by, 'lease', 'txn10'));
}
if (%wal) {
    $md .= "\nWAL per request (1 client, synchronous_commit on, after a CHECKPOINT and a warm-up of the same size):\n\n";
    $md .= "| variant | bytes | full-page images | records |\n|---|---:|---:|---:|\n";
    for my $v (qw(lease floor txn10)) {
        next unless $wal{$v};
        $md .= sprintf("| %s | %.0f | %.2f | %.2f |\n", $v, @{ $wal{$v} }{qw(bytes_per_request fpi_per_request records_per_request)});
    }
}
open my $f, '>', "$out/summary.md" or die "$out/summary.md: $!\n";
print $f $md;
close $f;
print $md;
