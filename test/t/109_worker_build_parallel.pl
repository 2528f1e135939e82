
# CREATE INDEX through the GPU worker with parallel workers (CPU stand-in
# engine): every process of the build (the leader and two workers) encodes
# the rows it scanned through its own encoding job on the GPU worker; the
# index verifies and answers as one built by the CPU with the same workers
# does (the stand-in's training is the CPU's: the same model).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my $node = fake_gpu_node('worker_build_parallel', $fake,
	"max_worker_processes = 12\nmax_parallel_workers = 8\nmax_parallel_maintenance_workers = 2\n"
	  . "maintenance_work_mem = 128MB\n");
is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is ready with the stand-in engine');
$node->safe_psql('postgres', q{SELECT setseed(0.75);} . grouped_items_sql(20000, 23, 0.25)
	  . 'ALTER TABLE items SET (parallel_workers = 2);');
my @vecs = map { $node->safe_psql('postgres', "SELECT v FROM items WHERE id = $_") } (5, 500, 5000, 15000);

sub build
{
	my ($name, $device) = @_;
	my $builds0 = worker_stat($node, 'builds');
	my ($ret, $out, $err) = $node->psql('postgres',
		"SET gpuivf.device = $device; SET client_min_messages = debug1; "
		  . "CREATE INDEX $name ON items USING gpuivf (v) WITH (lists = 16)");
	is($ret, 0, "CREATE INDEX $name under gpuivf.device = $device");
	like($err, qr/gpuivf build of "$name": 20000 rows, 3 processes;/, "$name: three processes scanned");
	$node->safe_psql('postgres', "SELECT gpuivf_verify('$name', true)");
	pass("$name: gpuivf_verify(…, true) passes");
	my @answers = map {
		$node->safe_psql('postgres',
			"SET gpuivf.device = cpu; SET gpuivf.probes = 4; SET enable_seqscan = off; "
			  . "SELECT string_agg(id::text, ',') FROM (SELECT id FROM items ORDER BY v <-> '$_' LIMIT 10) r")
	} @vecs;
	my $sizes = list_sizes($node, $name, 16);
	$node->safe_psql('postgres', "DROP INDEX $name");
	return ($err, worker_stat($node, 'builds') - $builds0, $sizes, \@answers);
}

my ($err_gpu, $requests, $sizes_gpu, $ans_gpu) = build('items_gpu', 'gpu');
like($err_gpu, qr/on the GPU\)/, 'the encoding ran on the GPU worker');
# one training request, and a batch of every process that got rows (which
# processes get blocks of a parallel heap scan is a matter of timing: on a
# busy machine one may take them all)
cmp_ok($requests, '>=', 2, "the worker answered $requests build requests: training and the processes' batches");
my ($err_cpu, undef, $sizes_cpu, $ans_cpu) = build('items_cpu', 'cpu');
is($sizes_gpu, $sizes_cpu, 'the same list sizes as the CPU build');
is_deeply($ans_gpu, $ans_cpu, 'the same answers as the CPU build');

done_testing();
