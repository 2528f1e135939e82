# Copyright (c) gpuivf authors
#
# An index sharded across two GPU workers (CPU stand-in engine, two fake
# devices: gpuivf.devices = '0,1'):
#  - gpuivf.shards = 2 splits an index by lists (list l on worker l % 2);
#    gpuivf_index_info shows both halves, each worker searched every query;
#  - the merged answers equal the CPU's and the unsharded worker's for L2,
#    inner product and cosine, with and without stored vectors;
#  - rows inserted after the shards were loaded are found;
#  - the shards are asked at once: with every search made to take 2 s, a
#    sharded query takes about 2 s, not 4 (one after the other); a
#    statement_timeout while both shards search leaves no request behind
#    (the next sharded searches answer correctly);
#  - gpuivf.shards = 0 shards on its own when one copy exceeds
#    gpuivf.gpu_memory_limit and two halves fit, and shards the codes alone
#    (re-ranked on the host) when not even halves with vectors fit;
#  - a shard worker that is gone, or fails a search with a device error
#    (and exits): a clear ERROR under gpu, the CPU under auto (counted), and
#    sharded answers again once it has restarted.
use strict;
use warnings;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

local $ENV{GPUIVF_FAKE_DEVICES} = 2;
my $tmp = PostgreSQL::Test::Utils::tempdir('gpuivf_shards');
my $fail_file = "$tmp/fail";
local $ENV{GPUIVF_FAKE_FAIL_FILE} = $fail_file;
my $delay_file = "$tmp/delay";
local $ENV{GPUIVF_FAKE_DELAY_FILE} = $delay_file;

my $node = fake_gpu_node('worker_shards', $fake, "gpuivf.devices = '0,1'\nmax_connections = 20\n");

is(poll_until($node, "SELECT count(*) FROM gpuivf_stat WHERE state = 'ready'", '2'),
	'2', 'two workers are ready on the two stand-in devices');

$node->safe_psql('postgres', q{
	SELECT setseed(0.25);
}
	. grouped_items_sql(4000, 19, 0.2, 0.3)
	. q{
	CREATE INDEX items_l2 ON items USING gpuivf (v) WITH (lists = 24);
	CREATE INDEX items_ip ON items USING gpuivf (v float4_ip_ops) WITH (lists = 24);
	CREATE INDEX items_cos ON items USING gpuivf (v float4_cosine_ops) WITH (lists = 24);
	CREATE TABLE plain (id int, v real[]);
	INSERT INTO plain SELECT id, v FROM items;
	CREATE INDEX plain_l2 ON plain USING gpuivf (v) WITH (lists = 24, rerank = false);
});

my @ids = (1, 77, 500, 1234, 2222, 3999);
my @vecs = map { $node->safe_psql('postgres', "SELECT v FROM items WHERE id = $_") } @ids;
my $knn = 'SET gpuivf.probes = 5; SET gpuivf.rerank_candidates = 40; SET enable_seqscan = off;';
my ($rc, $out, $err);

# every query of @vecs on table/op, LIMIT k, under device and shards
sub answers
{
	my ($table, $op, $device, $shards, $k) = @_;
	$k //= 10;
	my $sql = "SET gpuivf.device = $device; SET gpuivf.shards = $shards; $knn\n";
	$sql .=
	  "SELECT string_agg(id || ':' || d, ',') FROM (SELECT id, v $op '$_' AS d FROM $table "
	  . "ORDER BY v $op '$_' LIMIT $k) r;\n"
	  for @vecs;
	return $node->safe_psql('postgres', $sql);
}

my @q0 = (worker_stat($node, 'queries', 0), worker_stat($node, 'queries', 1));
for my $case (['items', '<->', 'L2'], ['items', '<#>', 'inner product'],
	['items', '<=>', 'cosine'], ['plain', '<->', 'L2 without stored vectors'])
{
	my ($table, $op, $name) = @$case;
	my $cpu = answers($table, $op, 'cpu', 2);
	my $sharded = answers($table, $op, 'gpu', 2);
	like($cpu, qr/^\d+:/, "$name: the CPU answers");
	is($sharded, $cpu, "$name: two shards answer what the CPU answers");
	is(answers($table, $op, 'gpu', 1), $sharded, "$name: and what one unsharded worker answers");
	is(answers($table, $op, 'gpu', 2, 60), answers($table, $op, 'cpu', 2, 60),
		"$name: also for LIMIT 60 (more rows than candidates)");
}
cmp_ok(worker_stat($node, 'queries', 0) - $q0[0], '>=', 4 * 2 * @vecs, 'worker 0 searched its shard for every sharded query');
cmp_ok(worker_stat($node, 'queries', 1) - $q0[1], '>=', 4 * 2 * @vecs, 'and so did worker 1');

