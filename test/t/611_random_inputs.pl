
# Randomised input tests (fixed seed) of everything that takes a vector or
# an option, each outcome predicted here and compared with what the server
# says:
#  - the distance operators/functions on random arrays: lengths 0 to 16,001,
#    lower bounds other than 1, multi-dimensional arrays, NULL elements, and
#    values drawn from ordinary numbers, -0, denormals, the bound (+-1e15),
#    finite values beyond it, NaN and +-Infinity in every position: either
#    the distance (checked against a double-precision computation) or the
#    error of the first bad argument (SQLSTATE, and the element it names);
#  - inserts into a trained and an untrained gpuivf index and kNN queries
#    through them with the same arrays: the same errors, every accepted row
#    indexed (gpuivf_verify(index, true)) and found by an index scan;
#  - CREATE INDEX with random reloptions (lists, pq_m, pq_bits, rerank,
#    unknown names, non-numbers) and ALTER INDEX ... SET + REINDEX: 22023
#    exactly when an option is invalid; every index built verifies;
#  - SET of every gpuivf setting to random values: 22023 exactly when out of
#    range, and a kNN query runs under every accepted combination.
# GPUIVF_FUZZ_SEED changes the seed, GPUIVF_RANDOM_CASES the number of
# operator cases (default 1200).

use strict;
use warnings;

use List::Util qw(sum max min);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $seed = $ENV{GPUIVF_FUZZ_SEED} // 11;
my $cases = $ENV{GPUIVF_RANDOM_CASES} // 1200;
srand($seed);
my $B = unpack('f', pack('f', 1e15));    # kMaxComponent as a float

my $node = gpuivf_node('random_inputs', conf => "autovacuum = off\ngpuivf.analyze_sample = 0\n");
# try(q, returns): 'ok:<first column>' ('ok:null' for a command that
# returns nothing) or 'err:<SQLSTATE>:<message>:<detail>'
$node->safe_psql('postgres', q{
	CREATE FUNCTION try(q text, returns boolean) RETURNS text LANGUAGE plpgsql AS $$
	DECLARE r text; st text; msg text; det text;
	BEGIN
		IF returns THEN EXECUTE q INTO r; ELSE EXECUTE q; END IF;
		RETURN 'ok:' || coalesce(r, 'null');
	EXCEPTION WHEN OTHERS THEN
		GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
		RETURN 'err:' || st || ':' || msg || ':' || coalesce(det, '');
	END $$;
});

# runs the statements through try(), in batches; returns their results
sub run_all
{
	my (@sql) = @_;
	my @res;
	while (my @batch = splice(@sql, 0, 100))
	{
		my $script = join("\n",
			map {
				my $q = $_;
				my $returns = $q =~ /^SELECT|RETURNING/ ? 'true' : 'false';
				$q =~ s/'/''/g;
				"SELECT try('$q', $returns);"
			} @batch);
		my $out = $node->safe_psql('postgres', $script);
		my @lines = split /\n/, $out;
		# an error message can hold no newline; a result neither (numbers, counts)
		is(scalar(@lines), scalar(@batch), 'one result per statement') or diag $out
		  unless scalar(@lines) == scalar(@batch);
		push @res, @lines;
	}
	return @res;
}

