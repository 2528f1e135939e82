
# Errors around the GPU worker say what is true:
#  - with no worker running, gpuivf_worker_search (which only asks the
#    worker) says so under gpuivf.device = auto, instead of claiming that
#    gpuivf.device is set to "gpu";
#  - temporary tables live in their backend's local buffers, which the
#    worker cannot read: CREATE INDEX, ANALYZE and searches of a temporary
#    table's index never send the worker a request to read it (no "could not
#    open file" from the worker, no error counted in gpuivf_stat), and
#    answer as for a regular table.
# The worker runs the CPU stand-in engine (test/gpu/fake_engine.cpp).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

# ------------------------------------------------ no worker: the message
my $plain = gpuivf_node('worker_errors_plain');
$plain->safe_psql('postgres', q{SELECT setseed(0.5);} . grouped_items_sql(1000, 10, 0.3)
	  . q{CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 4);});
my $q = $plain->safe_psql('postgres', 'SELECT v FROM items WHERE id = 7');
my ($rc, $out, $err) = $plain->psql('postgres',
	"SET gpuivf.device = auto; SELECT * FROM gpuivf_worker_search('items_v', '$q', 3)");
like($err, qr/ERROR:  gpuivf_worker_search needs a gpuivf GPU worker, but none is running/,
	'without a worker, gpuivf_worker_search says that none is running');
unlike($err, qr/is set to "gpu"/, '... and does not claim gpuivf.device is set to "gpu" (it is auto)');
($rc, $out, $err) = $plain->psql('postgres',
	"SET gpuivf.device = gpu; SET enable_seqscan = off; SELECT id FROM items ORDER BY v <-> '$q' LIMIT 3");
like($err, qr/ERROR:  gpuivf.device is set to "gpu" but no gpuivf GPU worker is running/,
	'a scan under gpuivf.device = gpu still names the setting');
$plain->stop;

# ------------------------------------------------ temporary tables
my $fake = fake_gpu_engine();
SKIP:
{
	skip 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built', 6 unless $fake;
	my $node = fake_gpu_node('worker_errors_temp', $fake);
	is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
		'ready', 'the worker is ready with the stand-in engine');
	my $sql = q{SELECT setseed(0.5);} . grouped_items_sql(3000, 10, 0.3);
	$sql =~ s/CREATE TABLE items/CREATE TEMP TABLE items/;
	my $loads0 = worker_stat($node, 'loads');
	my $knn = q{SELECT string_agg(id::text, ',') FROM (SELECT id FROM items
		ORDER BY v <-> (SELECT v FROM items WHERE id = 42) LIMIT 5) s};
	# one session: the table is temporary
	my $answers = $node->safe_psql('postgres', $sql . q{
		SET gpuivf.device = auto;
		CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 8);
		ANALYZE items;
		SET enable_seqscan = off; SET gpuivf.probes = 3;
		SELECT 'auto: ' || (} . $knn . q{);
		SET gpuivf.device = cpu;
		SELECT 'cpu: ' || (} . $knn . q{);
		SELECT 'verify: ' || gpuivf_verify('items_v', true)::text;
	});
	my @a = grep { /: / } split /\n/, $answers;
	@a = map { s/^\w+: //r } @a;
	is(scalar(@a), 3, 'CREATE INDEX, ANALYZE, searches and gpuivf_verify of the temporary index run')
	  or diag $answers;
	is($a[0], $a[1], 'a search of the temporary index under auto answers as the CPU does');
	is(worker_stat($node, 'errors'), '0', 'the worker counted no error');
	is(worker_stat($node, 'loads'), $loads0, 'the worker loaded no temporary index');
	ok(!$node->log_contains('could not open file'), 'the worker never tried to open the temporary index\'s file');
	$node->stop;
}

done_testing();
