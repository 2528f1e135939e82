
# When the queries come from the rows' own distribution, calibrating on rows
# (CREATE INDEX, ANALYZE) and calibrating on the recorded workload both keep
# held-out recall@10 and recall@100 within [target - 0.01, target + 0.03] for
# targets 0.90, 0.95 and 0.99 (generated data: queries drawn from the rows'
# mixture).  On SIFT10K, calibrated on rows, every target is met (recall >=
# target - 0.01); its 100 official queries are easier than its rows (at the
# same probes they get more recall than rows do), so above the target the
# margin is wider there: measured and shown, not asserted.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my @targets = (0.90, 0.95, 0.99);
my @ks = (10, 100);
my $node = gpuivf_node('calibrate_in_distribution', conf => qq(
shared_preload_libraries = 'gpuivf'
gpuivf.query_sample = 1000
));

# recall of queries through index $index at every target and k: [[t, k, probes, recall], ...]
sub measure
{
	my ($table, $index, $queries, $truth) = @_;
	my @rows;
	for my $t (@targets)
	{
		$node->safe_psql('postgres', "ALTER INDEX $index SET (target_recall = $t)");
		for my $k (@ks)
		{
			my $r = recall_at(knn_ids($node, $table, 'l2', $queries, $k,
					settings => 'SET gpuivf.query_sample = 0;'), $truth, $k);
			my $p = $node->safe_psql('postgres',
				"SELECT gpuivf_index_info('$index') #>> '{probes,by_limit,$k}'");
			push @rows, [ $t, $k, $p, $r ];
		}
	}
	$node->safe_psql('postgres', "ALTER INDEX $index RESET (target_recall)");
	return \@rows;
}

sub check_band
{
	my ($label, $rows) = @_;
	for my $m (@$rows)
	{
		my ($t, $k, $p, $r) = @$m;
		ok($r >= $t - 0.01 && $r <= $t + 0.03,
			sprintf('%s: target %.2f, LIMIT %d: %d probes, held-out recall@%d %.4f in [%.2f, %.2f]',
				$label, $t, $k, $p, $k, $r, $t - 0.01, $t + 0.03));
	}
}

# ---------------------------------------------------------- generated
my $n = 500;
my $data = generate_data(rows => 20000, dims => 32, queries => 2 * $n, seed => 7);
load_vectors($node, 'items', $data->{base_copy});
my $queries = read_fvecs($data->{query_fvecs});
my $truth = ground_truth($data->{base_fvecs}, $data->{query_fvecs}, 100, 'l2');
my @workload = @{$queries}[ 0 .. $n - 1 ];
my @held = @{$queries}[ $n .. 2 * $n - 1 ];
my @held_truth = @{$truth}[ $n .. 2 * $n - 1 ];

$node->safe_psql('postgres', qq{
	SET gpuivf.analyze_sample = $n;
	CREATE INDEX items_idx ON items USING gpuivf (v) WITH (lists = 250, pq_m = 16)});
is($node->safe_psql('postgres', q{SELECT gpuivf_index_info('items_idx') #>> '{calibration,source}'}),
	'rows', 'generated: calibrated on rows');
check_band('generated, calibrated on rows', measure('items', 'items_idx', \@held, \@held_truth));

knn_ids($node, 'items', 'l2', \@workload, 10);
$node->safe_psql('postgres', "SET gpuivf.analyze_sample = $n; ANALYZE items");
is($node->safe_psql('postgres', q{SELECT gpuivf_index_info('items_idx') #>> '{calibration,source}'}),
	'workload', 'generated: ANALYZE calibrated on the recorded queries');
is($node->safe_psql('postgres', q{SELECT gpuivf_index_info('items_idx') #>> '{recorded_queries,drifted}'}),
	'false', 'generated: queries like the rows are no drift');
check_band('generated, calibrated on recorded queries', measure('items', 'items_idx', \@held, \@held_truth));

# ------------------------------------------------------------ SIFT10K
SKIP:
{
	my $data_dir = shared_data_dir();
	my $sift = defined $data_dir ? "$data_dir/siftsmall" : undef;
	skip 'siftsmall not found (../shared/data or $GPUIVF_DATA_DIR): not tested on SIFT10K', 6
	  unless defined $sift && -f "$sift/siftsmall_base.fvecs";
	load_vectors($node, 'sift', convert_data("$sift/siftsmall_base.fvecs"));
	$node->safe_psql('postgres', 'CREATE INDEX sift_idx ON sift USING gpuivf (v) WITH (lists = 100)');
	my $rows = measure('sift', 'sift_idx', read_fvecs("$sift/siftsmall_query.fvecs"),
		read_ivecs("$sift/siftsmall_groundtruth.ivecs"));
	for my $m (@$rows)
	{
		my ($t, $k, $p, $r) = @$m;
		cmp_ok($r, '>=', $t - 0.01,
			sprintf('SIFT10K, calibrated on rows: target %.2f, LIMIT %d: %d probes, recall@%d %.4f (%+.3f)',
				$t, $k, $p, $k, $r, $r - $t));
	}
}

$node->stop;
done_testing();
