#!/usr/bin/perl
# Classifies the memcheck errors in valgrind logs (one per process) as ours or elsewhere.
#   vg_summary.pl MODULE.so COPY.so LOG...
# An error is ours when any frame of its stack (not of the allocation stack) is in MODULE.so. Frames with debug
# info show file:line instead of the object, so a frame is ours when shown "(in MODULE.so)", or named after a
# function COPY.so (MODULE.so as loaded) defines, or in one of COPY.so's source files (inlined functions).
# Prints the full report of every error of ours, then one line:
#   processes=N ours_rw=N ours_uninit=N ours_other=N else_rw=N else_uninit=N else_other=N
use strict;
use warnings;

my ($module, $copy, @logs) = @ARGV;
my %ours;
for (`nm -C --defined-only '$copy'`) {
    my ($type, $name) = /^\S+ (\S) (.*)$/ or next;
    next unless $type =~ /[tTwW]/;
    $ours{base($name)} = 1;
}
# Linker and CRT symbols every shared object has; not evidence of our code.
delete @ours{qw(_init _fini frame_dummy register_tm_clones deregister_tm_clones __do_global_dtors_aux)};
die "no function symbols in $copy\n" unless %ours;
my (%our_files, $in_unit);
for (`readelf --debug-dump=info '$copy' 2>/dev/null`) {
    $in_unit = 1 if /DW_TAG_compile_unit/;
    next unless $in_unit && /DW_AT_name.*: (\S+)$/;
    $our_files{$1 =~ s{.*/}{}r} = 1;    # src/core/hex.cpp -> hex.cpp
    $in_unit = 0;
}

sub base {    # "idem::Sha256::update(void const*) [clone .cold]" -> "idem::Sha256::update"
    my $name = shift;
    $name =~ s/ \[clone .*//;
    $name =~ s/\(.*//;
    $name =~ s/\.(cold|part|isra|constprop|lto_priv)\b.*//;
    return $name;
}

sub ours_frame {
    my $frame = shift;    # "   by 0x1234: name (file.c:12)" or "... name (in /path/obj.so)"
    my ($name, $where) = $frame =~ /^\s+(?:at|by) 0x[0-9A-F]+: (.*) \((.*)\)$/ or return 0;
    return $where eq "in $module" if $where =~ /^in /;
    return 1 if $where =~ /^(?:.*\/)?([^\/:]+):\d+$/ && $our_files{$1};
    return $ours{base($name)} // 0;
}

my %count = map { $_ => 0 } qw(ours_rw ours_uninit ours_other else_rw else_uninit else_other);
my $processes = 0;
for my $log (@logs) {
    open my $fh, '<', $log or die "$log: $!";
    my @lines = map { s/^==\d+== ?//r } <$fh>;
    $processes++ if grep { /^Command: / } @lines;
    for (my $i = 0; $i < @lines; $i++) {
        my $head = $lines[$i];
        next unless $head =~ /^(Invalid (read|write|free)|Conditional jump|Use of uninitialised|Syscall param|Mismatched free|Source and destination overlap|Jump to the invalid|Argument .* fishy)/;
        my $class = $head =~ /^Invalid (read|write)/ ? 'rw'
                  : $head =~ /uninitialised/          ? 'uninit'
                  :                                      'other';
        my $j = $i + 1;
        my $mine = 0;
        while ($j < @lines && $lines[$j] =~ /^\s+(at|by) 0x/) {
            $mine ||= ours_frame($lines[$j]);
            $j++;
        }
        $count{($mine ? 'ours_' : 'else_') . $class}++;
        if ($mine) {
            my $end = $j;
            $end++ while $end < @lines && $lines[$end] =~ /\S/;    # include "Address ..." and its stack
            print "== $log\n", @lines[$i .. $end - 1], "\n";
        }
    }
}
print join(' ', "processes=$processes", map { "$_=$count{$_}" } sort keys %count), "\n";
