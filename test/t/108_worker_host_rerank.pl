# Copyright (c) gpuivf authors
#
# An index larger than the GPU (CPU stand-in engine, one fake device): when
# the copy with the re-rank vectors does not fit gpuivf.gpu_memory_limit but
# its codes do, the worker holds the codes alone and returns each query's
# ADC candidates, and the backend re-ranks them from the index's vector
# pages:
#  - the answers equal the CPU's (L2, inner product, cosine), also through
#    gpuivf_worker_search;
#  - gpuivf_index_info shows the copy with "rerank": "host", EXPLAIN ANALYZE
#    Device GPU and the candidates re-ranked;
#  - rows inserted after the load are found, deleted (vacuumed) rows are not;
#  - below even the codes' size: a clear ERROR under gpu, the CPU (counted)
#    under auto — never a silent CPU search.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my $node = fake_gpu_node('worker_host_rerank', $fake);
is(poll_until($node, "SELECT count(*) FROM gpuivf_stat WHERE state = 'ready'", '1'),
	'1', 'the worker is ready on the stand-in device');

$node->safe_psql('postgres', q{SELECT setseed(0.5);}
	  . grouped_items_sql(4000, 19, 0.2, 0.3)
	  . q{
	CREATE INDEX items_l2 ON items USING gpuivf (v) WITH (lists = 24);
	CREATE INDEX items_ip ON items USING gpuivf (v float4_ip_ops) WITH (lists = 24);
	CREATE INDEX items_cos ON items USING gpuivf (v float4_cosine_ops) WITH (lists = 24);
});

# 16 dimensions, 4-byte codes: a copy with vectors needs about
# 4000 * (16 + 12 + 64) * 1.25 = 460 kB (+ 17 kB of model), one of codes
# alone 4000 * 28 * 1.25 = 140 kB (+ the model)
sub set_limit
{
	my ($limit) = @_;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET gpuivf.gpu_memory_limit = '$limit'; SELECT pg_reload_conf()");
	usleep(1_000_000);    # the worker reads the setting when it wakes
}
set_limit('300kB');

my @vecs = map { $node->safe_psql('postgres', "SELECT v FROM items WHERE id = $_") } (3, 99, 700, 1500, 2999);
my $knn = 'SET gpuivf.probes = 5; SET gpuivf.rerank_candidates = 40; SET enable_seqscan = off;';

sub answers
{
	my ($op, $device) = @_;
	my $sql = "SET gpuivf.device = $device; $knn\n";
	$sql .= "SELECT string_agg(id || ':' || d, ',') FROM (SELECT id, v $op '$_' AS d FROM items "
	  . "ORDER BY v $op '$_' LIMIT 10) r;\n"
	  for @vecs;
	return $node->safe_psql('postgres', $sql);
}

for my $case (['<->', 'L2', 'items_l2'], ['<#>', 'inner product', 'items_ip'],
	['<=>', 'cosine', 'items_cos'])
{
	my ($op, $name, $index) = @$case;
	my $q0 = worker_stat($node, 'queries');
	is(answers($op, 'gpu'), answers($op, 'cpu'), "$name: re-ranked on the host, the answers equal the CPU's");
	cmp_ok(worker_stat($node, 'queries'), '>=', $q0 + 5, "$name: the worker searched every query");
	is($node->safe_psql('postgres',
			"SELECT string_agg(e->>'rerank', ',') FROM jsonb_array_elements(gpuivf_index_info('$index') -> 'gpu_cache') e"),
		'host', "$name: its GPU copy holds the codes alone (gpu_cache rerank = host)");
}

my $explain = $node->safe_psql('postgres',
	"SET gpuivf.device = gpu; $knn EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "
	  . "SELECT id FROM items ORDER BY v <-> '$vecs[0]' LIMIT 10");
like($explain, qr/Device: GPU/, 'EXPLAIN: the search ran on the GPU');
like($explain, qr/Re-ranked: 40\b/, 'EXPLAIN: its 40 candidates were re-ranked (on the host)');

my $direct = $node->safe_psql('postgres',
	"SET gpuivf.rerank_candidates = 40; SELECT string_agg(heap_tid::text, ',' ORDER BY distance, heap_tid) "
	  . "FROM gpuivf_worker_search('items_l2', '$vecs[1]', 10, 5)");
my $cpu_tids = $node->safe_psql('postgres',
	"SET gpuivf.device = cpu; $knn SELECT string_agg(ctid::text, ',' ORDER BY d, ctid) FROM "
	  . "(SELECT ctid, v <-> '$vecs[1]' AS d FROM items ORDER BY v <-> '$vecs[1]' LIMIT 10) r");
is($direct, $cpu_tids, 'gpuivf_worker_search returns the re-ranked rows (heap TIDs) too');

# fresh rows and deleted rows, through the codes-only copy's catch-up
$node->safe_psql('postgres', "INSERT INTO items VALUES (-1, '$vecs[2]')");
is($node->safe_psql('postgres',
		"SET gpuivf.device = gpu; $knn SELECT id FROM items ORDER BY v <-> '$vecs[2]', id LIMIT 2"),
	"-1\n700", 'a committed insert is found by the next GPU query');
$node->safe_psql('postgres', 'DELETE FROM items WHERE id = 700; VACUUM items');
is(answers('<->', 'gpu'), answers('<->', 'cpu'), 'after DELETE and VACUUM the answers still equal the CPU\'s');

# not even the codes fit
set_limit('64kB');
my ($rc, $out, $err) = $node->psql('postgres',
	"SET gpuivf.device = gpu; $knn SELECT id FROM items ORDER BY v <-> '$vecs[0]' LIMIT 3");
like($err, qr/needs about .* more than the .* the GPU worker may use/,
	'below the size of the codes: an out-of-memory ERROR under gpu');
my $fb = worker_stat($node, 'cpu_fallbacks');
is(answers('<->', 'auto'), answers('<->', 'cpu'), 'under auto the CPU answers');
cmp_ok(worker_stat($node, 'cpu_fallbacks'), '>', $fb, 'and the fallbacks are counted');

done_testing();
