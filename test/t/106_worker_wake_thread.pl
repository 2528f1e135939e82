
# The GPU worker's wake-up thread (gpuivf.wake_thread, src/pg/worker/bgworker/waker.cpp):
# backends whose answers the worker wrote are woken by a second thread of the
# worker process.  The worker runs the CPU stand-in of the GPU engine
# (test/gpu/fake_engine.cpp), which starts no threads of its own.  Checked:
#  - with the setting on (default) the worker process has that second thread,
#    and 8 concurrent clients all get answers, batched;
#  - the answers equal the CPU engine's;
#  - with it off (a restart) the worker has one thread and gives the same
#    answers;
#  - the worker stops cleanly either way (a fast shutdown joins the thread).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;
plan skip_all => 'counting a process\'s threads needs /proc' unless -d '/proc/self/task';

my $node = fake_gpu_node('worker_wake', $fake, "max_connections = 40\n");

# Threads of GPU worker 0 (its /proc/<pid>/task entries).
sub worker_threads
{
	my $pid = worker_stat($node, 'pid');
	opendir(my $dh, "/proc/$pid/task") or return -1;
	my $n = grep { !/^\./ } readdir($dh);
	closedir($dh);
	return $n;
}

is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is ready with the stand-in engine');
is(worker_threads(), 2, 'gpuivf.wake_thread = on: the worker runs a second (wake-up) thread');

$node->safe_psql('postgres', q{SELECT setseed(0.25);}
	. grouped_items_sql(3000, 17, 0.2)
	. q{CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 24);});

my $knn = 'SET gpuivf.probes = 5; SET enable_seqscan = off;';
sub answers
{
	my ($device) = @_;
	return $node->safe_psql('postgres', "SET gpuivf.device = $device; $knn "
		  . q{SELECT string_agg(q.id || ':' || n.id, ',' ORDER BY q.id, n.d, n.id)
			  FROM (SELECT id, v FROM items WHERE id % 300 = 1) q,
			  LATERAL (SELECT id, v <-> q.v AS d FROM items ORDER BY v <-> q.v LIMIT 5) n});
}
my $cpu = answers('cpu');
is(answers('gpu'), $cpu, 'answers through the worker equal the CPU answers');

my ($rc, $err, $queries, $batches) = worker_knn_pgbench($node, 3000, 5);
is($rc, 0, '8 concurrent clients are all answered') or diag $err;
unlike($err, qr/ERROR|aborted/, 'no statement failed');
cmp_ok($queries, '>', 100, 'the worker answered the workload') or note "queries $queries";
note sprintf('mean batch %.2f', $batches > 0 ? $queries / $batches : 0);

$node->append_conf('postgresql.conf', "gpuivf.wake_thread = off\n");
$node->restart;
is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is back after the restart');
is(worker_threads(), 1, 'gpuivf.wake_thread = off: the worker has one thread');
is(answers('gpu'), $cpu, 'and gives the same answers');

$node->stop('fast');
my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile);
unlike($log, qr/PANIC|server process .* was terminated by signal/, 'the worker stopped cleanly both times');

done_testing();
