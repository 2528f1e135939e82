
# GPU read replicas: a streaming hot standby runs its own GPU worker (here
# the CPU stand-in of the GPU engine, test/gpu/fake_engine.cpp) and serves
# kNN queries from the pages it replayed:
#  - its worker loads the index from replayed pages and answers exactly as
#    the primary's worker does (ids and distances), with the probes the
#    calibration replayed from the primary chose;
#  - rows inserted on the primary are found by the standby's worker once
#    replayed (its copy catches up), rows deleted and vacuumed are gone;
#  - an ANALYZE on the primary reaches the standby's scans through the WAL;
#  - a REINDEX on the primary makes the standby's worker load the new index;
#  - the standby's worker keeps serving through a restart of the primary,
#    and through the standby's promotion, after which it serves the rows
#    written on the new primary and the rows replayed just before;
#  - during recovery every catch-up walks every list (replay moves no list
#    change counter), and so does the first catch-up after the promotion.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my ($primary, $standby) = fake_gpu_primary_standby($fake, "hot_standby_feedback = on\n");
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');

$primary->safe_psql('postgres', "SELECT setseed(0.25);\n"
	  . grouped_items_sql(6000, 29, 0.2)
	  . "CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 40);\n"
	  . "ANALYZE items;\n");
$primary->wait_for_catchup($standby, 'replay');

# query vectors: rows of the table, shifted a little so that they are not rows
my @qs = map {
	$primary->safe_psql('postgres',
		"SELECT ARRAY(SELECT x + 0.05 FROM unnest(v) x)::real[] FROM items WHERE id = $_")
} (7, 450, 1999, 3001, 5555);

# every query on the GPU worker, automatic probes (the replayed curve)
sub answers
{
	my ($node, $k) = @_;
	$k //= 10;
	my $sql = "SET gpuivf.device = gpu; SET enable_seqscan = off;\n";
	$sql .= "SELECT string_agg(id || ':' || d, ',') FROM (SELECT id, v <-> '$_' AS d FROM items "
	  . "ORDER BY v <-> '$_' LIMIT $k) r;\n"
	  for @qs;
	return $node->safe_psql('postgres', $sql);
}

sub worker_queries { return worker_stat($_[0], 'queries'); }

my $probes = q{SELECT gpuivf_index_info('items_v')->'probes'->>'in_use', gpuivf_index_info('items_v')->'probes'->>'source'};
is($standby->safe_psql('postgres', $probes), $primary->safe_psql('postgres', $probes),
	'the standby uses the probes of the replayed calibration');
like($standby->safe_psql('postgres', $probes), qr/\|curve$/, 'which come from the curve');

my $q0 = worker_queries($standby);
my $on_primary = answers($primary);
my $on_standby = answers($standby);
is($on_standby, $on_primary, 'the standby\'s GPU worker answers as the primary\'s (ids and distances)');
cmp_ok(worker_queries($standby), '>=', $q0 + scalar(@qs), 'the standby\'s worker searched them');
is(worker_stat($standby, 'loads'), '1', 'after loading the index from replayed pages once');
is($standby->safe_psql('postgres', "SELECT gpuivf_index_info('items_v')->'gpu_cache'->0->>'worker'"),
	'0', 'gpuivf_index_info on the standby says its worker 0 holds the index');
is($on_standby, answers_cpu($standby),
	'and as the CPU engine of the standby');

sub answers_cpu
{
	my ($node) = @_;
	my $sql = "SET gpuivf.device = cpu; SET enable_seqscan = off;\n";
	$sql .= "SELECT string_agg(id || ':' || d, ',') FROM (SELECT id, v <-> '$_' AS d FROM items "
	  . "ORDER BY v <-> '$_' LIMIT 10) r;\n"
	  for @qs;
	return $node->safe_psql('postgres', $sql);
}

# ------------------------------------------------- replayed inserts
# a copy of the row each query was made from, shifted onto the query: the
# nearest row of each query once replayed
my $i = 0;
$primary->safe_psql('postgres', join '',
	map { $i++; "INSERT INTO items VALUES (-$i, '$_');\n" } @qs);
my $r0 = worker_stat($standby, 'refreshes');
$primary->wait_for_catchup($standby, 'replay');
my $log_at = -s $standby->logfile;
my $nearest = "SET gpuivf.device = gpu; SET enable_seqscan = off;\n"
  . join '', map { "SELECT id FROM items ORDER BY v <-> '$_' LIMIT 1;\n" } @qs;
is($standby->safe_psql('postgres', $nearest), join("\n", map { -$_ } 1 .. scalar(@qs)),
	'rows inserted on the primary are found by the standby\'s GPU worker once replayed');
cmp_ok(worker_stat($standby, 'refreshes'), '>', $r0, 'its copy caught up with the replayed pages');
my @ups = grep { $_->{kind} eq 'caught up' } @{ worker_syncs($standby, $log_at) };
ok(@ups && !grep({ $_->{walked} != 40 || $_->{lists} != 40 } @ups),
	'in recovery each catch-up walked all 40 lists') or diag explain \@ups;
is(worker_stat($standby, 'loads'), '1', 'without loading the index again');
is(answers($standby), answers($primary), 'both answer alike after the inserts');

