
# The GPU worker protocol, end to end, on a machine without a GPU: the worker
# loads a CPU stand-in of the GPU engine (test/gpu/fake_engine.cpp, the same
# C interface implemented with src/core) instead of gpuivf_gpu.so, so that
# everything around the GPU runs here:
#  - CREATE INDEX trains and encodes through the worker, the index verifies;
#  - ANALYZE's ground truth (exact kNN) is computed by the worker and gives
#    the CPU's recall curve; a worker failure there is redone on the CPU;
#  - scans answered by the worker equal the CPU's (ids and distances);
#  - every query of a batch keeps its own k and candidates (a batched join
#    with per-row LIMITs: one request, one engine call per candidate count,
#    the nested loop's rows on the CPU, the same re-rank count);
#  - gpuivf.device = gpu: exact, untrained and temporary-index searches run
#    on the CPU; more probes than the engine takes is a precise ERROR;
#  - gpuivf_stat.cpu_fallbacks counts exactly the queries answered on the
#    CPU under auto because the worker could not serve them;
#  - a committed insert is found by the next query (the GPU copy catches up),
#    also after DELETE + VACUUM + inserts that reuse space;
#  - concurrent clients are batched (mean batch size > 1) while "the GPU" is busy;
#  - cancel (statement_timeout) and terminate while waiting leave the queue
#    usable;
#  - an engine device error: the query is answered on the CPU under auto,
#    fails clearly under gpu, and the worker restarts;
#  - a GPU memory limit too small for the index: clear error / CPU answer;
#  - kill -9 of the worker: the cluster restarts and answers again.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my $tmp = PostgreSQL::Test::Utils::tempdir('gpuivf_fake');
my $delay_file = "$tmp/delay_ms";
my $fail_file = "$tmp/fail";
local $ENV{GPUIVF_FAKE_DELAY_FILE} = $delay_file;
local $ENV{GPUIVF_FAKE_FAIL_FILE} = $fail_file;

my $node = fake_gpu_node('worker_fake', $fake, "max_connections = 40\n");

sub set_delay
{
	my ($ms) = @_;
	if ($ms) { PostgreSQL::Test::Utils::append_to_file($delay_file . '.new', $ms); rename("$delay_file.new", $delay_file); }
	else { unlink $delay_file; }
}

is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is ready with the stand-in engine');
like(worker_stat($node, 'device_name'), qr/fake GPU/, 'gpuivf_stat names the device');

# ------------------------------------------------------------ build
$node->safe_psql('postgres', q{
	SELECT setseed(0.5);
}
	. grouped_items_sql(5000, 23, 0.2)
	. q{
	CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 32);
});
cmp_ok(worker_stat($node, 'builds'), '>=', 2, 'CREATE INDEX trained and encoded on the worker');
$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v', true)});
pass('the index the worker built verifies (heapallindexed)');
cmp_ok(worker_stat($node, 'exact_knn'), '>=', 1, 'CREATE INDEX calibrated with exact kNN on the worker');

# ----------------------------------------- ANALYZE: ground truth on the GPU
sub curve
{
	return $node->safe_psql('postgres',
		"SELECT gpuivf_index_info('items_v') -> 'calibration' -> 'curve'");
}
my $x0 = worker_stat($node, 'exact_knn');
my ($rc, $out, $err) = $node->psql('postgres', 'SET client_min_messages = debug1; ANALYZE items');
like($err, qr/calibrated on 200 queries from rows: .* exact top-100 on the GPU/,
	'ANALYZE computes the ground truth on the GPU worker');
cmp_ok(worker_stat($node, 'exact_knn'), '>', $x0, 'gpuivf_stat.exact_knn counts its requests');
my $curve_gpu = curve();
$x0 = worker_stat($node, 'exact_knn');
($rc, $out, $err) = $node->psql('postgres',
	'SET gpuivf.device = cpu; SET client_min_messages = debug1; ANALYZE items');
