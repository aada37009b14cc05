#!/usr/bin/perl
# report.pl OUT_DIR: turns OUT_DIR/raw.csv (written by run.sh) into results.csv (raw rows plus medians and
# ratios), results.md (README-ready), ratios.dat + ratios.png (gnuplot), and prints results.md.
# A ratio is the median of per-round ratios: variants run one after the other within a round, so pairing
# by round cancels most of the drift of a shared machine.
use strict;
use warnings;

my $out = shift or die "usage: report.pl OUT_DIR\n";
my (%tps, %wal, %size, %hash, @configs, %seen, @raw);
my @variants = qw(bare floor plpgsql extension);
my @ratios = (['extension', 'floor'], ['extension', 'plpgsql'], ['plpgsql', 'floor'], ['bare', 'floor']);

open my $in, '<', "$out/raw.csv" or die "$out/raw.csv: $!\n";
<$in>;
while (<$in>) {
    chomp;
    push @raw, $_;
    my ($section, $workload, $sync, $clients, $variant, $round, $metric, $value) = split /,/;
    if ($section eq 'tps') {
        my $config = "$workload|$sync|$clients";
        push @configs, $config unless $seen{$config}++;
        $tps{$config}{$variant}{$round} = $value;
    } elsif ($section eq 'wal') {
        $wal{$workload}{$variant}{$metric} = $value;
    } elsif ($section eq 'size') {
        $size{$variant}{$metric} = $value;
    } elsif ($section eq 'hash') {
        push @{$hash{$workload}{$variant}}, $value;
    }
}
close $in;

my %meta;
if (open my $m, '<', "$out/meta.txt") {
    while (<$m>) { chomp; my ($k, $v) = split /=/, $_, 2; $meta{$k} = $v; }
}