# ----------------------------------- deletes, VACUUM, more inserts
$primary->safe_psql('postgres', q{
	DELETE FROM items WHERE id % 4 = 0 OR id = -2;
	VACUUM items;
	INSERT INTO items
	SELECT 20000 + i, ARRAY(SELECT ((i % 29) * 0.2 + random())::real FROM generate_series(1, 16) WHERE i > 0)
	FROM generate_series(1, 800) i;
});
$primary->wait_for_catchup($standby, 'replay');
$on_standby = answers($standby);
is($on_standby, answers($primary), 'after DELETE, VACUUM and inserts the standby answers as the primary');
is($on_standby, answers_cpu($standby), 'and as its own CPU engine');
unlike($on_standby, qr/(^|,)(-2|4|8|452|2000|3000|5552):/, 'deleted rows are not returned');

# ------------------------------------------- calibration through WAL
my $curve = q{SELECT gpuivf_index_info('items_v')->'calibration'};
$primary->safe_psql('postgres', 'SET gpuivf.analyze_sample = 150; ANALYZE items');
$primary->wait_for_catchup($standby, 'replay');
like($primary->safe_psql('postgres', $curve), qr/"sample": 150/, 'the primary measured a new curve');
is($standby->safe_psql('postgres', $curve), $primary->safe_psql('postgres', $curve),
	'the standby has the new curve');
for my $t (qw(0.8 0.99))
{
	my $sql = "SET gpuivf.target_recall = $t; $probes";
	is($standby->safe_psql('postgres', $sql), $primary->safe_psql('postgres', $sql),
		"target $t: the standby chooses the primary's probes");
}

# ------------------------------------------ the primary restarts
my $spid = worker_stat($standby, 'pid');
$primary->restart;
$primary->safe_psql('postgres', q{
	INSERT INTO items SELECT -100 - id, v FROM items WHERE id BETWEEN 1 AND 5});
$primary->wait_for_catchup($standby, 'replay');
is(worker_stat($standby, 'pid'), $spid, 'the standby\'s worker kept running through the primary\'s restart');
is(worker_stat($standby, 'state'), 'ready', 'and is ready');
is( $standby->safe_psql('postgres',
		"SET gpuivf.device = gpu; SELECT string_agg(id::text, ',' ORDER BY id) FROM "
		  . "(SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = 3) LIMIT 2) s"),
	'-103,3', 'rows inserted after the restart are found on the standby\'s GPU');
is(answers($standby), answers($primary), 'both still answer alike');

# a REINDEX on the primary: the standby's worker loads the new index (a new
# relfilenode and model) instead of serving its copy of the old one
$primary->safe_psql('postgres', 'REINDEX INDEX items_v');
$primary->wait_for_catchup($standby, 'replay');
my $l0 = worker_stat($standby, 'loads');
is(answers($standby), answers($primary), 'after a REINDEX on the primary both answer alike');
is(worker_stat($standby, 'loads'), $l0 + 1, 'the standby\'s worker loaded the rebuilt index');

# --------------------------------------------------------- promotion
# rows replayed just before the promotion, not yet on the standby's GPU
$primary->safe_psql('postgres', q{
	INSERT INTO items SELECT -300 - id, v FROM items WHERE id BETWEEN 6 AND 10});
$primary->wait_for_catchup($standby, 'replay');
$primary->stop;
$standby->promote;
$log_at = -s $standby->logfile;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 'f', 'the standby was promoted');
is(worker_stat($standby, 'pid'), $spid, 'its worker kept running through the promotion');
$q0 = worker_queries($standby);
$standby->safe_psql('postgres', q{
	INSERT INTO items SELECT -200 - id, v FROM items WHERE id BETWEEN 1 AND 5});
is( $standby->safe_psql('postgres',
		"SET gpuivf.device = gpu; SELECT string_agg(id::text, ',' ORDER BY id) FROM "
		  . "(SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = 3) LIMIT 3) s"),
	'-203,-103,3', 'after promotion its GPU worker finds the rows written on the new primary');
@ups = grep { $_->{kind} eq 'caught up' } @{ worker_syncs($standby, $log_at) };
is($ups[0] && "$ups[0]{walked} of $ups[0]{lists}", '40 of 40',
	'the first catch-up after the promotion walked every list');
is( $standby->safe_psql('postgres',
		"SET gpuivf.device = gpu; SELECT string_agg(id::text, ',' ORDER BY id) FROM "
		  . "(SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = 7) LIMIT 2) s"),
	'-307,7', 'and the rows replayed just before the promotion');
cmp_ok(worker_queries($standby), '>', $q0, 'answered by the worker');
is(answers($standby), answers_cpu($standby), 'and answers as the CPU engine');
$standby->safe_psql('postgres', 'ANALYZE items');
like($standby->safe_psql('postgres', $probes), qr/\|curve$/, 'the promoted server calibrates the index itself');
is($standby->safe_psql('postgres', "SELECT gpuivf_verify('items_v', true)"), '',
	'the index verifies on the promoted server');
ok(!$standby->log_contains("\\[$spid\\] +(ERROR|FATAL|PANIC)"), 'the standby\'s worker logged no error');

$standby->stop;
done_testing();