like($err, qr/exact top-100 on the CPU/, 'under gpuivf.device = cpu ANALYZE stays on the CPU');
is(worker_stat($node, 'exact_knn'), $x0, 'and asks the worker nothing');
like($curve_gpu, qr/"recall"/, 'the curve is there');
is(curve(), $curve_gpu, 'GPU and CPU ANALYZE measure the same recall curve');

# ------------------------------------------------- GPU answers = CPU
my @ids = (1, 100, 999, 2500, 4999, 3333, 42, 4242);
my @vecs = map { $node->safe_psql('postgres', "SELECT v FROM items WHERE id = $_") } @ids;
my $knn = 'SET gpuivf.probes = 6; SET enable_seqscan = off;';
sub answers
{
	my ($device, $k) = @_;
	$k //= 10;
	my $sql = "SET gpuivf.device = $device; $knn\n";
	$sql .=
	  "SELECT string_agg(id || ':' || d, ',') FROM (SELECT id, v <-> '$_' AS d FROM items "
	  . "ORDER BY v <-> '$_' LIMIT $k) r;\n"
	  for @vecs;
	return $node->safe_psql('postgres', $sql);
}
my $before = worker_stat($node, 'queries');
my $gpu = answers('gpu');
cmp_ok(worker_stat($node, 'queries'), '>=', $before + scalar(@ids), 'the worker searched every query');
is($gpu, answers('cpu'), 'GPU-worker answers equal the CPU answers (ids and distances)');
is($node->safe_psql('postgres', "SELECT gpuivf_index_info('items_v') -> 'gpu_cache' -> 0 ->> 'worker'"),
	'0', 'gpuivf_index_info says worker 0 holds the index');

# ------------------------------------- per-query k and candidates in a batch
# One batched join whose rows ask for different LIMITs: candidates are
# GpuivfRerankCount(depth, k) (at the default depth: 200 up to 10 rows, 20
# a row above), so 200, 300 and 500 here, fewer than the 6 probed lists
# hold (the worker counts what it asks the engine to re-rank, the CPU what
# the lists gave).
$node->safe_psql('postgres', q{
	CREATE TABLE qs (qid int, k int, q real[]);
	INSERT INTO qs SELECT n, (ARRAY[3, 10, 15, 25, 10, 3])[n], v
	FROM items JOIN generate_series(1, 6) n ON items.id = n * 611;
	ANALYZE qs;
});
my $join = q{SELECT string_agg(q.qid || ':' || n.id || ':' || n.dist, ',' ORDER BY q.qid, n.dist, n.id)
	FROM qs q CROSS JOIN LATERAL (
	  SELECT i.id, i.v <-> q.q AS dist FROM items i ORDER BY i.v <-> q.q LIMIT q.k) n};
sub counters
{
	return split /\|/, $node->safe_psql('postgres',
		'SELECT requests, queries, batches, cpu_fallbacks FROM gpuivf_stat WHERE worker = 0');
}
like($node->safe_psql('postgres', "SET gpuivf.device = gpu; $knn EXPLAIN (COSTS OFF) $join"),
	qr/GpuivfBatchKnn/, 'the join with per-row LIMITs is batched');
my @c0 = counters();
my $join_gpu = $node->safe_psql('postgres', "SET gpuivf.device = gpu; $knn $join");
my @c1 = counters();
is($c1[0] - $c0[0], 1, 'its 6 searches went to the worker in one request');
is($c1[1] - $c0[1], 6, 'with 6 queries');
is($c1[2] - $c0[2], 3, 'searched in one engine call per candidate count (200, 300, 500)');
is($join_gpu,
	$node->safe_psql('postgres', "SET gpuivf.device = cpu; SET gpuivf.enable_batch_join = off; $knn $join"),
	'each query keeps its own k and candidates: GPU batch = CPU nested loop');
my $reranked = sub {
	my ($device) = @_;
	my $plan = $node->safe_psql('postgres',
		"SET gpuivf.device = $device; $knn EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) $join");
	return $plan =~ /Re-ranked: (\d+)/ ? $1 : "none in:\n$plan";
};
is($reranked->('gpu'), 1600, 'EXPLAIN shows the candidates re-ranked on the GPU (200+200+300+500+200+200)');
is($reranked->('cpu'), 1600, 'the same count as on the CPU');

