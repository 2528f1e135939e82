
# kill -9 of the GPU worker while it loads an index: the cluster recovers
# and answers.  The worker runs the CPU stand-in of the GPU engine
# (test/gpu/fake_engine.cpp), started exactly as in 102_worker_fake_gpu.pl,
# with GPUIVF_FAKE_ADD_DELAY_MS making every append of entries to a GPU copy
# sleep, so that the first search of an index finds the worker loading it
# for seconds.  While it does, the worker is killed; then
#  - the session whose query was waiting for that load gets an error or a
#    CPU answer within bounded time (it does not hang);
#  - the postmaster restarts and the worker comes back (state ready);
#  - a query under gpuivf.device = gpu answers with the rows the CPU returns;
#  - gpuivf_verify(index, true) passes.

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

# one append per load here (the index is far below one add chunk): a load
# takes about this long
my $add_delay_ms = 4000;
local $ENV{GPUIVF_FAKE_ADD_DELAY_MS} = $add_delay_ms;

my $node = fake_gpu_node('worker_kill_load', $fake, "max_connections = 40\n");

is(wait_worker_ready($node), 'ready', 'the worker is ready with the stand-in engine');

# built on the CPU: under auto, CREATE INDEX's calibration searches would
# already make the worker load the index
$node->safe_psql('postgres', q{
	SET gpuivf.device = cpu;
	SELECT setseed(0.5);
}
	. grouped_items_sql(5000, 23, 0.2)
	. q{
	CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 32);
});

my @ids = (1, 999, 2500, 4242);
my @vecs = map { $node->safe_psql('postgres', "SELECT v FROM items WHERE id = $_") } @ids;
my $knn = 'SET gpuivf.probes = 6; SET enable_seqscan = off;';
sub answers_sql
{
	my ($device) = @_;
	my $sql = "SET gpuivf.device = $device; $knn\n";
	$sql .=
	  "SELECT string_agg(id || ':' || d, ',') FROM (SELECT id, v <-> '$_' AS d FROM items "
	  . "ORDER BY v <-> '$_' LIMIT 10) r;\n"
	  for @vecs;
	return $sql;
}
my $cpu = $node->safe_psql('postgres', answers_sql('cpu'));
is(worker_stat($node, 'loads'), '0', 'the worker holds no copy of the index yet');

# ------------------------------------------- a query that makes the worker load
my $pid = worker_stat($node, 'pid');
my ($out, $err) = ('', '');
my $timer = IPC::Run::timer(60);
my $h = IPC::Run::start(
	[ 'psql', '-XAtq', '-h', $node->host, '-p', $node->port, '-d', 'postgres',
	  '-c', "SET gpuivf.device = auto; $knn SET application_name = 'loader';"
	  . " SELECT id FROM items ORDER BY v <-> '$vecs[3]' LIMIT 1" ],
	'>', \$out, '2>', \$err, $timer);

# wait until the query runs, then some time into the load
poll_until($node,
	"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'loader' AND state = 'active'",
	'1');
usleep(1_000_000);
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'loader' AND state = 'active'"),
	'1', 'a second later the query still waits for the worker loading the index');
is(worker_stat($node, 'loads'), '0', 'whose load has not finished');

my $killed_at = time();
ok(kill('KILL', $pid), "kill -9 of the worker (pid $pid) while it loads");

# ------------------------------------------- the waiting session ends, no hang
my $finished = eval { $h->finish; 1 };
my $waited = time() - $killed_at;
if (!$finished)
{
	eval { $h->kill_kill; };
}
ok($finished, sprintf('the waiting session ends within bounded time (%.1f s after the kill)', $waited))
  or diag "psql: $@";
chomp $out;
ok( ($h->result(0) != 0 && $err =~ /server closed the connection|terminating connection|connection to server/)
	  || $out eq '4242',
	'it gets an error (crash restart) or the CPU answer')
  or diag "rc " . $h->result(0) . ", stdout '$out', stderr '$err'";
note "waiting session: stdout '$out', stderr '$err'";

# ------------------------------------------- the cluster and the worker are back
is(wait_worker_ready($node, $pid), 'ready', 'the cluster restarts with a new worker (state ready)');
ok($node->log_contains('terminated by signal 9'), 'the postmaster logged the kill');

my $q0 = worker_stat($node, 'queries');
is($node->safe_psql('postgres', answers_sql('gpu')), $cpu,
	'gpuivf.device = gpu answers with the rows and distances of gpuivf.device = cpu');
cmp_ok(worker_stat($node, 'queries'), '>=', $q0 + scalar(@ids), 'those queries were answered by the worker');
cmp_ok(worker_stat($node, 'loads'), '>=', 1, 'after loading the index again');

$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v', true)});
pass('gpuivf_verify(items_v, true) passes');

$node->stop;
done_testing();
