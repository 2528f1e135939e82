
# pg_dump / pg_restore of a table with gpuivf indexes: the index definitions
# (operator class, options) come back, the restored indexes pass
# gpuivf_verify(…, true) and answer like the originals: identically in exact
# mode, with nearly the same approximate top-10.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('dump');
my $data = generate_data(rows => 5000, dims => 32, queries => 30, seed => 9);
my $queries = read_fvecs($data->{query_fvecs});

$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql('src', 'CREATE EXTENSION gpuivf');
load_vectors($node, 'items', $data->{base_copy}, dbname => 'src');
$node->safe_psql('src', q{
	INSERT INTO items VALUES (-1, NULL);
	CREATE INDEX items_l2_idx ON items USING gpuivf (v) WITH (lists = 25, pq_m = 8);
	CREATE INDEX items_cos_idx ON items USING gpuivf (v float4_cosine_ops) WITH (lists = 10, pq_bits = 4, rerank = false);
});

my $dump = PostgreSQL::Test::Utils::tempdir() . '/src.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-h', $node->host, '-p', $node->port, '-f', $dump, 'src' ], 'pg_dump -Fc');
$node->safe_psql('postgres', 'CREATE DATABASE dst');
$node->command_ok([ 'pg_restore', '-h', $node->host, '-p', $node->port, '-d', 'dst', $dump ], 'pg_restore');

my $defs = q{SELECT indexdef FROM pg_indexes WHERE tablename = 'items' ORDER BY indexname};
is($node->safe_psql('dst', $defs), $node->safe_psql('src', $defs), 'index definitions (opclass, options) are restored');
like($node->safe_psql('dst', $defs), qr/pq_bits='?4'?.*rerank='?false'?/, 'options survive: pq_bits = 4, rerank = false');
is($node->safe_psql('dst', 'SELECT count(*) FROM items'), '5001', 'all rows restored');

for my $index (qw(items_l2_idx items_cos_idx))
{
	$node->safe_psql('dst', "SELECT gpuivf_verify('$index', true)");
	pass("restored $index passes gpuivf_verify(…, true)");
	my ($a, $b) = map { index_info($node, $index, $_) } qw(src dst);
	is_deeply([ @$b{qw(metric lists pq_m pq_bits rerank vectors)} ], [ @$a{qw(metric lists pq_m pq_bits rerank vectors)} ],
		"restored $index has the same metric, lists, pq_m, pq_bits, rerank and vector count");
}

# Exact mode: identical answers.  The l2 index stores vectors, so with all
# lists probed it must equal brute force in both databases.
my $exact = knn_ids($node, 'items', 'l2', $queries, 10, dbname => 'src', settings => 'SET gpuivf.probes = 25;');
is_deeply(knn_ids($node, 'items', 'l2', $queries, 10, dbname => 'dst', settings => 'SET gpuivf.probes = 25;'),
	$exact, 'exact-mode top-10 is the same after restore');

# Approximate answers: the rebuilt index was trained on the same rows.
for my $case ([ 'l2', 'SET gpuivf.probes = 3;' ], [ 'cosine', 'SET gpuivf.probes = 2;' ])
{
	my ($metric, $settings) = @$case;
	my $before = knn_ids($node, 'items', $metric, $queries, 10, dbname => 'src', settings => $settings);
	my $after = knn_ids($node, 'items', $metric, $queries, 10, dbname => 'dst', settings => $settings);
	my $overlap = recall_at($after, $before, 10);
	note sprintf('%s: %s identical top-10 lists out of %d', $metric,
		scalar(grep { join(',', @{ $before->[$_] }) eq join(',', @{ $after->[$_] }) } 0 .. $#$before), scalar @$before);
	cmp_ok($overlap, '>=', 0.9, sprintf('%s approximate top-10 overlap before/after restore = %.3f', $metric, $overlap));
}

$node->stop;
done_testing();