# ------------------------------------------ what the GPU does not take
# exact searches (every list of an index with stored vectors), untrained and
# temporary indexes run on the CPU under gpuivf.device = gpu, and are not
# CPU fallbacks; more probes than the engine takes is an ERROR under gpu
# and a counted CPU fallback under auto
my $exact_sql = "SELECT string_agg(id || ':' || d, ',') FROM (SELECT id, v <-> '$vecs[0]' AS d"
  . " FROM items ORDER BY v <-> '$vecs[0]' LIMIT 10) s";
@c0 = counters();
is( $node->safe_psql('postgres', "SET gpuivf.device = gpu; $knn SET gpuivf.probes = 32; $exact_sql"),
	$node->safe_psql('postgres', "SET gpuivf.device = cpu; SET enable_indexscan = off; $exact_sql"),
	'gpu: probing every list is the exact scan, answered on the CPU (= sequential scan)');
$node->safe_psql('postgres', q{
	CREATE TABLE fresh (id int, v real[]);
	CREATE INDEX fresh_v ON fresh USING gpuivf (v);
	INSERT INTO fresh SELECT id, v FROM items WHERE id <= 300;
});
my $fresh_sql = $exact_sql =~ s/FROM items/FROM fresh/r;
is( $node->safe_psql('postgres', "SET gpuivf.device = gpu; $knn $fresh_sql"),
	$node->safe_psql('postgres', "SET gpuivf.device = cpu; SET enable_indexscan = off; $fresh_sql"),
	'gpu: an untrained index is searched exactly on the CPU');
my $temp_sql = $exact_sql =~ s/FROM items/FROM tmp_items/r;
my @temp = split /\n/, $node->safe_psql('postgres',
	"SET client_min_messages = warning; CREATE TEMP TABLE tmp_items AS SELECT * FROM items WHERE id <= 2000;"
	  . " CREATE INDEX ON tmp_items USING gpuivf (v) WITH (lists = 8);"
	  . " SET gpuivf.device = gpu; $knn SET gpuivf.probes = 2; $temp_sql;"
	  . " SET gpuivf.device = cpu; $temp_sql");
is(scalar(@temp), 2, 'gpu: a temporary index is searched (on the CPU)');
is($temp[0], $temp[1], 'with the CPU answer');
@c1 = counters();
is($c1[1] - $c0[1], 0, 'none of these reached the worker');
is($c1[3] - $c0[3], 0, 'and none counts as a CPU fallback');

$node->safe_psql('postgres', q{
	CREATE TABLE wide (id int, v real[]);
	INSERT INTO wide SELECT id, v FROM items WHERE id <= 2500;
	SET client_min_messages = warning;
	CREATE INDEX wide_v ON wide USING gpuivf (v) WITH (lists = 1100);
});
my $wide_sql = $exact_sql =~ s/FROM items/FROM wide/r;
($rc, $out, $err) = $node->psql('postgres', "SET gpuivf.device = gpu; $knn SET gpuivf.probes = 1050; $wide_sql");
like($err, qr/ERROR:  search of index "wide_v" probes 1050 lists, more than the 1024 the GPU engine probes/,
	'gpu: more probes than the GPU engine takes is a precise error');
like($err, qr/HINT:  Set gpuivf.probes to 1024 or less/, 'with a HINT');
($rc, $out, $err) = $node->psql('postgres',
	"SET gpuivf.device = gpu; $knn SET gpuivf.probes = 1050; DO \$\$ BEGIN"
	  . " PERFORM id FROM wide ORDER BY v <-> '$vecs[0]' LIMIT 1;"
	  . " EXCEPTION WHEN program_limit_exceeded THEN RAISE NOTICE 'sqlstate 54000'; END \$\$;");
like($err, qr/sqlstate 54000/, 'SQLSTATE 54000 (program_limit_exceeded)');
@c0 = counters();
is( $node->safe_psql('postgres', "SET gpuivf.device = auto; $knn SET gpuivf.probes = 1050; $wide_sql"),
	$node->safe_psql('postgres', "SET gpuivf.device = cpu; $knn SET gpuivf.probes = 1050; $wide_sql"),
	'auto: such a search is answered on the CPU');