is( $node->safe_psql('postgres', q{
		SELECT string_agg((e->>'worker') || ':' || (e->>'shard') || '/' || (e->>'shards'), ',' ORDER BY e->>'worker')
		FROM jsonb_array_elements(gpuivf_index_info('items_l2') -> 'gpu_cache') e
		WHERE (e->>'shards')::int = 2}),
	'0:0/2,1:1/2', 'gpuivf_index_info shows shard 0 on worker 0 and shard 1 on worker 1');
is( $node->safe_psql('postgres', q{
		SELECT sum((e->>'vectors')::int)
		FROM jsonb_array_elements(gpuivf_index_info('items_l2') -> 'gpu_cache') e
		WHERE (e->>'shards')::int = 2}),
	'4000', 'the two shards hold every row once');

# ------------------------------------------------ inserts after loading
my $idlist = join ',', @ids;
$node->safe_psql('postgres', qq{
	INSERT INTO items SELECT 10000 + id * 10 + n, v FROM items, generate_series(1, 2) n WHERE id IN ($idlist);
	INSERT INTO plain SELECT 10000 + id * 10 + n, v FROM plain, generate_series(1, 2) n WHERE id IN ($idlist);
});
for my $case (['items', '<->', 'L2'], ['items', '<=>', 'cosine'], ['plain', '<->', 'L2 without stored vectors'])
{
	my ($table, $op, $name) = @$case;
	my $sharded = answers($table, $op, 'gpu', 2);
	is(scalar(grep { /(^|,)\d{5}:/ } split /\n/, $sharded), scalar(@ids),
		"$name: rows inserted after loading are found by the shards");
	is($sharded, answers($table, $op, 'cpu', 2), "$name: and the answers still equal the CPU's");
}

# ------------------------------------- the shards are asked at the same time
my $expected = answers('items', '<->', 'cpu', 2, 5);
my $one = "SET gpuivf.device = gpu; SET gpuivf.shards = 2; $knn\n"
  . "SELECT string_agg(id || ':' || d, ',') FROM (SELECT id, v <-> '$vecs[0]' AS d FROM items "
  . "ORDER BY v <-> '$vecs[0]' LIMIT 5) r;";
my ($first_answer) = split /\n/, $expected;
is($node->safe_psql('postgres', $one), $first_answer, 'a sharded query (warm-up) answers');
PostgreSQL::Test::Utils::append_to_file($delay_file, '2000');
my $t0 = time();
is($node->safe_psql('postgres', $one), $first_answer, 'with every search taking 2 s, the sharded query answers');
my $took = time() - $t0;
note(sprintf('a sharded query with 2 s searches took %.2f s', $took));
cmp_ok($took, '>=', 1.9, 'it waited for the slow searches');
cmp_ok($took, '<', 3.5, 'both shards searched at once (one after the other takes 4 s or more)');

($rc, $out, $err) = $node->psql('postgres', "SET statement_timeout = '500ms'; $one");
like($err, qr/canceling statement due to statement timeout/,
	'statement_timeout ends the wait for both shards');
unlink $delay_file;
is(answers('items', '<->', 'gpu', 2, 5), $expected,
	'the next sharded searches (once the shards let go of the abandoned requests) answer as the CPU does');

# ------------------------------------------- automatic sharding by memory
# one copy of items_l2 needs about 4000 * 92 * 1.25 bytes = 450 kB plus the
# model; half of it fits 400 kB
$node->safe_psql('postgres', "ALTER SYSTEM SET gpuivf.gpu_memory_limit = '400kB'; SELECT pg_reload_conf()");
usleep(1_000_000);    # the workers read the setting when they wake
my $auto = answers('items', '<->', 'gpu', 0);
is($auto, answers('items', '<->', 'cpu', 0),
	'gpuivf.shards = 0, an index larger than one GPU\'s limit: split on its own, answers equal the CPU\'s');
is(answers('items', '<->', 'gpu', 1), answers('items', '<->', 'cpu', 0),
	'(unsharded it would not fit: gpuivf.shards = 1 keeps the codes alone on one worker and re-ranks on the host, the same answers)');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM jsonb_array_elements(gpuivf_index_info('items_l2') -> 'gpu_cache') e "
		  . "WHERE e->>'shards' = '1' AND e->>'rerank' = 'host'"),
	'1', '(gpu_cache: a whole copy of the codes alone)');
