
# Recall floors on generated clustered data (gpuivf_gen: decaying spectrum,
# overlapping clusters of uneven size and spread) for L2, inner product and
# cosine, against exact ground truth from gpuivf_gt.  The floors sit below the
# measured values with a margin; the measured recall is printed.  With
# gpuivf.probes = lists (exact mode) the index must agree with brute force.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $k = 10;
my $lists = 100;
my $node = gpuivf_node('recall');
my $data = generate_data(rows => 20000, dims => 64, queries => 200, seed => 7);
my $queries = read_fvecs($data->{query_fvecs});
load_vectors($node, 'items', $data->{base_copy});

# Floors of recall@10 per metric and probe count (of 100 lists).
my %floor = (
	l2 => { 1 => 0.45, 4 => 0.78, 16 => 0.95, 32 => 0.97 },
	ip => { 1 => 0.45, 4 => 0.80, 16 => 0.94, 32 => 0.97 },
	cosine => { 1 => 0.42, 4 => 0.78, 16 => 0.95, 32 => 0.97 },
);
for my $metric (qw(l2 ip cosine))
{
	my $opclass = metric_opclass($metric);
	my $index = "items_${metric}_idx";
	$node->safe_psql('postgres',
		"CREATE INDEX $index ON items USING gpuivf (v $opclass) WITH (lists = $lists)");
	my $info = index_info($node, $index);
	is($info->{lists}, $lists, "$metric: index has $lists lists");

	my $truth = ground_truth($data->{base_fvecs}, $data->{query_fvecs}, $k, $metric);
	assert_index_scan($node, $index,
		'SELECT id FROM items ORDER BY v ' . metric_operator($metric) . ' ' . vec_literal($queries->[0]) . ' LIMIT 10',
		'', "$metric: kNN queries use $index");

	for my $probes (sort { $a <=> $b } keys %{ $floor{$metric} })
	{
		my $res = knn_ids($node, 'items', $metric, $queries, $k, settings => "SET gpuivf.probes = $probes;");
		my $r = recall_at($res, $truth, $k);
		cmp_ok($r, '>=', $floor{$metric}{$probes},
			sprintf('%s: recall@10 at %d probes = %.3f (floor %.2f)', $metric, $probes, $r, $floor{$metric}{$probes}));
	}
	my $res = knn_ids($node, 'items', $metric, $queries, $k, settings => "SET gpuivf.probes = $lists;");
	my $r = recall_at($res, $truth, $k);
	cmp_ok($r, '>=', 0.999, sprintf('%s: exact mode (probes = lists) recall@10 = %.4f', $metric, $r));

	# Drop it so the next metric's queries cannot pick it (one index per
	# operator family anyway, but keeps the table light).
	$node->safe_psql('postgres', "DROP INDEX $index");
}

# Codes alone (no stored vectors, 4-bit PQ): lower, but still useful.
$node->safe_psql('postgres', q{
	CREATE INDEX items_codes_idx ON items USING gpuivf (v)
	WITH (lists = 100, pq_bits = 4, rerank = false)});
my $truth = ground_truth($data->{base_fvecs}, $data->{query_fvecs}, $k, 'l2');
my $res = knn_ids($node, 'items', 'l2', $queries, $k, settings => 'SET gpuivf.probes = 16;');
my $r = recall_at($res, $truth, $k);
cmp_ok($r, '>=', 0.32, sprintf('l2, rerank = false, pq_bits = 4: recall@10 at 16 probes = %.3f (floor 0.32)', $r));

$node->stop;
done_testing();
