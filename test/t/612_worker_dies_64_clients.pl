
# The GPU worker dies while 64 clients wait for it: none of them hangs.
# The worker runs the CPU stand-in engine (test/gpu/fake_engine.cpp) with a
# 3-second delay in every search (GPUIVF_FAKE_DELAY_FILE: a busy GPU), so
# that 64 clients — half under gpuivf.device = auto, half under gpu, all
# with gpuivf.worker_timeout = 5s — are waiting for it when it dies:
#  1. terminated (pg_terminate_backend: it exits, PostgreSQL restarts it):
#     every auto client gets the CPU's rows, every gpu client an error (or
#     the rows, if the restarted worker took its request), each within the
#     worker timeout plus the search under way;
#  2. killed (kill -9: PostgreSQL restarts the whole cluster): every client
#     gets the CPU's rows or a connection error within bounded time, and
#     the restarted cluster's worker answers again.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my $clients = 64;
my $delay_ms = 3000;
my $timeout_s = 5;
my $tmp = PostgreSQL::Test::Utils::tempdir('gpuivf_fake');
my $delay_file = "$tmp/delay_ms";
local $ENV{GPUIVF_FAKE_DELAY_FILE} = $delay_file;

my $node = fake_gpu_node('worker_dies_64_clients', $fake, "max_connections = 100\n");
is(wait_worker_ready($node), 'ready', 'the worker is ready with the stand-in engine');

$node->safe_psql('postgres', q{SET gpuivf.device = cpu; SELECT setseed(0.5);}
	  . grouped_items_sql(5000, 23, 0.2)
	  . q{CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 32);});
my $knn = 'SET enable_seqscan = off; SET gpuivf.probes = 4; '
  . "SELECT string_agg(id::text, ',') FROM (SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = 77) LIMIT 10) s";
my $cpu = $node->safe_psql('postgres', "SET gpuivf.device = cpu; $knn");
# the worker loads the index before the test starts
is($node->safe_psql('postgres', "SET gpuivf.device = gpu; $knn"), $cpu, 'the worker answers as the CPU does');

# starts the clients; returns their handles once all are waiting
sub start_clients
{
	my @c;
	for my $i (0 .. $clients - 1)
	{
		my $device = $i % 2 ? 'gpu' : 'auto';
		my %c = (device => $device, out => '', err => '');
		$c{h} = IPC::Run::start(
			[ 'psql', '-XAtq', '-h', $node->host, '-p', $node->port, '-d', 'postgres',
			  '-c', "SET application_name = 'waiter'; SET gpuivf.device = $device; "
			  . "SET gpuivf.worker_timeout = '${timeout_s}s'; $knn" ],
			'>', \$c{out}, '2>', \$c{err});
		push @c, \%c;
	}
	poll_until($node,
		"SELECT count(*) >= $clients FROM pg_stat_activity WHERE application_name = 'waiter' AND state = 'active'", 't');
	usleep(500_000);
	return @c;
}

# waits for every client (at most $limit s); sets each one's end time
sub finish_clients
{
	my ($limit, @c) = @_;
	my $start = time();
	my $left = scalar(@c);
	while ($left > 0 && time() - $start < $limit)
	{
		for my $c (@c)
		{
			next if defined $c->{end};
			$c->{h}->pump_nb;
			next if $c->{h}->pumpable;
			$c->{h}->finish;
			$c->{end} = time() - $start;
			$left--;
		}
		usleep(20_000);
	}
	for my $c (@c)
	{
		next if defined $c->{end};
		$c->{h}->kill_kill;
	}
	return $left;
}

# ------------------------------------------------ 1. the worker is terminated
PostgreSQL::Test::Utils::append_to_file($delay_file, $delay_ms);
my $pid = worker_stat($node, 'pid');
my @c = start_clients();
cmp_ok($node->safe_psql('postgres', "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'waiter'"),
	'==', $clients, "$clients clients are waiting for the worker");
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
my $hung = finish_clients($timeout_s + $delay_ms / 1000 + 30, @c);
is($hung, 0, 'terminated worker: no client hangs');
my $slowest = (sort { $b <=> $a } map { $_->{end} // 999 } @c)[0];
cmp_ok($slowest, '<=', $timeout_s + $delay_ms / 1000 + 10,
	sprintf('every client is done %.1f s after the worker was terminated (worker_timeout %d s)', $slowest, $timeout_s));
my @auto = grep { $_->{device} eq 'auto' } @c;
my @gpu = grep { $_->{device} eq 'gpu' } @c;
is(scalar(grep { $_->{out} eq "$cpu\n" || $_->{out} eq $cpu } @auto), scalar(@auto),
	'every gpuivf.device = auto client gets the CPU\'s rows')
  or diag join("\n", map { "out '$_->{out}' err '$_->{err}'" } grep { $_->{out} !~ /^\Q$cpu\E\n?$/ } @auto);
# (a request the restarted worker took in time is answered by it, rightly)
is(scalar(grep { ($_->{err} =~ /ERROR:  gpuivf GPU worker/ && $_->{out} eq '') || $_->{out} =~ /^\Q$cpu\E\n?$/ } @gpu),
	scalar(@gpu), 'every gpuivf.device = gpu client gets an error (or the right rows)')
  or diag join("\n", map { "out '$_->{out}' err '$_->{err}'" } @gpu);
is(wait_worker_ready($node, $pid), 'ready', 'the worker is back');
unlink $delay_file;
is($node->safe_psql('postgres', "SET gpuivf.device = gpu; $knn"), $cpu, 'and answers as the CPU does');

# ------------------------------------------------ 2. the worker is killed
PostgreSQL::Test::Utils::append_to_file($delay_file, $delay_ms);
$pid = worker_stat($node, 'pid');
@c = start_clients();
ok(kill('KILL', $pid), "kill -9 of the worker (pid $pid) while $clients clients wait");
$hung = finish_clients(60, @c);
is($hung, 0, 'killed worker: no client hangs');
my $answered = 0;
my $bad = 0;
for my $c (@c)
{
	if ($c->{out} =~ /^\Q$cpu\E\n?$/) { $answered++; next; }
	next if $c->{err} =~ /server closed the connection|terminating connection|connection to server|ERROR:  gpuivf GPU worker/;
	$bad++;
	diag "out '$c->{out}' err '$c->{err}'";
}
is($bad, 0, "every client got the CPU's rows ($answered) or an error");
unlink $delay_file;
is(wait_worker_ready($node, $pid), 'ready', 'the cluster restarted with a new worker');
is($node->safe_psql('postgres', "SET gpuivf.device = gpu; $knn"), $cpu, 'which answers as the CPU does');

$node->stop;
done_testing();
