
# ANALYZE calibrates nprobe to a recall target.  After ANALYZE,
# queries with the default settings (gpuivf.probes = 0, target_recall 0.95)
# must reach recall@10 >= 0.95 against exact results, on held-out queries
# that were not part of the calibration sample (generated queries are drawn
# from the mixture, not from the table; siftsmall and mnist-10k queries are
# not base rows).  SET gpuivf.target_recall = 0.99 must give >= 0.98 with
# more probes.  For each data set the test also notes how far the chosen
# nprobe is from the smallest nprobe that really meets the target on the
# held-out queries (a measurement, not an assertion).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $k = 10;
my $node = gpuivf_node('analyze_recall');

# The curve of an index as [[nprobe, recall], ...].
sub curve
{
	my ($index) = @_;
	my $out = $node->safe_psql('postgres', qq{
		SELECT p->>'nprobe', p->>'recall'
		FROM jsonb_array_elements(gpuivf_index_info('$index')->'calibration'->'curve') p});
	return [ map { [ split /\|/ ] } split /\n/, $out ];
}

sub probes_in_use
{
	my ($index, $settings) = @_;
	return $node->safe_psql('postgres',
		($settings // '') . " SELECT gpuivf_index_info('$index')->'probes'->>'in_use'");
}

# Held-out recall@10 of the index under some settings.
sub heldout_recall
{
	my ($table, $metric, $queries, $truth, $settings) = @_;
	return recall_at(knn_ids($node, $table, $metric, $queries, $k, settings => $settings),
		$truth, $k);
}

# The smallest measured nprobe whose held-out recall really meets target
# (looked for among the curve's points), or undef.
sub true_smallest
{
	my ($table, $metric, $queries, $truth, $curve, $target) = @_;
	for my $p (@$curve)
	{
		my $r = heldout_recall($table, $metric, $queries, $truth, "SET gpuivf.probes = $p->[0];");
		return ($p->[0], $r) if $r >= $target;
	}
	return (undef, undef);
}

# Calibrate an index with ANALYZE and check the default and 0.99 targets.
sub check_index
{
	my ($label, $table, $index, $metric, $queries, $truth) = @_;

	$node->safe_psql('postgres', "ANALYZE $table");
	my $info = index_info($node, $index);
	my $curve = curve($index);
	ok(@$curve >= 2, "$label: ANALYZE stored a curve of " . scalar(@$curve) . ' points');
	like($info->{probes}, qr/"source": "curve"/, "$label: default scans take nprobe from the curve");
	note "$label: curve " . join(' ', map { "$_->[0]:$_->[1]" } @$curve);

	my $chosen = probes_in_use($index);
	my $r = heldout_recall($table, $metric, $queries, $truth, '');
	cmp_ok($r, '>=', 0.95,
		sprintf('%s: default settings (nprobe %d from the curve) give held-out recall@10 = %.4f >= target 0.95',
			$label, $chosen, $r));
	my ($best, $best_r) = true_smallest($table, $metric, $queries, $truth, $curve, 0.95);
	note sprintf('%s: target 0.95: chosen nprobe %d (held-out %.4f), smallest meeting it on held-out queries %s (%s)',
		$label, $chosen, $r, $best // 'none', defined $best_r ? sprintf('%.4f', $best_r) : '-');

	my $set99 = 'SET gpuivf.target_recall = 0.99;';
	my $chosen99 = probes_in_use($index, $set99);
	my $r99 = heldout_recall($table, $metric, $queries, $truth, $set99);
	cmp_ok($chosen99, '>', $chosen, "$label: target 0.99 probes more lists ($chosen99 > $chosen)");
	cmp_ok($r99, '>=', 0.98,
		sprintf('%s: target 0.99 (nprobe %d) gives held-out recall@10 = %.4f >= 0.98', $label, $chosen99, $r99));
	my ($best99, $best99_r) = true_smallest($table, $metric, $queries, $truth, $curve, 0.99);
	note sprintf('%s: target 0.99: chosen nprobe %d (held-out %.4f), smallest meeting it on held-out queries %s (%s)',
		$label, $chosen99, $r99, $best99 // 'none', defined $best99_r ? sprintf('%.4f', $best99_r) : '-');
	return;
}

# ---------------------------------------------------------- generated data

my $data = generate_data(rows => 30000, dims => 64, queries => 400, seed => 11);
my $queries = read_fvecs($data->{query_fvecs});
load_vectors($node, 'items', $data->{base_copy});
for my $metric (qw(l2 ip cosine))
{
	my $opclass = metric_opclass($metric);
	my $index = "items_${metric}_idx";
	my ($rc, $out, $err) = $node->psql('postgres',
		"SET client_min_messages = debug1; CREATE INDEX $index ON items USING gpuivf (v $opclass) WITH (lists = 150)");
	is($rc, 0, "generated $metric: CREATE INDEX");
	like($err, qr/calibrated on \d+ queries from rows \(drawn by the build's encoding scan\): sample \d+ ms/,
		"generated $metric: calibration took the sample the encoding scan drew");
	# CREATE INDEX measured the curve already
	isnt($node->safe_psql('postgres', "SELECT gpuivf_index_info('$index')->'calibration'"),
		'null', "generated $metric: CREATE INDEX measured a curve");
	my $built = curve($index);
	my $truth = ground_truth($data->{base_fvecs}, $data->{query_fvecs}, $k, $metric);
	check_index("generated 30000x64 $metric", 'items', $index, $metric, $queries, $truth);
	# CREATE INDEX drew its sample in the encoding scan, ANALYZE by walking
	# the rows: the same rows, so the same curve
	is_deeply(curve($index), $built,
		"generated $metric: ANALYZE measures the curve CREATE INDEX measured");
	$node->safe_psql('postgres', "DROP INDEX $index");
}

# A target the curve cannot reach: the best point, and a NOTICE once.
$node->safe_psql('postgres', q{
	CREATE INDEX items_codes_idx ON items USING gpuivf (v)
	WITH (lists = 150, pq_bits = 4, rerank = false)});
my $codes_built = curve('items_codes_idx');
$node->safe_psql('postgres', 'ANALYZE items');
is_deeply(curve('items_codes_idx'), $codes_built,
	'no vectors: ANALYZE (sample drawn from the heap) measures the curve CREATE INDEX measured');
my $q0 = vec_literal($queries->[0]);
my ($ret, $out, $err) = $node->psql('postgres', qq{
	SET gpuivf.target_recall = 1; SET enable_seqscan = off;
	SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> $q0 LIMIT 10) s;
	SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> $q0 LIMIT 10) s;
	SELECT gpuivf_index_info('items_codes_idx')->'probes'->>'target_reached'});
is($ret, 0, 'unreachable target: queries run');
like($out, qr/false$/, 'unreachable target: target_reached is false');
my @notices = ($err =~ /NOTICE:  recall target 1.000 of index "items_codes_idx" \(gpuivf.target_recall\) is above the best recall/g);
is(scalar(@notices), 1, 'unreachable target: said once per backend, in a NOTICE')
  or diag($err);
$node->safe_psql('postgres', 'DROP INDEX items_codes_idx');
$node->safe_psql('postgres', 'DROP TABLE items');

# ---------------------------------------------------------------- real data

my $data_dir = shared_data_dir();
SKIP:
{
	my $sift = defined $data_dir ? "$data_dir/siftsmall" : undef;
	skip 'siftsmall not found (../shared/data or $GPUIVF_DATA_DIR): not tested on SIFT10K', 7
	  unless defined $sift && -f "$sift/siftsmall_base.fvecs";
	load_vectors($node, 'sift', convert_data("$sift/siftsmall_base.fvecs"));
	$node->safe_psql('postgres', 'CREATE INDEX sift_idx ON sift USING gpuivf (v) WITH (lists = 100)');
	check_index('siftsmall', 'sift', 'sift_idx', 'l2', read_fvecs("$sift/siftsmall_query.fvecs"),
		read_ivecs("$sift/siftsmall_groundtruth.ivecs"));
	$node->safe_psql('postgres', 'DROP TABLE sift');
}

SKIP:
{
	my $mnist = defined $data_dir ? "$data_dir/mnist-10k" : undef;
	skip 'mnist-10k not found (../shared/data or $GPUIVF_DATA_DIR): not tested on MNIST', 7
	  unless defined $mnist && -f "$mnist/mnist10k_base.bvecs";
	load_vectors($node, 'mnist', convert_data("$mnist/mnist10k_base.bvecs"));
	$node->safe_psql('postgres', 'CREATE INDEX mnist_idx ON mnist USING gpuivf (v) WITH (lists = 90)');
	# 300 of the 1,000 queries keep the test short
	my $mq = read_fvecs("$mnist/mnist10k_query.bvecs", 300);
	my $mt = read_ivecs("$mnist/mnist10k_groundtruth.ivecs");
	splice(@$mt, 300);
	check_index('mnist-10k', 'mnist', 'mnist_idx', 'l2', $mq, $mt);
	$node->safe_psql('postgres', 'DROP TABLE mnist');
}

$node->stop;
done_testing();
