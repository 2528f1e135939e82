
# The GPU worker on pgvector's types, with the CPU stand-in of the GPU engine
# (test/gpu/fake_engine.cpp): indexes of vector, halfvec (the worker's copy
# keeps halves: about half the bytes of the vector copy) and vectors re-ranked
# from the table (the copy holds codes only; the worker returns ADC
# candidates, the backend re-ranks them from the table) are built, calibrated
# and searched through the worker, and answer exactly as on the CPU —
# also in a batched LATERAL join and after inserts.  Skipped, with the
# reason, without pgvector or the stand-in engine.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $why = pgvector_missing();
plan skip_all => $why if $why;
my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my $node = fake_gpu_node('vector_worker', $fake);
$node->safe_psql('postgres', 'CREATE EXTENSION gpuivf_vector CASCADE');
is(poll_until($node, 'SELECT state FROM gpuivf_stat WHERE worker = 0', 'ready'), 'ready',
	'the worker is ready with the stand-in engine');

$node->safe_psql('postgres', 'SELECT setseed(0.503);' . grouped_items_sql(6000, 29, 0.2) . q{
	CREATE TABLE items_v AS SELECT id, v::vector(16) AS v FROM items;
	CREATE TABLE items_h AS SELECT id, v::halfvec(16) AS v FROM items;
	CREATE TABLE items_t AS SELECT id, v::vector(16) AS v FROM items;
	SET gpuivf.device = gpu;
	CREATE INDEX items_v_idx ON items_v USING gpuivf (v vector_cosine_ops) WITH (lists = 40);
	CREATE INDEX items_h_idx ON items_h USING gpuivf (v halfvec_l2_ops) WITH (lists = 40);
	CREATE INDEX items_t_idx ON items_t USING gpuivf (v vector_ip_ops) WITH (lists = 40, rerank_from = 'table');
});
cmp_ok(worker_stat($node, 'builds'), '>=', 6, 'the three indexes were trained and encoded on the worker');

# answers on the worker equal the CPU's, ids and distances
my %op = (items_v => '<=>', items_h => '<->', items_t => '<#>');
sub answers
{
	my ($table, $device, $extra) = @_;
	my $op = $op{$table};
	my $sql = exact_settings() . " SET gpuivf.device = $device; SET gpuivf.probes = 3;\n";
	$sql .= "SELECT ARRAY(SELECT id || ':' || (v $op (SELECT v FROM $table WHERE id = $_)) FROM $table "
	  . "ORDER BY v $op (SELECT v FROM $table WHERE id = $_) LIMIT 10);\n" for 1 .. 40;
	return $node->safe_psql('postgres', $sql);
}
for my $table (qw(items_v items_h items_t))
{
	my $q0 = worker_stat($node, 'queries');
	my $gpu = answers($table, 'gpu');
	cmp_ok(worker_stat($node, 'queries') - $q0, '>=', 40, "$table: the 40 searches ran on the worker");
	is($gpu, answers($table, 'cpu'), "$table: the worker's answers equal the CPU's (ids and distances)");
}

# the worker's copies: halves for halfvec, codes only when re-ranking from the table
sub cache_bytes
{
	my ($index) = @_;
	return $node->safe_psql('postgres', "SELECT coalesce(sum((c->>'bytes')::bigint), 0)
		FROM jsonb_array_elements(gpuivf_index_info('$index') -> 'gpu_cache') c");
}
my %bytes = map { $_ => cache_bytes($_) } qw(items_v_idx items_h_idx items_t_idx);
note explain \%bytes;
cmp_ok($bytes{items_h_idx}, '<', $bytes{items_v_idx} * 0.8,
	"the halfvec copy is smaller ($bytes{items_h_idx} bytes) than the vector copy ($bytes{items_v_idx})");
cmp_ok($bytes{items_t_idx}, '<', $bytes{items_h_idx},
	"the copy of an index re-ranking from the table holds no vectors ($bytes{items_t_idx} bytes)");

# a batched LATERAL join on a vector column: one request, the nested loop's rows
my $join = q{
	SELECT q.id, n.id FROM (SELECT id, v FROM items_h WHERE id <= 30) q
	CROSS JOIN LATERAL (SELECT id FROM items_h ORDER BY v <-> q.v LIMIT 5) n ORDER BY 1, 2};
my $settings = 'SET gpuivf.device = gpu; SET gpuivf.probes = 3;';
like($node->safe_psql('postgres', "$settings EXPLAIN (COSTS OFF) $join"), qr/GpuivfBatchKnn/,
	'the LATERAL join over a halfvec column is batched');
is($node->safe_psql('postgres', "$settings $join"),
	$node->safe_psql('postgres', "$settings SET gpuivf.enable_batch_join = off; $join"),
	'the batched join returns the nested loop\'s rows');

# committed inserts are found by the next search on the worker (rows of
# this data are non-negative: a long all-positive vector has the largest
# inner product with every query)
$node->safe_psql('postgres', q{
	INSERT INTO items_t VALUES (-1, array_fill(10::real, ARRAY[16])::vector(16));
	INSERT INTO items_h VALUES (-1, (SELECT v FROM items_h WHERE id = 77));
});
like($node->safe_psql('postgres', exact_settings() . q{ SET gpuivf.device = gpu; SET gpuivf.probes = 3;
	SELECT string_agg(id::text, ',') FROM (SELECT id FROM items_h
	ORDER BY v <-> (SELECT v FROM items_h WHERE id = 77) LIMIT 2) s}), qr/^(-1,77|77,-1)$/,
	'items_h: a committed insert is found by the worker\'s next search');
my $q0 = worker_stat($node, 'queries');
is($node->safe_psql('postgres', exact_settings() . q{ SET gpuivf.device = gpu; SET gpuivf.probes = 3;
	SELECT id FROM items_t ORDER BY v <#> (SELECT v FROM items_t WHERE id = 77) LIMIT 1}), '-1',
	'items_t: a committed insert is found by the worker\'s next search');
cmp_ok(worker_stat($node, 'queries'), '>', $q0, 'items_t: that search ran on the worker');

# gpuivf_worker_search takes real[]: vector and halfvec cast to it
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM gpuivf_worker_search('items_t_idx', (SELECT v::real[] FROM items_t WHERE id = 5), 10, 3)}),
	'10', 'gpuivf_worker_search on an index re-ranking from the table');

$node->stop;
done_testing();