# not even halves with vectors fit 150 kB, halves of the codes (about 87 kB) do
$node->safe_psql('postgres', "ALTER SYSTEM SET gpuivf.gpu_memory_limit = '150kB'; SELECT pg_reload_conf()");
usleep(1_000_000);
is(answers('items', '<->', 'gpu', 0), answers('items', '<->', 'cpu', 0),
	'gpuivf.shards = 0, halves with vectors too large: shards of the codes, re-ranked on the host, answers equal the CPU\'s');
is($node->safe_psql('postgres',
		"SELECT string_agg(f, ',' ORDER BY f) FROM (SELECT format('%s/%s %s', e->>'shard', e->>'shards', e->>'rerank') f "
		  . "FROM jsonb_array_elements(gpuivf_index_info('items_l2') -> 'gpu_cache') e WHERE e->>'rerank' = 'host' "
		  . "AND e->>'shards' = '2') s"),
	'0/2 host,1/2 host', '(gpu_cache: two shards of the codes)');
$node->safe_psql('postgres', "ALTER SYSTEM RESET gpuivf.gpu_memory_limit; SELECT pg_reload_conf()");

# ------------------------------------------------- a shard worker is gone
my $cpu = answers('items', '<->', 'cpu', 2);
my $pid1 = worker_stat($node, 'pid', 1);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid1)");
poll_until($node, "SELECT state <> 'ready' OR pid <> $pid1 FROM gpuivf_stat WHERE worker = 1", 't');
($rc, $out, $err) = $node->psql('postgres',
	"SET gpuivf.device = gpu; SET gpuivf.shards = 2; $knn SELECT id FROM items ORDER BY v <-> '$vecs[0]' LIMIT 3");
if (worker_stat($node, 'pid', 1) eq $pid1 || worker_stat($node, 'state', 1) ne 'ready')
{
	like($err, qr/gpuivf GPU worker 1, which holds shard 1 of 2 of index "items_l2", is not ready|gpuivf GPU worker could not search index "items_l2"/,
		'gpu: a search needing the missing shard worker is a clear ERROR');
}
else
{
	pass('(the shard worker restarted before the query: nothing to fail)');
}
note("under gpu: $err");
my $fb = worker_stat($node, 'cpu_fallbacks', 1) + worker_stat($node, 'cpu_fallbacks', 0);
if (worker_stat($node, 'state', 1) eq 'ready')
{
	$pid1 = worker_stat($node, 'pid', 1);
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid1)");
	poll_until($node, "SELECT state <> 'ready' OR pid IS DISTINCT FROM $pid1 FROM gpuivf_stat WHERE worker = 1", 't');
}
is(answers('items', '<->', 'auto', 2), $cpu, 'auto: without the shard worker the answers are the CPU\'s');
cmp_ok(worker_stat($node, 'cpu_fallbacks', 1) + worker_stat($node, 'cpu_fallbacks', 0), '>', $fb, 'counted as CPU fallbacks');

is(poll_until($node, "SELECT count(*) FROM gpuivf_stat WHERE state = 'ready'", '2'), '2',
	'the shard worker restarts');
my $q1 = worker_stat($node, 'queries', 1);
is(answers('items', '<->', 'gpu', 2), $cpu, 'and sharded answers are the CPU\'s again');
cmp_ok(worker_stat($node, 'queries', 1), '>', $q1, 'with the restarted worker searching its shard');

# ------------------------------- a device error on a shard worker (it exits)
$fb = worker_stat($node, 'cpu_fallbacks', 1) + worker_stat($node, 'cpu_fallbacks', 0);
PostgreSQL::Test::Utils::append_to_file($fail_file, 'x');
is(answers('items', '<->', 'auto', 2), $cpu, 'auto: a shard search failing with a device error is answered on the CPU');
cmp_ok(worker_stat($node, 'cpu_fallbacks', 1) + worker_stat($node, 'cpu_fallbacks', 0), '>', $fb, 'counted as CPU fallbacks');
is(poll_until($node, "SELECT count(*) FROM gpuivf_stat WHERE state = 'ready'", '2'), '2',
	'the failed worker restarts');
PostgreSQL::Test::Utils::append_to_file($fail_file, 'x');
($rc, $out, $err) = $node->psql('postgres',
	"SET gpuivf.device = gpu; SET gpuivf.shards = 2; $knn SELECT id FROM items ORDER BY v <-> '$vecs[0]' LIMIT 3");
like($err, qr/gpuivf GPU worker could not search index "items_l2": .*illegal memory access/,
	'gpu: the device error of a shard is a clear ERROR');
is(poll_until($node, "SELECT count(*) FROM gpuivf_stat WHERE state = 'ready'", '2'), '2',
	'both workers are ready again');
is(answers('items', '<=>', 'gpu', 2), answers('items', '<=>', 'cpu', 2),
	'and sharded answers equal the CPU\'s again');

done_testing();