@c1 = counters();
is($c1[3] - $c0[3], 1, 'and counted as one CPU fallback');
is($c1[1] - $c0[1], 0, 'without asking the worker');

# ------------------------------------------------------ never stale
# the query vector of the rest: row 4242's, which a new row -1 copies
my $q = "'$vecs[7]'";
$node->safe_psql('postgres', "INSERT INTO items SELECT -1, v FROM items WHERE id = 4242");
$before = worker_stat($node, 'queries');
is( $node->safe_psql('postgres',
		"SET gpuivf.device = gpu; $knn"
		  . " SELECT string_agg(id::text, ',' ORDER BY id) FROM (SELECT id FROM items ORDER BY v <-> $q LIMIT 2) s"),
	'-1,4242',
	'a committed insert is found by the next query on the GPU');
cmp_ok(worker_stat($node, 'queries'), '>', $before, 'that query was answered by the worker');
cmp_ok(worker_stat($node, 'refreshes'), '>=', 1, 'the GPU copy caught up incrementally');

$node->safe_psql('postgres', q{
	DELETE FROM items WHERE id % 3 = 0;
	VACUUM items;
	INSERT INTO items
	SELECT 10000 + i, ARRAY(SELECT ((i % 23) * 0.2 + random())::real FROM generate_series(1, 16) WHERE i > 0)
	FROM generate_series(1, 1500) i;
});
$gpu = answers('gpu');
is($gpu, answers('cpu'), 'after DELETE, VACUUM and inserts the GPU still answers like the CPU');
unlike($gpu, qr/(^|,)(3|6|999|2499|4242):/, 'deleted rows are not returned');

# ---------------------------------------------------------- batching
set_delay(20);
my ($queries, $batches);
($rc, $err, $queries, $batches) = worker_knn_pgbench($node, 5000, 6);
is($rc, 0, 'pgbench with 8 clients on the GPU worker succeeds') or diag $err;
set_delay(0);
my $mean = $batches > 0 ? $queries / $batches : 0;
cmp_ok($mean, '>', 1.5, sprintf('8 concurrent clients are batched (mean batch size %.2f)', $mean));
note 'gpuivf_stat: ' . $node->safe_psql('postgres',
	'SELECT requests, queries, batches, round(mean_batch_size::numeric, 2), max_batch_size, round(mean_queue_wait_ms::numeric, 3) FROM gpuivf_stat');

# ------------------------------------------------- cancel / terminate
set_delay(3000);
($rc, $out, $err) = $node->psql('postgres',
	"SET statement_timeout = '300ms'; SET gpuivf.device = gpu; $knn SELECT id FROM items ORDER BY v <-> $q LIMIT 1");
like($err, qr/statement timeout/, 'statement_timeout cancels a query waiting for the worker');

my $bg = $node->background_psql('postgres', on_error_stop => 0);
$bg->query_until(qr/started/, "\\echo started\nSET gpuivf.device = gpu; $knn SELECT /* waiter */ id FROM items ORDER BY v <-> $q LIMIT 1;\n");
usleep(500_000);
is($node->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%/* waiter */%' AND pid <> pg_backend_pid()"),
	't', 'a backend waiting for the worker is terminated');
eval { $bg->quit; };
set_delay(0);
is( $node->safe_psql('postgres',
		"SET gpuivf.device = gpu; $knn SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> $q LIMIT 7) s"),
	'7', 'afterwards the worker answers again');

