
# How a backend sleeps until the GPU worker's answer (gpuivf.answer_wait,
# src/pg/gpuivfshmem.cpp, "Waiting for the answer"): on a futex word of its
# request slot (default on Linux) or on its latch.  The worker runs the CPU
# stand-in of the GPU engine (test/gpu/fake_engine.cpp).  Checked, for each
# method that this platform offers:
#  - single queries and 8 concurrent clients are answered, with the answers
#    of the CPU engine;
#  - a backend waiting for a slow answer shows the Extension wait event;
#  - pg_cancel_backend and statement_timeout end that wait at once (not after
#    the answer: the search is slowed to 5 s), and the next query is answered;
#  - with the wake-up thread off (a restart) the futex wait works the same.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my $tmp = PostgreSQL::Test::Utils::tempdir('gpuivf_wait');
my $delay_file = "$tmp/delay_ms";
local $ENV{GPUIVF_FAKE_DELAY_FILE} = $delay_file;

sub set_delay
{
	my ($ms) = @_;
	if ($ms) { PostgreSQL::Test::Utils::append_to_file($delay_file . '.new', $ms); rename("$delay_file.new", $delay_file); }
	else { unlink $delay_file; }
}

my $node = fake_gpu_node('worker_wait', $fake, "max_connections = 40\n");
is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is ready with the stand-in engine');

my @methods = split /,/, $node->safe_psql('postgres',
	q{SELECT string_agg(e, ',' ORDER BY e) FROM pg_settings, unnest(enumvals) e WHERE name = 'gpuivf.answer_wait'});
note 'gpuivf.answer_wait offers: ' . join(', ', @methods);
ok((grep { $_ eq 'latch' } @methods), 'latch is offered');
if ($^O eq 'linux')
{
	ok((grep { $_ eq 'futex' } @methods), 'futex is offered on Linux');
	is($node->safe_psql('postgres', 'SHOW gpuivf.answer_wait'), 'futex', 'and is the default there');
}

$node->safe_psql('postgres', q{SELECT setseed(0.5);}
	. grouped_items_sql(3000, 17, 0.2)
	. q{CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 24);});

my $knn = 'SET gpuivf.probes = 5; SET enable_seqscan = off;';
my $q = '(SELECT v FROM items WHERE id = 42)';
sub answers
{
	my ($settings) = @_;
	return $node->safe_psql('postgres', "$settings $knn "
		  . q{SELECT string_agg(q.id || ':' || n.id, ',' ORDER BY q.id, n.d, n.id)
			  FROM (SELECT id, v FROM items WHERE id % 300 = 1) q,
			  LATERAL (SELECT id, v <-> q.v AS d FROM items ORDER BY v <-> q.v LIMIT 5) n});
}
my $cpu = answers('SET gpuivf.device = cpu;');

# One waiting backend in the background: its pid, the handle and the time
# it started.
sub start_waiter
{
	my ($method, $tag) = @_;
	my $bg = $node->background_psql('postgres', on_error_stop => 0);
	$bg->query_safe("SET gpuivf.answer_wait = $method");
	my $pid = $bg->query_safe('SELECT pg_backend_pid()');
	$bg->query_until(qr/started/,
		"\\echo started\nSET gpuivf.device = gpu; $knn SELECT /* $tag */ id FROM items ORDER BY v <-> $q LIMIT 1;\n");
	return ($bg, $pid);
}

for my $method (@methods)
{
	my $set = "SET gpuivf.answer_wait = $method; SET gpuivf.device = gpu;";
	is(answers($set), $cpu, "$method: the worker's answers equal the CPU's");

	my ($rc, $err, $queries, $batches);
	{
		local $ENV{PGOPTIONS} = "-c gpuivf.answer_wait=$method";
		($rc, $err, $queries, $batches) = worker_knn_pgbench($node, 3000, 5);
	}
	is($rc, 0, "$method: 8 concurrent clients are all answered") or diag $err;
	cmp_ok($queries, '>', 100, "$method: the worker answered the workload") or note "queries $queries";

	# a slow answer: the waiter sleeps; its wait event, then a cancel
	set_delay(5000);
	my ($bg, $pid) = start_waiter($method, "waiter_$method");
	is(poll_until($node, "SELECT wait_event_type || ':' || wait_event FROM pg_stat_activity WHERE pid = $pid",
			'Extension:Extension'),
		'Extension:Extension', "$method: the waiting backend shows the Extension wait event");
	my $t0 = time();
	$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
	my $state = poll_until($node, "SELECT state FROM pg_stat_activity WHERE pid = $pid", 'idle');
	my $took = time() - $t0;
	is($state, 'idle', "$method: pg_cancel_backend ends the wait");
	cmp_ok($took, '<', 3, sprintf('%s: before the answer (%.2f s after the cancel)', $method, $took));
	$bg->quit;

	my $t1 = time();
	my (undef, undef, $terr) = $node->psql('postgres',
		"SET gpuivf.answer_wait = $method; SET statement_timeout = '300ms'; SET gpuivf.device = gpu; $knn "
		  . "SELECT id FROM items ORDER BY v <-> $q LIMIT 1");
	like($terr, qr/statement timeout/, "$method: statement_timeout ends the wait");
	cmp_ok(time() - $t1, '<', 3, "$method: at its time, not the answer's");
	set_delay(0);
	is($node->safe_psql('postgres', "$set $knn SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> $q LIMIT 7) s"),
		'7', "$method: afterwards the worker answers again");
}

$node->append_conf('postgresql.conf', "gpuivf.wake_thread = off\n");
$node->restart;
is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is back without its wake-up thread');
is(answers('SET gpuivf.device = gpu;'), $cpu, 'default wait, no wake-up thread: the same answers');
my ($rc, $err) = worker_knn_pgbench($node, 3000, 5);
is($rc, 0, 'and 8 concurrent clients are all answered') or diag $err;

$node->stop('fast');
my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile);
unlike($log, qr/PANIC|server process .* was terminated by signal/, 'no process crashed');

done_testing();
