
# The GPU runs out of memory.  Two ways, with the CPU stand-in engine
# (test/gpu/fake_engine.cpp) in the worker:
#  1. every device allocation fails (GPUIVF_FAKE_OOM_FILE: loading an index,
#     adding entries, searching, exact kNN all return "out of memory"):
#     queries under gpuivf.device = auto get the CPU's rows (counted as CPU
#     fallbacks), under gpu a clear error (SQLSTATE 53200, out of memory),
#     CREATE INDEX and ANALYZE finish on the CPU; the worker stays up, and
#     answers on the GPU again once memory is free;
#  2. a tiny gpuivf.gpu_memory_limit, with the index already loaded (the
#     limit is lowered under a loaded copy): the same answers, and the worker
#     gives the copy back instead of keeping it over the limit.

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

my $tmp = PostgreSQL::Test::Utils::tempdir('gpuivf_fake');
my $oom_file = "$tmp/oom";
local $ENV{GPUIVF_FAKE_OOM_FILE} = $oom_file;

my $node = fake_gpu_node('worker_gpu_oom', $fake);
is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is ready with the stand-in engine');
$node->safe_psql('postgres', q{SET gpuivf.device = cpu; SELECT setseed(0.5);}
	  . grouped_items_sql(4000, 23, 0.2)
	  . q{CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 16);});
my $knn = 'SET enable_seqscan = off; SET gpuivf.probes = 4; '
  . "SELECT string_agg(id::text, ',') FROM (SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = 77) LIMIT 10) s";
my $cpu = $node->safe_psql('postgres', "SET gpuivf.device = cpu; $knn");
my $pid = worker_stat($node, 'pid');

# ------------------------------------------------ 1. every allocation fails
PostgreSQL::Test::Utils::append_to_file($oom_file, 'x');
my $fallbacks = worker_stat($node, 'cpu_fallbacks');
is($node->safe_psql('postgres', "SET gpuivf.device = auto; $knn"), $cpu,
	'out of GPU memory, gpuivf.device = auto: the CPU\'s rows');
cmp_ok(worker_stat($node, 'cpu_fallbacks'), '>', $fallbacks, '... counted as a CPU fallback');
my ($rc, $out, $err) = $node->psql('postgres', "SET gpuivf.device = gpu; $knn",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  53200: gpuivf GPU worker could not search index "items_v": .*out of device memory/,
	'gpuivf.device = gpu: a clear out-of-memory error');
$node->safe_psql('postgres', q{SET gpuivf.device = auto; CREATE INDEX items_v2 ON items USING gpuivf (v) WITH (lists = 8);
	ANALYZE items; SELECT gpuivf_verify('items_v2', true)});
pass('CREATE INDEX and ANALYZE under auto finish (on the CPU where the GPU has no memory)');
is(worker_stat($node, 'state'), 'ready', 'the worker is still up');
is(worker_stat($node, 'pid'), $pid, '... the same process');
unlink $oom_file;
is($node->safe_psql('postgres', "SET gpuivf.device = gpu; $knn"), $cpu, 'memory free again: the GPU answers');
cmp_ok(worker_stat($node, 'indexes_cached'), '>=', 1, '... from a loaded copy');

# ------------------------------------------- 2. the limit drops under a copy
$node->safe_psql('postgres', "ALTER SYSTEM SET gpuivf.gpu_memory_limit = '16kB'; SELECT pg_reload_conf()");
usleep(1_000_000);
$fallbacks = worker_stat($node, 'cpu_fallbacks');
is($node->safe_psql('postgres', "SET gpuivf.device = auto; $knn"), $cpu,
	'a tiny gpuivf.gpu_memory_limit, gpuivf.device = auto: the CPU\'s rows');
cmp_ok(worker_stat($node, 'cpu_fallbacks'), '>', $fallbacks, '... counted as a CPU fallback');
($rc, $out, $err) = $node->psql('postgres', "SET gpuivf.device = gpu; $knn",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/ERROR:  53200: .*needs about \d+ MB of GPU memory, more than the \d+ MB the GPU worker may use/,
	'gpuivf.device = gpu: a clear error naming the limit');
is(worker_stat($node, 'indexes_cached'), '0', 'the worker keeps no copy over the limit');
is(worker_stat($node, 'pid'), $pid, 'the worker is still the same process');
$node->safe_psql('postgres', "ALTER SYSTEM RESET gpuivf.gpu_memory_limit; SELECT pg_reload_conf()");
usleep(1_000_000);
is($node->safe_psql('postgres', "SET gpuivf.device = gpu; $knn"), $cpu, 'limit reset: the GPU answers again');

ok(!$node->log_contains('terminated by signal'), 'no process crashed');
$node->stop;
done_testing();