# ------------------------------------- ANALYZE when the worker fails
$node->safe_psql('postgres', 'SET gpuivf.device = cpu; ANALYZE items');
my $curve_cpu = curve();
my $cpid = worker_stat($node, 'pid');
my $fb0 = worker_stat($node, 'cpu_fallbacks');
PostgreSQL::Test::Utils::append_to_file($fail_file, 'x');
($rc, $out, $err) = $node->psql('postgres', 'SET client_min_messages = debug1; ANALYZE items');
is($rc, 0, 'ANALYZE succeeds when the worker fails its exact kNN (device error, auto)');
like($err, qr/exact top-100 on the CPU/, 'the CPU computed the ground truth instead');
cmp_ok(worker_stat($node, 'cpu_fallbacks'), '>', $fb0, 'counted as a CPU fallback');
is(curve(), $curve_cpu, 'the curve is the one the CPU measures');
is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0 AND pid <> $cpid", 'ready'),
	'ready', 'the worker restarted after that device error');

# ------------------------------------------------------ device error
my $pid = worker_stat($node, 'pid');
PostgreSQL::Test::Utils::append_to_file($fail_file, 'x');
my $fallbacks = worker_stat($node, 'cpu_fallbacks');
is( $node->safe_psql('postgres',
		"SET gpuivf.device = auto; $knn SELECT id FROM items ORDER BY v <-> $q LIMIT 1"),
	'-1',
	'a device error under auto: the CPU answers');
is(worker_stat($node, 'cpu_fallbacks'), $fallbacks + 1, 'counted as one CPU fallback');
my $newpid = '';
for (1 .. 150)
{
	$newpid = $node->safe_psql('postgres', "SELECT pid FROM gpuivf_stat WHERE state = 'ready' AND pid <> $pid");
	last if $newpid ne '';
	usleep(100_000);
}
isnt($newpid, '', 'the worker restarts after a device error');
ok($node->log_contains('restarts after a CUDA error'), 'and says why in the log');

PostgreSQL::Test::Utils::append_to_file($fail_file, 'x');
($rc, $out, $err) = $node->psql('postgres',
	"SET gpuivf.device = gpu; $knn SELECT id FROM items ORDER BY v <-> $q LIMIT 1");
like($err, qr/gpuivf GPU worker could not search index "items_v"/, 'a device error under gpu is a clear ERROR');
poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0 AND pid <> $newpid", 'ready');

# ------------------------------------------------------ memory limit
$node->safe_psql('postgres', "ALTER SYSTEM SET gpuivf.gpu_memory_limit = '100kB'; SELECT pg_reload_conf()");
sleep 1;
($rc, $out, $err) = $node->psql('postgres',
	"SET gpuivf.device = gpu; $knn SELECT id FROM items ORDER BY v <-> $q LIMIT 1");
like($err, qr/needs about \d+ MB of GPU memory/, 'an index above gpuivf.gpu_memory_limit: clear error under gpu');
$fallbacks = worker_stat($node, 'cpu_fallbacks');
is( $node->safe_psql('postgres',
		"$knn SELECT id FROM items ORDER BY v <-> $q LIMIT 1"),
	'-1', 'and the CPU answers under auto');
is(worker_stat($node, 'cpu_fallbacks'), $fallbacks + 1, 'counted as one CPU fallback');
$node->safe_psql('postgres', "ALTER SYSTEM RESET gpuivf.gpu_memory_limit; SELECT pg_reload_conf()");
sleep 1;

# ---------------------------------------------------------- kill -9
$pid = worker_stat($node, 'pid');
set_delay(2000);
$bg = $node->background_psql('postgres', on_error_stop => 0);
$bg->query_until(qr/started/, "\\echo started\nSET gpuivf.device = gpu; $knn SELECT id FROM items ORDER BY v <-> $q LIMIT 1;\n");
usleep(500_000);
kill 'KILL', $pid;
eval { $bg->quit; };
set_delay(0);
my $up = '';
for (1 .. 300)
{
	$up = $node->psql('postgres', "SELECT state FROM gpuivf_stat WHERE worker = 0 AND pid <> $pid", stdout => \$out) == 0 ? $out : '';
	last if $up eq 'ready';
	usleep(100_000);
}
is($up, 'ready', 'after kill -9 of the worker the cluster restarts with a new worker');
is( $node->safe_psql('postgres',
		"SET gpuivf.device = gpu; $knn SELECT id FROM items ORDER BY v <-> $q LIMIT 1"),
	'-1', 'and the GPU worker answers again');

$node->stop;
done_testing();
