
# Queries from another distribution than the rows (a subset of the clusters,
# spread wider, shifted: gpuivf_gen --query-*): the curve ANALYZE measures on
# rows promises more recall than these queries get.  Once the index has
# answered such queries (recorded in shared memory) and ANALYZE ran, or after
# gpuivf_calibrate on queries of that distribution, held-out queries of the
# same distribution get recall@10 and recall@100 within [target - 0.01,
# target + 0.03] for targets 0.90, 0.95 and 0.99, set per index with the
# target_recall option.  The queries that recorded the workload and those
# that measure it are disjoint.  Along the way: the drift notice (once), the
# recorded queries' count, and gpuivf_index_info's calibration source.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my @targets = (0.90, 0.95, 0.99);
my @ks = (10, 100);
my $calib_n = 500;      # queries recorded / given
my $held_n = 500;       # held-out queries measured

# shared_preload_libraries: the reservoirs of recorded queries live in
# shared memory (the GPU worker finds no GPU and sleeps; scans run on the CPU)
my $node = gpuivf_node('calibrate_workload', conf => qq(
shared_preload_libraries = 'gpuivf'
gpuivf.analyze_sample = $calib_n
gpuivf.query_sample = 1000
));

# 20,000 x 32 rows; 1,000 queries from another distribution: the first 500
# are the workload, the other 500 are held out
my $data = generate_data(rows => 20000, dims => 32, queries => $calib_n + $held_n, seed => 7,
	query_options => [ '--query-clusters', 20, '--query-spread', 1.5, '--query-shift', 1.5 ]);
load_vectors($node, 'items', $data->{base_copy});
load_vectors($node, 'ood_queries', $data->{query_copy});
my $queries = read_fvecs($data->{query_fvecs});
my @workload = @{$queries}[ 0 .. $calib_n - 1 ];
my @held = @{$queries}[ $calib_n .. $calib_n + $held_n - 1 ];
my $truth = ground_truth($data->{base_fvecs}, $data->{query_fvecs}, 100, 'l2');
my @held_truth = @{$truth}[ $calib_n .. $calib_n + $held_n - 1 ];

# 250 lists: fine enough steps of recall per probe for the band
$node->safe_psql('postgres',
	'CREATE INDEX items_idx ON items USING gpuivf (v) WITH (lists = 250, pq_m = 16)');

sub info
{
	my ($path) = @_;
	return $node->safe_psql('postgres', "SELECT gpuivf_index_info('items_idx') #>> '{$path}'");
}

# held-out queries are measured with recording off (gpuivf.query_sample = 0),
# so that no calibration ever sees them
sub held_recall
{
	my ($k) = @_;
	return recall_at(knn_ids($node, 'items', 'l2', \@held, $k, settings => 'SET gpuivf.query_sample = 0;'),
		\@held_truth, $k);
}

# Every target and k within the band; a table of what was measured.
sub check_band
{
	my ($label) = @_;
	for my $t (@targets)
	{
		$node->safe_psql('postgres', "ALTER INDEX items_idx SET (target_recall = $t)");
		for my $k (@ks)
		{
			my $r = held_recall($k);
			my $probes = info("probes,by_limit,$k");
			ok($r >= $t - 0.01 && $r <= $t + 0.03,
				sprintf('%s: target %.2f, LIMIT %d: %d probes, held-out recall@%d %.4f in [%.2f, %.2f]',
					$label, $t, $k, $probes, $k, $r, $t - 0.01, $t + 0.03));
		}
	}
	$node->safe_psql('postgres', 'ALTER INDEX items_idx RESET (target_recall)');
}

# --------------------------------------------------- calibrated on rows
is(info('calibration,source'), 'rows', 'CREATE INDEX calibrates on rows');
for my $t (@targets)
{
	$node->safe_psql('postgres', "ALTER INDEX items_idx SET (target_recall = $t)");
	my ($p10, $p100) = (info('probes,by_limit,10'), info('probes,by_limit,100'));
	my ($r10, $r100) = (held_recall(10), held_recall(100));
	cmp_ok($r10, '<', $t - 0.01,
		sprintf('calibrated on rows, target %.2f: %d probes give these queries recall@10 %.4f, below the target '
			  . '(LIMIT 100: %d probes, recall@100 %.4f)', $t, $p10, $r10, $p100, $r100));
}
my $rows_nn = info('calibration,nearest_centre_distance,mean');
$node->safe_psql('postgres', 'ALTER INDEX items_idx RESET (target_recall)');

# ------------------------------------------------ the workload, recorded
# (one session: the drift notice comes once, from the server)
my ($ret, $out, $err) = $node->psql('postgres',
	exact_settings() . join('', map { 'SELECT ARRAY(SELECT id FROM items ORDER BY v <-> ' . vec_literal($_) . " LIMIT 10);\n" } @workload));
is($ret, 0, "$calib_n workload queries ran");
my @drift = ($err =~ /NOTICE:  queries of gpuivf index "items_idx" have drifted from those it was calibrated on/g);
is(scalar(@drift), 1, 'the drift from the rows is noticed once') or diag($err);
like($err, qr/HINT:  Run ANALYZE on its table/, 'with a hint to run ANALYZE');
is(info('recorded_queries,seen'), $calib_n, "$calib_n queries recorded");
is(info('recorded_queries,drifted'), 'true', 'gpuivf_index_info says so too');
my $rec_nn = info('recorded_queries,nearest_centre_distance');
cmp_ok($rec_nn, '>', 1.2 * $rows_nn,
	"recorded queries lie farther from the list centres ($rec_nn) than the rows ($rows_nn)");

$node->safe_psql('postgres', 'ANALYZE items');
is(info('calibration,source'), 'workload', 'ANALYZE calibrates on the recorded queries');
is(info('calibration,sample'), $calib_n, "on $calib_n of them");
is(info('calibration,stored_queries'), $calib_n, 'and stores them in the index');
is(info('recorded_queries,seen'), 0, 'the reservoir starts again');
note 'curve per k: ' . $node->safe_psql('postgres', q{
	SELECT string_agg('k=' || (c->>'k') || ' ' || (SELECT string_agg((p->>'nprobe') || ':' || (p->>'recall'), ' ')
	  FROM jsonb_array_elements(c->'curve') p WHERE (p->>'nprobe')::int IN (4, 8, 12, 16, 25, 31, 41)), ' | ')
	FROM jsonb_array_elements(gpuivf_index_info('items_idx')->'calibration'->'curves') c});
check_band('recorded workload');

# ------------------------------------------------------- given queries
$node->safe_psql('postgres', q{SELECT gpuivf_calibrate('items_idx', NULL)});
is(info('calibration,source'), 'rows', 'gpuivf_calibrate(index, NULL) goes back to rows');
is(info('calibration,stored_queries'), 0, 'and forgets the stored queries');
my $given = $node->safe_psql('postgres',
	qq{SELECT gpuivf_calibrate('items_idx', 'SELECT v FROM ood_queries WHERE id < $calib_n') #>> '{calibration,source}'});
is($given, 'given', 'gpuivf_calibrate calibrates on the given queries');
is(info('calibration,sample'), $calib_n, "all $calib_n of them");
check_band('given queries');

# the next ANALYZE measures on the given queries again (nothing recorded since)
is(info('recorded_queries,seen'), 0, 'measuring with gpuivf.query_sample = 0 recorded nothing');
$node->safe_psql('postgres', 'ANALYZE items');
is(info('calibration,source'), 'given', 'ANALYZE measures on the given queries again, not on rows');

$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_idx', true)});
pass('the index verifies');

$node->stop;
done_testing();