sub median {
    my @v = sort { $a <=> $b } @_;
    return undef unless @v;
    return @v % 2 ? $v[$#v / 2] : ($v[@v / 2 - 1] + $v[@v / 2]) / 2;
}

sub ratio {    # median over rounds of tps(a) / tps(b), undef when a variant did not run
    my ($config, $a, $b) = @_;
    my ($ta, $tb) = ($tps{$config}{$a}, $tps{$config}{$b});
    return undef unless $ta && $tb;
    return median(map { $ta->{$_} / $tb->{$_} } grep { exists $tb->{$_} } keys %$ta);
}

sub fmt { my ($f, $v) = @_; defined $v ? sprintf($f, $v) : '–' }

my (@csv, @md, @dat);
push @md, "Measured $meta{date} on $meta{machine}, PostgreSQL $meta{postgres}." if $meta{date};
push @md, "Command: `$meta{command}` ($meta{matrix}). Load average at start $meta{load_start}, at end $meta{load_end}."
    if $meta{command};
push @md, '';

if (@configs) {
    push @md, '**Throughput**: median transactions per second over the rounds; ratios are medians of per-round ratios '
        . '(variants alternate within each round). Workloads: *new* = claim, ledger insert, complete of a new key, one '
        . 'statement per round trip in BEGIN/COMMIT; *proc* = the same in one call of a PL/pgSQL function; *replay* = '
        . 'claim of one of 100k completed keys; *mix* = *new* with 10 % retries of the last key and 1 % claims of keys '
        . 'another session holds. Variants: *bare* = the ledger insert alone; *floor* = trivial `SELECT`s with the '
        . 'same parameters where claim and complete would be; *plpgsql* = bench/plpgsql_baseline.sql; *extension*.', '';
    push @md, '| workload | synchronous_commit | clients | bare | floor | plpgsql | extension | extension/floor '
        . '| extension/plpgsql | plpgsql/floor | bare/floor |';
    push @md, '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|';
    for my $config (@configs) {
        my ($workload, $sync, $clients) = split /\|/, $config;
        my @cells = ($workload, $sync, $clients);
        for my $v (@variants) {
            my $med = $tps{$config}{$v} ? median(values %{$tps{$config}{$v}}) : undef;
            push @csv, "tps_median,$workload,$sync,$clients,$v,,tps," . sprintf('%.1f', $med) if defined $med;
            push @cells, fmt('%.0f', $med);
        }
        my @r = map { ratio($config, @$_) } @ratios;
        for my $i (0 .. $#ratios) {
            next unless defined $r[$i];
            push @csv, "ratio,$workload,$sync,$clients,$ratios[$i][0]/$ratios[$i][1],,tps_ratio," . sprintf('%.3f', $r[$i]);
        }
        push @cells, map { fmt('%.2f', $_) } @r;
        push @md, '| ' . join(' | ', @cells) . ' |';
        push @dat, join(' ', "\"$workload sync=$sync c=$clients\"", map { defined $_ ? sprintf('%.3f', $_) : '-' } @r);
    }
    push @md, '';
}

if (%wal) {
    push @md, '**WAL per request** (1 client, measured after a CHECKPOINT and a warm-up run of the same size).', '';
    push @md, '| workload | variant | bytes | full-page images | records |', '|---|---|---:|---:|---:|';
    for my $w (sort keys %wal) {
        for my $v (grep { $wal{$w}{$_} } @variants) {
            my $x = $wal{$w}{$v};
            push @md, "| $w | $v | " . join(' | ', fmt('%.0f', $x->{bytes_per_request}),
                fmt('%.2f', $x->{fpi_per_request}), fmt('%.2f', $x->{records_per_request})) . ' |';
        }
    }
    push @md, '';
}

if (%size) {
    push @md, '**Storage per million completed keys** (random UUID keys, ~110-byte JSON bodies, loaded through the API '
        . 'by one session).', '';
    push @md, '| implementation | total MB | table MB | index MB | load, keys/s |', '|---|---:|---:|---:|---:|';
    for my $v (grep { $size{$_} } qw(extension plpgsql)) {
        my $x = $size{$v};
        push @md, "| $v | " . join(' | ', map { fmt('%.1f', $x->{$_} / 1e6) }
            qw(total_bytes_per_million_keys table_bytes_per_million_keys index_bytes_per_million_keys))
            . ' | ' . fmt('%.0f', $x->{load_keys_per_s}) . ' |';
    }
    push @md, '';
}

if (%hash) {
    push @md, '**Hash throughput**, MB/s (10^6 bytes), median of the repetitions: one session hashing one in-memory bytea '
        . 'payload 100 MB worth of times in a PL/pgSQL loop (call overhead included).', '';
    push @md, '| payload | idem_hash | sha256() | plpgsql_idem.idem_hash = encode(sha256(), \'hex\') | idem_hash/sha256 |',
        '|---|---:|---:|---:|---:|';
    for my $p (sort keys %hash) {
        my %med = map { $_ => median(@{$hash{$p}{$_} || []}) } qw(idem_hash sha256 plpgsql_idem_hash);
        push @csv, "hash_median,$p,-,1,$_,,mb_per_s," . sprintf('%.1f', $med{$_}) for grep { defined $med{$_} } sort keys %med;
        push @md, "| $p | " . join(' | ', map { fmt('%.0f', $med{$_}) } qw(idem_hash sha256 plpgsql_idem_hash)) . ' | '
            . ($med{idem_hash} && $med{sha256} ? sprintf('%.2f', $med{idem_hash} / $med{sha256}) : '–') . ' |';
    }
    push @md, '';
}

open my $csv, '>', "$out/results.csv" or die $!;
print $csv "section,workload,sync,clients,variant,round,metric,value\n", map { "$_\n" } @raw, @csv;
close $csv;
open my $md, '>', "$out/results.md" or die $!;
print $md map { "$_\n" } @md;
close $md;
print map { "$_\n" } @md;

if (@dat) {
    open my $dat, '>', "$out/ratios.dat" or die $!;
    print $dat "# config extension/floor extension/plpgsql plpgsql/floor bare/floor\n", map { "$_\n" } @dat;
    close $dat;
    my $width = 300 + 70 * @dat;
    (my $dir = $0) =~ s{[^/]*$}{};
    system('gnuplot', '-e', "datafile='$out/ratios.dat'; output='$out/ratios.png'; width=$width", "${dir}ratios.gp") == 0
        or warn "gnuplot failed: no $out/ratios.png\n";
}
