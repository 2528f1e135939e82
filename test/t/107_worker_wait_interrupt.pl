
# A backend waiting for the GPU worker's answer (GpuivfWaitAnswer,
# src/pg/worker/queue.cpp: WaitLatch on the backend's latch) is interruptible
# at once, not when the answer comes.  The worker runs the CPU stand-in of
# the GPU engine (test/gpu/fake_engine.cpp) with every search slowed to 5 s.
# Checked:
#  - the waiting backend shows the Extension wait event;
#  - pg_cancel_backend and statement_timeout end the wait within a second or
#    two of their time (the search still has seconds to run);
#  - so does statement_timeout while the backend polls for its answer before
#    sleeping (gpuivf.answer_spin), and a poll that finds the answer gives
#    the same rows;
#  - a terminated waiter leaves no trouble: afterwards the worker answers,
#    with the CPU engine's rows.

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

$node->safe_psql('postgres', q{SELECT setseed(0.5);}
	. grouped_items_sql(3000, 17, 0.2)
	. q{CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 24);});

my $knn = 'SET gpuivf.probes = 5; SET enable_seqscan = off;';
my $q = '(SELECT v FROM items WHERE id = 42)';
sub answers
{
	my ($device, $settings) = @_;
	$settings //= '';
	return $node->safe_psql('postgres', "$settings SET gpuivf.device = $device; $knn "
		  . "SELECT string_agg(id::text, ',' ORDER BY d, id) FROM (SELECT id, v <-> $q AS d FROM items ORDER BY v <-> $q LIMIT 7) s");
}
my $cpu = answers('cpu');
is(answers('gpu'), $cpu, 'the worker answers as the CPU does');

# A backend in the background that waits for a slow answer: its handle and pid.
sub start_waiter
{
	my ($tag) = @_;
	my $bg = $node->background_psql('postgres', on_error_stop => 0);
	my $pid = $bg->query_safe('SELECT pg_backend_pid()');
	$bg->query_until(qr/started/,
		"\\echo started\nSET gpuivf.device = gpu; $knn SELECT /* $tag */ id FROM items ORDER BY v <-> $q LIMIT 1;\n");
	return ($bg, $pid);
}

set_delay(5000);
my ($bg, $pid) = start_waiter('waiter');
is(poll_until($node, "SELECT wait_event_type || ':' || wait_event FROM pg_stat_activity WHERE pid = $pid",
		'Extension:Extension'),
	'Extension:Extension', 'the waiting backend shows the Extension wait event');
my $t0 = time();
$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
my $state = poll_until($node, "SELECT state FROM pg_stat_activity WHERE pid = $pid", 'idle');
my $took = time() - $t0;
is($state, 'idle', 'pg_cancel_backend ends the wait');
cmp_ok($took, '<', 3, sprintf('before the answer (%.2f s after the cancel)', $took));
$bg->quit;

my $t1 = time();
my (undef, undef, $err) = $node->psql('postgres',
	"SET statement_timeout = '300ms'; SET gpuivf.device = gpu; $knn SELECT id FROM items ORDER BY v <-> $q LIMIT 1");
like($err, qr/statement timeout/, 'statement_timeout ends the wait');
cmp_ok(time() - $t1, '<', 3, 'at its time, not the answer\'s');

($bg, $pid) = start_waiter('terminated');
is(poll_until($node, "SELECT wait_event FROM pg_stat_activity WHERE pid = $pid", 'Extension'),
	'Extension', 'another backend waits');
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)"), 't', 'and is terminated');
eval { $bg->quit; };

# A backend polls its slot for gpuivf.answer_spin microseconds before it
# sleeps: a timeout inside a 1 s poll ends it at its time, not after the poll.
# First the worker finishes the abandoned searches (a new backend may reuse
# the PGPROC of one that left a search behind and would wait for that).
is(poll_until($node, "SELECT state FROM pg_stat_activity WHERE backend_type = 'gpuivf gpu worker'", 'idle'),
	'idle', 'the worker is done with the abandoned searches');
my $t2 = time();
(undef, undef, $err) = $node->psql('postgres',
	"SET gpuivf.answer_spin = 1000000; SET statement_timeout = '200ms'; SET gpuivf.device = gpu; $knn SELECT id FROM items ORDER BY v <-> $q LIMIT 1");
like($err, qr/statement timeout/, 'statement_timeout ends a wait that polls');
my $polled = time() - $t2;
cmp_ok($polled, '<', 0.85, sprintf('at its time, not the end of the poll (%.2f s)', $polled));
set_delay(0);
is(answers('gpu'), $cpu, 'afterwards the worker answers, as the CPU does');
is(answers('gpu', 'SET gpuivf.answer_spin = 0;'), $cpu, 'also to a backend that sleeps at once');
is(answers('gpu', 'SET gpuivf.answer_spin = 1000000;'), $cpu, 'and to one that polls until the answer');

$node->stop('fast');
my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile);
unlike($log, qr/PANIC|server process .* was terminated by signal/, 'no process crashed');

done_testing();
