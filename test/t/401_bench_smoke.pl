
# Smoke test of the benchmark (test/bench/run): a --quick run at
# tiny scale (3,000 x 16, 40 queries, 1 s pgbench points, 1 and 2 clients)
# must finish and write outputs that parse: results.csv (header, one row per
# knob value and client count, recall in [0, 1], QPS > 0), build.csv,
# batch_join.csv, summary.md with its markdown tables, and the PNG plots when
# matplotlib can be imported (otherwise summary.md must say the plots were
# skipped, and this test reports that skip).  With pgvector installed the
# harness indexes one vector(16) column with gpuivf, hnsw and ivfflat, and
# their rows and builds must be there too.  It checks the harness, not
# gpuivf's speed: the numbers are printed, not judged.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $root = abs_path(dirname(__FILE__) . '/../..');
my $tools = dirname(tool_path('gpuivf_gen'));
tool_path('gpuivf_gt');
my $out = tempdir('bench-smoke.XXXXXX', TMPDIR => 1, CLEANUP => 1);

my @probes = (1, 4);
my @clients = (1, 2);
my @targets = (0.9);
my @cmd = ('perl', "$root/test/bench/run", '--quick', '--rows', 3000, '--dims', 16, '--queries', 40,
	'--seconds', 1, '--clients', join(',', @clients), '--probes', join(',', @probes),
	'--target-recalls', join(',', @targets), '--ef-search', 20, '--ivfflat-probes', 2, '--port', 5802,
	'--out', $out);
my $pgvector = !pgvector_missing();
note "running: @cmd";
my $t0 = time;
my $log = do { local $ENV{GPUIVF_TOOLS_DIR} = $tools; `@cmd 2>&1` };
my $rc = $?;
note $log;
is($rc, 0, 'test/bench/run --quick exits with status 0');
note sprintf('bench took %d s', time - $t0);

sub slurp_text
{
	my ($path) = @_;
	open my $fh, '<', $path or return undef;
	local $/;
	return <$fh>;
}

# A CSV with simple quoting (quoted fields hold no quotes) as hashes.
sub read_csv
{
	my ($path) = @_;
	my $text = slurp_text($path) // return;
	my @lines = split /\n/, $text;
	my @header = split /,/, shift @lines;
	my @rows;
	for my $line (@lines)
	{
		my @f;
		push @f, defined $1 ? $1 : $2 while $line =~ /\G(?:"([^"]*)"|([^,]*))(?:,|$)/g && @f < @header;
		my %r;
		@r{@header} = @f;
		push @rows, \%r;
	}
	return (\@header, \@rows);
}

# results.csv: one row per (gpuivf knob value, client count)
my ($header, $rows) = read_csv("$out/results.csv");
ok($header, 'results.csv exists');
is_deeply(
	$header,
	[
		qw(system device params rows dims queries metric knob value clients recall_at_10 qps
		  lat_avg_ms lat_p50_ms lat_p99_ms)
	],
	'results.csv has the documented header');
my $have_target = grep { /target_recall/ } map { $_->{knob} } @$rows;
my $expected = (@probes + ($have_target ? @targets : 0)) * @clients;
my @pgv = grep { $_->{system} =~ /^pgvector (hnsw|ivfflat)$/ } @$rows;
is(scalar(@$rows) - scalar(@pgv), $expected, "results.csv has $expected gpuivf rows (knob values x client counts)");
is(scalar(@pgv), $pgvector ? 2 * @clients : 0,
	$pgvector ? 'and the rows of pgvector\'s hnsw and ivfflat on the same table' : 'and none of pgvector (not installed)');
my @bad = grep {
	$_->{system} !~ /^(gpuivf|pgvector hnsw|pgvector ivfflat)$/
	  || $_->{rows} != 3000
	  || $_->{dims} != 16
	  || $_->{recall_at_10} !~ /^[\d.]+$/
	  || $_->{recall_at_10} < 0
	  || $_->{recall_at_10} > 1
	  || !($_->{qps} > 0)
	  || !($_->{lat_p99_ms} >= $_->{lat_p50_ms})
} @$rows;
is(scalar(@bad), 0, 'every results.csv row: a known system, 3000 x 16, recall in [0, 1], QPS > 0, p99 >= p50');
is_deeply([ sort { $a <=> $b } keys %{ { map { $_->{clients} => 1 } @$rows } } ],
	\@clients, 'results.csv covers every client count');
ok($have_target || slurp_text("$out/summary.md") =~ /target_recall sweep skipped/,
	'the target_recall sweep ran, or summary.md says why not');

my ($bheader, $builds) = read_csv("$out/build.csv");
ok($builds && @$builds == ($pgvector ? 3 : 1) && $builds->[0]{system} eq 'gpuivf' && $builds->[0]{build_s} > 0
	  && $builds->[0]{index_bytes} > 0,
	'build.csv has the gpuivf build with its time and size' . ($pgvector ? ', and hnsw\'s and ivfflat\'s' : ''));
like($builds->[0]{params} // '', $pgvector ? qr/vector\(16\)/ : qr/real\[\]/,
	'gpuivf indexed ' . ($pgvector ? 'the vector(16) column that pgvector indexes' : 'the real[] column'));

my $summary = slurp_text("$out/summary.md") // '';
ok($summary =~ /^\| system \| build \(s\) \| index size \(MB\) \| options \|\n\|---/m,
	'summary.md has the build table');
my @table = $summary =~ /^\| gpuivf \| \w+ \| (?:probes|target_recall) \| [\d.]+ \| \d+ \| [\d.]+ \| \d+ \| [\d.]+ \| [\d.]+ \|$/mg;
like($summary, qr/^## Side by side$/m, 'summary.md has the side-by-side table');
is(scalar(@table), $expected, 'summary.md has a recall/QPS table row per results.csv row');
ok($summary =~ /## Best QPS at recall\@10 >= 0.95/, 'summary.md has the best-QPS table');

my ($jheader, $joins) = read_csv("$out/batch_join.csv");
ok($jheader, 'batch_join.csv exists');
if ($summary =~ /batched kNN join skipped/)
{
	note 'batched kNN join skipped by the benchmark (see summary.md)';
	is(scalar(@$joins), 0, 'batch_join.csv has no rows when the join was skipped');
}
else
{
	is(scalar(@$joins), 2, 'batch_join.csv has the join with batching on and off');
	ok(!(grep { !($_->{seconds} > 0) || $_->{same_rows} ne 'yes' } @$joins),
		'batched join: timed, and on/off return the same neighbours');
	ok($summary =~ /## Batched kNN join/, 'summary.md has the batched join table');
}

my $matplotlib = grep { system("$_ -c 'import matplotlib' >/dev/null 2>&1") == 0 }
  ($ENV{GPUIVF_PYTHON} ? ($ENV{GPUIVF_PYTHON}) : ('python3', '/usr/bin/python3'));
SKIP:
{
	if (!$matplotlib)
	{
		like($summary, qr/PLOTS SKIPPED/, 'without matplotlib summary.md says the plots were skipped');
		skip 'matplotlib cannot be imported here: PNG plots not checked', 2;
	}
	for my $png (qw(recall_qps.png build.png))
	{
		my $head = '';
		if (open my $fh, '<:raw', "$out/$png") { read $fh, $head, 8 }
		is($head, "\x89PNG\r\n\x1a\n", "$png is a PNG file");
	}
}

done_testing();
