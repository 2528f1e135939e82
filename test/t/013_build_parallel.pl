
# CREATE INDEX with parallel workers (PostgreSQL's parallel index build
# machinery: both heap scans, the training on the CPU and the calibration's
# exact top-100 and sweep on the CPU shared by the workers and the leader) builds the
# index a serial build builds: the
# training sample is chosen by a hash of the heap TID and the shared training
# computes what one process does, so the model (bit for bit), every row's
# list and code and the list sizes are the same; only where a vector tuple
# lands differs.  Without stored
# vectors (entries hold heap TIDs) the pages hold the same entries: the same
# answers, ids and distances, and the same calibration curve.  With them,
# entries hold vector tuple TIDs, which break ties among equal PQ scores at
# the edge of the candidates: the same recall against exact results.  Every page the workers wrote is WAL-logged (an immediate
# shutdown right after the build recovers it), CREATE INDEX CONCURRENTLY
# builds in parallel too, and an error in a worker's part of the heap fails
# the build with the row's error.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('build_parallel', allows_streaming => 1,
	conf => "max_worker_processes = 8\nmax_parallel_workers = 8\nmax_parallel_maintenance_workers = 2\n"
	  . "maintenance_work_mem = 128MB\nautovacuum = off\n");
my $data = generate_data(rows => 30000, dims => 16, queries => 20, seed => 11);
load_vectors($node, 'items', $data->{base_copy});
# a small table gets no workers by size: ask for two
$node->safe_psql('postgres', 'ALTER TABLE items SET (parallel_workers = 2); CREATE EXTENSION pageinspect');
my $queries = read_fvecs($data->{query_fvecs});
my $truth = ground_truth($data->{base_fvecs}, $data->{query_fvecs}, 10);

# recall@10 of answers ("id:distance ..." per query) against the truth
sub recall_of
{
	my ($answers) = @_;
	return recall_at([ map { [ map { (split /:/)[0] } split / / ] } @$answers ], $truth, 10);
}

# Builds index $name with $workers, returns (DEBUG1 lines, list sizes,
# answers of all queries, the calibration curve).
sub build
{
	my ($name, $workers, $with) = @_;
	my ($ret, $out, $err) = $node->psql('postgres',
		"SET max_parallel_maintenance_workers = $workers; SET client_min_messages = debug1; "
		  . "CREATE INDEX $name ON items USING gpuivf (v) WITH ($with)");
	is($ret, 0, "CREATE INDEX $name ($with) with max_parallel_maintenance_workers = $workers");
	return ($err, build_outcome($name));
}

sub build_outcome
{
	my ($name) = @_;
	my @answers;
	for my $q (@$queries)
	{
		my $lit = vec_literal($q);
		push @answers, $node->safe_psql('postgres',
			"SET enable_seqscan = off; SET gpuivf.probes = 4; "
			  . "SELECT string_agg(id || ':' || d, ' ') FROM "
			  . "(SELECT id, v <-> $lit AS d FROM items ORDER BY v <-> $lit LIMIT 10) s");
	}
	return (list_sizes($node, $name, 40), \@answers,
		$node->safe_psql('postgres', "SELECT gpuivf_index_info('$name') -> 'calibration' -> 'curve'"));
}

# What a calibration stored (its curves, the probes a scan uses, not when
# it was measured), and the same after gpuivf_calibrate measured again on
# the index's rows in one process (the sample is chosen by hash: the same
# rows).
sub calibration_of
{
	my ($name) = @_;
	return $node->safe_psql('postgres',
		"SELECT jsonb_build_array((gpuivf_index_info('$name') -> 'calibration') - 'measured_at', "
		  . "gpuivf_index_info('$name') -> 'probes')");
}

sub recalibrated
{
	my ($name) = @_;
	$node->safe_psql('postgres', "SET max_parallel_maintenance_workers = 0; SELECT gpuivf_calibrate('$name', NULL)");
	return calibration_of($name);
}