# runs the statements; how many results do not match their pattern
sub mismatches
{
	my ($sql, $expect) = @_;
	my @got = run_all(@$sql);
	my $bad = 0;
	for my $i (0 .. $#$sql)
	{
		next if ($got[$i] // '') =~ $expect->[$i];
		$bad++;
		diag "case $i: " . substr($sql->[$i], 0, 300) . "\n  expected $expect->[$i]\n  got "
		  . ($got[$i] // 'missing')
		  if $bad <= 10;
	}
	return $bad;
}

# ------------------------------------------------------------- random arrays
sub random_value
{
	my $r = rand();
	return [ sprintf('%.6g', rand() * 4 - 2), 'ok' ] if $r < 0.95;
	my @special = (
		[ '-0', 'ok' ], [ '1e-40', 'ok' ], [ '-1.4e-45', 'ok' ], [ '1e15', 'ok' ], [ '-1e15', 'ok' ],
		[ '999999999999999', 'ok' ], [ '1.0001e15', 'range' ], [ '-2e15', 'range' ], [ '1e19', 'range' ],
		[ '-3.4e38', 'range' ], [ 'NaN', 'nan' ], [ 'Infinity', 'inf' ], [ '-Infinity', 'inf' ]);
	return $special[ int(rand(@special)) ];
}

# a random array: { sql, kind ('ok' or an error), values (floats), dims }
sub random_array
{
	my ($want_dims) = @_;
	my $r = rand();
	return { sql => q{'{}'::real[]}, kind => 'empty' } if $r < 0.02;
	return { sql => q{'{{1,2},{3,4}}'::real[]}, kind => 'ndim' } if $r < 0.04;
	my $n = $want_dims // do
	{
		my @lens = (1, 2, 3, 4, 7, 8, 15, 16, 17, 100, 1999, 2000, 2001, 16000, 16001);
		rand() < 0.05 ? $lens[ int(rand(@lens)) ] : 1 + int(rand(20));
	};
	my $long = $n > 200;
	my @vals;
	my $kind = 'ok';
	my $bad_at;
	for my $i (0 .. $n - 1)
	{
		my ($v, $k) = $long && rand() > 0.002 ? ('0', 'ok') : @{ random_value() };
		push @vals, $v;
		if ($k ne 'ok' && $kind eq 'ok') { $kind = $k; $bad_at = $i; }
	}
	my $null_at;
	if (rand() < 0.02)
	{
		$null_at = int(rand($n));
		$vals[$null_at] = 'NULL';
		$kind = 'null';    # NULLs are checked before values
	}
	my $lb = rand() < 0.2 ? int(rand(11)) - 5 : 1;
	my $prefix = $lb == 1 ? '' : sprintf('[%d:%d]=', $lb, $lb + $n - 1);
	my @floats = map { $_ eq 'NULL' ? 0 : unpack('f', pack('f', $_ eq 'NaN' ? 0 : $_)) } @vals;
	return {
		sql => "'$prefix\{" . join(',', @vals) . "}'::real[]",
		kind => $kind,
		element => defined $bad_at ? $lb + $bad_at : undef,
		bad => defined $bad_at ? $vals[$bad_at] : undef,
		floats => \@floats,
		dims => $n,
	};
}

# what the server must say about an argument: undef when it is accepted
sub arg_error
{
	my ($a) = @_;
	my %re = (
		empty => qr/^err:22000:array must not be empty:/,
		ndim => qr/^err:2202E:array must be one-dimensional:/,
		null => qr/^err:22004:array must not contain nulls:/,
		nan => qr/^err:22000:vector must not contain NaN:/,
		inf => qr/^err:22000:vector must not contain infinite values:/);
	return undef if $a->{kind} eq 'ok';
	return $re{ $a->{kind} } if $re{ $a->{kind} };
	my $el = $a->{element};
	return qr/^err:22003:vector value \S+ is out of range:Element $el of the array/;
}

sub f32 { return unpack('f', pack('f', $_[0])); }

my %opname = ('<->' => 'l2', '<#>' => 'nip', '<=>' => 'cos');
my (@sql, @expect);
for my $c (1 .. $cases)
{
	my $a = random_array();
	my $b = rand() < 0.85 && $a->{dims} ? random_array($a->{dims}) : random_array();
	my $op = (keys %opname)[ int(rand(3)) ];
	push @sql, "SELECT $a->{sql} $op $b->{sql}";
	my $e = arg_error($a) // arg_error($b);
	if (!$e && $a->{dims} != $b->{dims})
	{
		$e = qr/^err:22000:different vector dimensions $a->{dims} and $b->{dims}:/;
	}
	push @expect, $e // [ $opname{$op}, $a->{floats}, $b->{floats} ];
}

# the distance in double precision, and how far float32 may round from it
sub reference
{
	my ($m, $x, $y) = @_;
	if ($m eq 'l2')
	{
		my $s = sum(map { ($x->[$_] - $y->[$_])**2 } 0 .. $#$x);
		return (sqrt($s), 1e-4 * sqrt($s) + 1e-18);
	}
	my $dot = sum(map { $x->[$_] * $y->[$_] } 0 .. $#$x);
	my $mag = sum(map { abs($x->[$_] * $y->[$_]) } 0 .. $#$x);
	return (-$dot, 1e-4 * $mag + 1e-30) if $m eq 'nip';
	my $nx = sqrt(sum(map { f32($_)**2 } @$x));
	my $ny = sqrt(sum(map { f32($_)**2 } @$y));
	# a norm that underflows float32 (denormals) is zero for the engine: NaN
	return ('NaN', 0) if f32($nx * $nx) == 0 || f32($ny * $ny) == 0;
	return (1 - $dot / ($nx * $ny), 1e-3);
}

my @got = run_all(@sql);
my ($bad, $errors, $oks) = (0, 0, 0);
for my $i (0 .. $#sql)
{
	my ($e, $g) = ($expect[$i], $got[$i] // 'missing');
	my $fine;
	if (ref($e) eq 'Regexp')
	{
		$fine = $g =~ $e;
		$errors++;
	}
	else
	{
		my ($want, $tol) = reference(@$e);
		$oks++;
		if ($want eq 'NaN') { $fine = $g eq 'ok:NaN'; }
		else
		{
			$fine = $g =~ /^ok:(\S+)$/ && $1 ne 'NaN' && abs($1 - $want) <= $tol;
		}
		$e = "$want (+- $tol)";
	}
	next if $fine;
	$bad++;
	diag "case $i: " . substr($sql[$i], 0, 300) . "\n  expected $e\n  got $g" if $bad <= 10;
}
is($bad, 0, "operators: $cases random cases ($oks distances, $errors errors) as predicted");

# ------------------------------------------------ the same arrays into indexes
$node->safe_psql('postgres', q{
	CREATE TABLE t8 (id int, v real[]);
	SELECT setseed(0.1);
	INSERT INTO t8 SELECT g, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, 8) WHERE g > 0)
	  FROM generate_series(1, 500) g;
	CREATE INDEX t8_v ON t8 USING gpuivf (v) WITH (lists = 4);
	CREATE TABLE u (id int, v real[]);
	CREATE INDEX u_v ON u USING gpuivf (v);
	INSERT INTO u VALUES (0, '{1,2,3,4,5,6,7,8}');
});
(@sql, @expect) = ((), ());
my $accepted = 0;
for my $c (1 .. 400)
{
	my $a = rand() < 0.6 ? random_array(8) : random_array();
	$a->{dims} //= 0;
	my $table = rand() < 0.5 ? 't8' : 'u';
	push @sql, "INSERT INTO $table VALUES ($c, $a->{sql}) RETURNING 1";
	my $e = arg_error($a);
	$e //= qr/^err:54000:column cannot have more than 16000 dimensions/ if $a->{dims} > 16000;
	$e //= qr/^err:22000:vector has $a->{dims} dimensions, but gpuivf index "${table}_v" has 8:/
	  if $a->{dims} != 8;
	push @expect, $e // qr/^ok:1$/;
	$accepted++ unless $e;
}
for my $c (1 .. 200)
{
	my $a = rand() < 0.7 ? random_array(8) : random_array();
	my $k = 1 + int(rand(20));
	my $op = rand() < 0.5 ? '<->' : '<#>';
	push @sql, "SELECT count(*) FROM (SELECT id FROM t8 ORDER BY v $op $a->{sql} LIMIT $k) s";
	my $e = arg_error($a);
	$a->{dims} //= 0;
	$e //= qr/^err:54000:column cannot have more than 16000 dimensions/ if $a->{dims} > 16000;
	$e //= qr/^err:22000:(query vector has $a->{dims} dimensions, but gpuivf index "t8_v" has 8|different vector dimensions)/
	  if $a->{dims} != 8;
	push @expect, $e // qr/^ok:$k$/;
}
$node->safe_psql('postgres', 'ALTER DATABASE postgres SET enable_seqscan = off');
$bad = mismatches(\@sql, \@expect);
is($bad, 0, "indexes: 400 random inserts ($accepted accepted) and 200 random queries as predicted");
for my $idx ('t8_v', 'u_v')
{
	my ($rc, $out, $err) = $node->psql('postgres', "SELECT gpuivf_verify('$idx', true)");
	is($rc, 0, "$idx verifies after the random inserts") or diag $err;
}
is($node->safe_psql('postgres', q{SET gpuivf.probes = 4;
	SELECT count(*) FROM (SELECT id FROM t8 ORDER BY v <-> '{0,0,0,0,0,0,0,0}' LIMIT 100000) s}),
	$node->safe_psql('postgres', 'SELECT count(v) FROM t8'), 'an index scan finds every accepted row');
$node->safe_psql('postgres', 'ALTER DATABASE postgres RESET enable_seqscan');

# ------------------------------------------------------------- reloptions
$node->safe_psql('postgres', q{
	CREATE TABLE r12 (id int, v real[]);
	INSERT INTO r12 SELECT g, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, 12) WHERE g > 0)
	  FROM generate_series(1, 300) g;
});
my @lists = (-1, 0, 1, 2, 7, 299, 300, 301, 65536, 65537, 2147483647, 'x', '1.5');
my @pq_m = (-1, 0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 24, 1024, 1025, 'y');
my @pq_bits = (-2147483648, -1, 0, 3, 4, 5, 7, 8, 9, 16, 2147483647, 'z');
my @rerank = ('true', 'false', 'on', 'off', '1', '0', 'yes', 'no', 'maybe', '2');
# PostgreSQL's integer options round a decimal fraction (parse_int: rint)
sub int_ok
{
	my ($v, $lo, $hi) = @_;
	return 0 unless $v =~ /^-?\d+(\.\d+)?$/;
	my $r = sprintf('%.0f', $v);    # round half to even, as rint
	return $r >= $lo && $r <= $hi;
}
(@sql, @expect) = ((), ());
my (@built, %pq_m_of);
for my $c (1 .. 150)
{
	my %o;
	$o{lists} = $lists[ int(rand(@lists)) ] if rand() < 0.7;
	$o{pq_m} = $pq_m[ int(rand(@pq_m)) ] if rand() < 0.7;
	$o{pq_bits} = $pq_bits[ int(rand(@pq_bits)) ] if rand() < 0.5;
	$o{rerank} = $rerank[ int(rand(@rerank)) ] if rand() < 0.4;
	$o{foo} = 1 if rand() < 0.03;
	my $with = %o ? ' WITH (' . join(', ', map { "$_ = '$o{$_}'" } sort keys %o) . ')' : '';
	my $valid = !exists $o{foo};
	$valid &&= int_ok($o{lists}, 0, 65536) if exists $o{lists};
	$valid &&= int_ok($o{pq_m}, 0, 1024) && ($o{pq_m} == 0 || 12 % $o{pq_m} == 0) if exists $o{pq_m};
	$valid &&= int_ok($o{pq_bits}, -2147483648, 2147483647) && ($o{pq_bits} == 4 || $o{pq_bits} == 8)
	  if exists $o{pq_bits};
	$valid &&= $o{rerank} =~ /^(true|false|on|off|1|0|yes|no)$/ if exists $o{rerank};
	my $name = "r12_$c";
	push @sql, "CREATE INDEX $name ON r12 USING gpuivf (v)$with";
	push @expect, $valid ? qr/^ok:null$/ : qr/^err:22023:/;
	push @built, $name if $valid;
	$pq_m_of{$name} = $o{pq_m} // 0;
}
$bad = mismatches(\@sql, \@expect);
is($bad, 0, '150 random CREATE INDEX option sets: 22023 exactly for the invalid ones (' . scalar(@built) . ' built)');
my @verify = run_all(map { "SELECT gpuivf_verify('$_', true)" } @built);
is(scalar(grep { $_ ne 'ok:' } @verify), 0, 'every index built with random options verifies');

# ALTER INDEX ... SET checks ranges at once; pq_m's divisibility at REINDEX
(@sql, @expect) = ((), ());
for my $c (1 .. 60)
{
	my $idx = $built[ int(rand(@built)) ];
	my ($opt, $v) = @{ [ [ 'lists', $lists[ int(rand(@lists)) ] ], [ 'pq_m', $pq_m[ int(rand(@pq_m)) ] ],
		[ 'pq_bits', $pq_bits[ int(rand(@pq_bits)) ] ], [ 'rerank', $rerank[ int(rand(@rerank)) ] ] ]->[ int(rand(4)) ] };
	my $valid = $opt eq 'lists' ? int_ok($v, 0, 65536)
	  : $opt eq 'pq_m' ? int_ok($v, 0, 1024)
	  : $opt eq 'pq_bits' ? int_ok($v, -2147483648, 2147483647) && ($v == 4 || $v == 8)
	  : $v =~ /^(true|false|on|off|1|0|yes|no)$/;
	push @sql, "ALTER INDEX $idx SET ($opt = '$v')";
	push @expect, $valid ? qr/^ok:null$/ : qr/^err:22023:/;
	next unless $valid;
	$pq_m_of{$idx} = $v if $opt eq 'pq_m';
	# the options apply at REINDEX, which checks that pq_m divides 12
	push @sql, "REINDEX INDEX $idx";
	push @expect, $pq_m_of{$idx} == 0 || 12 % $pq_m_of{$idx} == 0 ? qr/^ok:null$/ : qr/^err:22023:pq_m must divide/;
}
$bad = mismatches(\@sql, \@expect);
is($bad, 0, '60 random ALTER INDEX ... SET + REINDEX as predicted');
@verify = run_all(map { "SELECT gpuivf_verify('$_', true)" } @built);
is(scalar(grep { $_ ne 'ok:' } @verify), 0, 'every index verifies after them');

# ------------------------------------------------------------------ settings
my %gucs = (
	'gpuivf.probes' => [ [ -1, 0, 1, 3, 65536, 65537, 'a' ], 0, 65536 ],
	'gpuivf.rerank_candidates' => [ [ -1, 0, 1, 10, 1024, 1025, -5 ], 0, 1024 ],
	'gpuivf.max_probes' => [ [ -1, 0, 1, 65536, 65537 ], 0, 65536 ],
	'gpuivf.analyze_sample' => [ [ -1, 0, 10, 10000, 10001 ], 0, 10000 ],
	'gpuivf.target_recall' => [ [ -0.1, 0, 0.5, 1, 1.01, 'NaN' ], 0, 1 ],
	'gpuivf.device' => [ [ 'auto', 'cpu', 'gpu', 'GPU', 'tpu', '' ], undef, undef ],
	'gpuivf.enable_batch_join' => [ [ 'on', 'off', 'maybe' ], undef, undef ]);
$bad = 0;
my $ran = 0;
for my $c (1 .. 80)
{
	my @names = sort keys %gucs;
	my ($g) = $names[ int(rand(@names)) ];
	my ($vals, $lo, $hi) = @{ $gucs{$g} };
	my $v = $vals->[ int(rand(@$vals)) ];
	my $valid = $g eq 'gpuivf.device' ? $v =~ /^(auto|cpu)$/i
	  : $g eq 'gpuivf.enable_batch_join' ? $v =~ /^(on|off)$/
	  : $v =~ /^-?[\d.]+$/ && $v >= $lo && $v <= $hi && ($g eq 'gpuivf.target_recall' || $v =~ /^-?\d+$/);
	# gpu without a worker: accepted by SET, refused by the scan
	my $gpu = $g eq 'gpuivf.device' && lc($v) eq 'gpu';
	# loaded first: a setting of a library not yet loaded is a placeholder,
	# whose bad value is only a WARNING when the library loads
	my ($rc, $out, $err) = $node->psql('postgres',
		"LOAD 'gpuivf'; SET enable_seqscan = off; SET $g = '$v'; SELECT count(*) FROM (SELECT id FROM t8 ORDER BY v <-> '{0,0,0,0,0,0,0,0}' LIMIT 7) s");
	my $fine = $valid ? ($rc == 0 && $out eq '7')
	  : $gpu ? ($err =~ /gpuivf.device is set to "gpu" but no gpuivf GPU worker is running/)
	  : ($err =~ /ERROR:  (invalid value for parameter|parameter .* requires a|.* is outside the valid range)/);
	$ran++;
	next if $fine;
	$bad++;
	diag "SET $g = '$v': rc $rc, out '$out', err '$err'" if $bad <= 10;
}
is($bad, 0, "$ran random settings: accepted ones run a kNN query, others are refused");

$node->stop;
done_testing();
