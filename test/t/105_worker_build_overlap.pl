
# CREATE INDEX through the GPU worker encodes batch after batch while its
# heap scan goes on: the scan fills one area of the build's DSM segment
# while the worker encodes the other (src/pg/am/build.cpp, FlushBatch).  With
# the CPU stand-in engine and a delay on every encoding request (so that a
# request really is in flight while the scan runs):
#  - many overlapping batches (maintenance_work_mem = 1MB) give the same
#    index as one batch (64MB): same list sizes, same answers, verified;
#  - an error in the middle of the encoding scan (an index expression that
#    fails on its 3,000th row of the second scan) abandons the request in
#    flight, and the next build through the worker succeeds.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

local $ENV{GPUIVF_FAKE_ENCODE_DELAY_MS} = 40;
my $node = fake_gpu_node('worker_build_overlap', $fake);
is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is ready with the stand-in engine');

$node->safe_psql('postgres', q{
	SELECT setseed(0.25);
}
	. grouped_items_sql(6000, 17, 0.3));

my @probe_ids = (1, 77, 1234, 3000, 5999);
my @vecs = map { $node->safe_psql('postgres', "SELECT v FROM items WHERE id = $_") } @probe_ids;

# Builds $name with maintenance_work_mem = $mem through the worker; returns
# the DEBUG1 build line, the encoding requests it made, list sizes, answers.
sub build
{
	my ($name, $mem, $expr) = @_;
	$expr //= 'v';
	my $builds0 = worker_stat($node, 'builds');
	my $loads0 = worker_stat($node, 'loads');
	my ($ret, $out, $err) = $node->psql('postgres',
		"SET maintenance_work_mem = '$mem'; SET client_min_messages = debug1; "
		  . "CREATE INDEX $name ON items USING gpuivf (($expr)) WITH (lists = 8)");
	return ($ret, $err) if $ret != 0;
	my ($line) = $err =~ /(gpuivf build of .*)/;
	my $requests = worker_stat($node, 'builds') - $builds0;
	# the worker loaded the fresh index before the build's calibration,
	# and the calibration's searches found that copy: one load in all
	like($err, qr/loaded index "$name" before its calibration/,
		"$name: the worker loaded it before the build's calibration");
	like($err, qr/calibrated on \d+ queries/, "$name: calibrated by the build");
	is(worker_stat($node, 'loads') - $loads0, 1, "$name: loaded once by the worker, during the build");
	my $sizes = list_sizes($node, $name, 8);
	my @answers = map {
		$node->safe_psql('postgres',
			"SET enable_seqscan = off; SET gpuivf.probes = 8; "
			  . "SELECT string_agg(id || ':' || d, ' ') FROM "
			  . "(SELECT id, v <-> '$_' AS d FROM items ORDER BY v <-> '$_' LIMIT 10) s")
	} @vecs;
	$node->safe_psql('postgres', "SELECT gpuivf_verify('$name', true)");
	pass("gpuivf_verify(…, true) passes on $name");
	$node->safe_psql('postgres', "DROP INDEX $name");
	return ($ret, $line, $requests, $sizes, \@answers);
}

my (undef, $line1, $req1, $sizes1, $ans1) = build('items_one', '64MB');
my (undef, $line2, $req2, $sizes2, $ans2) = build('items_many', '1MB');
like($line1, qr/on the GPU/, 'one batch: encoded on the worker');
like($line2, qr/on the GPU/, 'many batches: encoded on the worker');
cmp_ok($req2, '>=', $req1 + 3, "small batches make more encoding requests ($req2 vs $req1)");
is($sizes2, $sizes1, 'both builds have the same list sizes');
is_deeply($ans2, $ans1, 'and give the same answers (ids and distances)');

# An index expression that fails late in the encoding scan: the sampling
# scan evaluates it 6,000 times, the encoding scan fails at its 3,000th row,
# with earlier batches submitted and one in flight.
$node->safe_psql('postgres', q{
	CREATE SEQUENCE calls;
	CREATE FUNCTION fail_late(x real[]) RETURNS real[] IMMUTABLE LANGUAGE plpgsql AS $$
	BEGIN
		IF nextval('calls') = 9000 THEN
			RAISE EXCEPTION 'fail_late: row 3000 of the encoding scan';
		END IF;
		RETURN x;
	END $$;
});
my ($ret, $err) = build('items_bad', '1MB', 'fail_late(v)');
isnt($ret, 0, 'a build failing in the middle of its encoding scan fails');
like($err, qr/fail_late: row 3000/, 'with the expression\'s error');
my ($ret3, $line3) = build('items_after', '1MB');
is($ret3, 0, 'the next build through the worker works');
like($line3, qr/on the GPU/, 'and encodes on the worker');
is(worker_stat($node, 'state'), 'ready', 'the worker is still ready');

done_testing();
