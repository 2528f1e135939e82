
# Recall on real data: ANN_SIFT10K (siftsmall, 10,000 x 128 SIFT descriptors,
# 100 queries) with its official ground truth, read from ../shared/data (or
# GPUIVF_DATA_DIR).  Skipped, visibly, when the data is not there: it is never
# part of the repository.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $data_dir = shared_data_dir();
my $sift = defined $data_dir ? "$data_dir/siftsmall" : undef;
if (!defined $sift || !-f "$sift/siftsmall_base.fvecs")
{
	plan skip_all => 'siftsmall not found (looked in ../shared/data and $GPUIVF_DATA_DIR): real-data recall not tested';
}

my $k = 10;
my $node = gpuivf_node('sift');
load_vectors($node, 'sift', convert_data("$sift/siftsmall_base.fvecs"));
my $queries = read_fvecs("$sift/siftsmall_query.fvecs");
my $truth = read_ivecs("$sift/siftsmall_groundtruth.ivecs");
is(scalar(@$queries), 100, '100 queries');
is($node->safe_psql('postgres', 'SELECT count(*) FROM sift'), '10000', '10,000 base vectors loaded');

# Defaults: CREATE INDEX with no options, automatic probes.
$node->safe_psql('postgres', 'CREATE INDEX sift_default_idx ON sift USING gpuivf (v)');
my $info = index_info($node, 'sift_default_idx');
note "default index: lists $info->{lists}, pq_m $info->{pq_m}, pq_bits $info->{pq_bits}";
my $r = recall_at(knn_ids($node, 'sift', 'l2', $queries, $k), $truth, $k);
cmp_ok($r, '>=', 0.95, sprintf('defaults (lists %d, probes automatic): recall@10 = %.3f (floor 0.95)', $info->{lists}, $r));
$node->safe_psql('postgres', 'DROP INDEX sift_default_idx');

# 100 rows per list, swept over probes.  A plain IVF-flat partition of this
# data reaches about 0.50, 0.70, 0.87, 0.96, 1.00 at 1, 2, 4, 8, 16 probes
# (test/tools/gpuivf_ivfcurve); PQ candidates re-ranked exactly stay close.
$node->safe_psql('postgres', 'CREATE INDEX sift_idx ON sift USING gpuivf (v) WITH (lists = 100)');
my %floor = (1 => 0.45, 2 => 0.65, 4 => 0.80, 8 => 0.90, 16 => 0.95);
for my $probes (sort { $a <=> $b } keys %floor)
{
	my $res = knn_ids($node, 'sift', 'l2', $queries, $k, settings => "SET gpuivf.probes = $probes;");
	$r = recall_at($res, $truth, $k);
	cmp_ok($r, '>=', $floor{$probes},
		sprintf('lists = 100: recall@10 at %d probes = %.3f (floor %.2f)', $probes, $r, $floor{$probes}));
}
$r = recall_at(knn_ids($node, 'sift', 'l2', $queries, $k, settings => 'SET gpuivf.probes = 100;'), $truth, $k);
is($r, 1, sprintf('exact mode (probes = lists) matches the official ground truth: recall@10 = %.3f', $r));

$node->safe_psql('postgres', q{SELECT gpuivf_verify('sift_idx', true)});
pass('gpuivf_verify(sift_idx, true) passes');

$node->stop;
done_testing();