for my $rerank ('true', 'false')
{
	my $with = "lists = 40, rerank = $rerank";
	my ($log_s, $sizes_s, $ans_s, $curve_s) = build('items_serial', 0, $with);
	like($log_s, qr/gpuivf build of "items_serial": 30000 rows, 1 process;.* training [\d.]+ s \(1 process:/,
		"rerank = $rerank: the serial build ran alone");
	my $model_s = model_digest($node, 'items_serial');
	$node->safe_psql('postgres', 'DROP INDEX items_serial');
	my ($log_p, $sizes_p, $ans_p, $curve_p) = build('items_parallel', 2, $with);
	my $launches = () = $log_p =~ /uses 2 parallel workers/g;
	# the exact top-100 is shared out over the vector pages; without them
	# the leader reads the rows from the heap alone
	my $contexts = $rerank eq 'true' ? 4 : 3;
	is($launches, $contexts,
		"rerank = $rerank: the parallel build launched two workers for each scan, the training"
		  . ($rerank eq 'true' ? ' and the calibration\'s exact top-100' : ''));
	like($log_p, qr/gpuivf build of "items_parallel": 30000 rows, 3 processes;.* training [\d.]+ s \(3 processes:/,
		"rerank = $rerank: its scans and its training ran in three processes");
	is(model_digest($node, 'items_parallel'), $model_s, "rerank = $rerank: the same centroids and codebooks, bit for bit");
	if ($rerank eq 'true')
	{
		like($log_p, qr/calibrated on 200 queries from rows.*exact top-100 on the CPU \(3 processes\).* lists \(3 processes\)/,
			'rerank = true: the calibration\'s exact top-100 and sweep ran in three processes');
		is(calibration_of('items_parallel'), recalibrated('items_parallel'),
			'rerank = true: the same calibration (curves, probes) as one process measures on the same index');
	}
	is($sizes_p, $sizes_s, "rerank = $rerank: the same model: the same list sizes");
	if ($rerank eq 'false')
	{
		is_deeply($ans_p, $ans_s, 'rerank = false: the same answers (ids and distances) to 20 queries');
		is($curve_p, $curve_s, 'rerank = false: the same calibration curve (the same sample, drawn by the workers)');
	}
	else
	{
		my ($r_s, $r_p) = (recall_of($ans_s), recall_of($ans_p));
		cmp_ok(abs($r_p - $r_s), '<=', 0.01,
			sprintf('rerank = true: the same recall@10 at 4 probes (serial %.3f, parallel %.3f)', $r_s, $r_p));
	}
	$node->safe_psql('postgres', "SELECT gpuivf_verify('items_parallel', true)");
	pass("rerank = $rerank: gpuivf_verify(…, true) passes on the parallel build");

	# every page the workers wrote is in the WAL: recovery rebuilds the index
	if ($rerank eq 'true')
	{
		$node->stop('immediate');
		$node->start;
		$node->safe_psql('postgres', "SELECT gpuivf_verify('items_parallel', true)");
		pass('after an immediate shutdown right after the build, recovery gives an index that verifies');
		my (undef, $ans_r) = build_outcome('items_parallel');
		is_deeply($ans_r, $ans_s, 'and answers as before');
	}
	$node->safe_psql('postgres', 'DROP INDEX items_parallel');
}

# Above 16 dimensions the labels of each k-means iteration come from GEMM
# tiles, and with 100 lists the k-means trains on the whole sample (no
# subsample of its own): the participants label blocks of the sample for
# every iteration.  Their labels are those of one process: the same model
# bit for bit, with one worker and with two.  The calibration's exact
# top-100, merged from the participants' parts, and its sweep, whose
# queries they share, are those of one process: the build stores the
# calibration that measuring again alone stores.
{
	my $wide = generate_data(rows => 12000, dims => 32, seed => 12);
	load_vectors($node, 'wide', $wide->{base_copy});
	$node->safe_psql('postgres', 'ALTER TABLE wide SET (parallel_workers = 2)');
	my %digest;
	for my $workers (0, 1, 2)
	{
		my ($ret, $out, $err) = $node->psql('postgres',
			"SET max_parallel_maintenance_workers = $workers; SET client_min_messages = debug1; "
			  . "CREATE INDEX wide_idx ON wide USING gpuivf (v) WITH (lists = 100)");
		is($ret, 0, "32 dimensions, 100 lists: CREATE INDEX with $workers workers");
		my $procs = $workers + 1;
		like($err, qr/training [\d.]+ s \($procs process(es)?:/, "trained in $procs process(es)");
		if ($workers > 0)
		{
			like($err, qr/exact top-100 on the CPU \($procs processes\).* lists \($procs processes\)/,
				"the calibration's exact top-100 and sweep in $procs processes");
		}
		else
		{
			like($err, qr/exact top-100 on the CPU \d/, 'the calibration\'s exact top-100 in one process');
		}
		is(calibration_of('wide_idx'), recalibrated('wide_idx'),
			"$workers workers: the calibration one process measures on the same index");
		$digest{$workers} = model_digest($node, 'wide_idx');
		$node->safe_psql('postgres', 'DROP INDEX wide_idx');
	}
	is($digest{1}, $digest{0}, 'one worker: the serial build\'s centroids and codebooks, bit for bit');
	is($digest{2}, $digest{0}, 'two workers: the same');
	$node->safe_psql('postgres', 'DROP TABLE wide');
}

# The leader and the workers append vector pages to one fork at once, each
# taking chunks of pages under the relation extension lock (the leader too,
# although the index is new in its transaction: without, a worker and the
# leader were now and then handed the same pages, and "two list entries
# point at the same vector tuple": 1 of 8 builds of 30,000 x 64 on a busy
# two-core machine).  A race: four more builds, each verified, may catch a
# regression, not surely.
my $bad = 0;
for my $i (1 .. 4)
{
	$node->safe_psql('postgres', 'CREATE INDEX items_again ON items USING gpuivf (v) WITH (lists = 40)');
	my ($r, $o, $e) = $node->psql('postgres', "SELECT gpuivf_verify('items_again', true)");
	if ($r != 0)
	{
		$bad++;
		note("build $i: $e");
	}
	$node->safe_psql('postgres', 'DROP INDEX items_again');
}
is($bad, 0, 'four more parallel builds, every one verifies (the leader and the workers never share a page)');

my ($ret, $out, $err) = $node->psql('postgres',
	"SET client_min_messages = debug1; CREATE INDEX CONCURRENTLY items_cic ON items USING gpuivf (v) WITH (lists = 40)");
is($ret, 0, 'CREATE INDEX CONCURRENTLY');
like($err, qr/uses 2 parallel workers/, 'builds in parallel too');
$node->safe_psql('postgres', "SELECT gpuivf_verify('items_cic', true); DROP INDEX items_cic");

# a row of other dimensions at the end of the heap: a worker (or the
# leader) meets it, the build fails with its error
$node->safe_psql('postgres', "INSERT INTO items VALUES (-1, '{1,2,3}')");
($ret, $out, $err) = $node->psql('postgres', "CREATE INDEX items_bad ON items USING gpuivf (v) WITH (lists = 40)");
isnt($ret, 0, 'a row of other dimensions fails the parallel build');
like($err, qr/different vector dimensions 16 and 3/, 'with the row\'s error');

done_testing();
