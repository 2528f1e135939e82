
# Inserts into a trained, WAL-logged index leave its metapage alone: the
# index counts its rows in its list directory, and a GPU copy learns of new
# rows from the newest LSN of the directory pages, the rows' version
# (src/pg/README.md, "Insert" and "Never stale"); here with the CPU stand-in
# of the GPU engine, on a primary and on a streaming hot standby:
#  - clients inserting at once into every list (pgbench) leave the metapage
#    generation where it was, while the version moves; the directory's
#    counts equal the table's rows and gpuivf_verify agrees;
#  - every committed row is the answer of its client's next GPU query for
#    its own vector, and afterwards every new row is found by a GPU query on
#    the primary and, once replayed, on the standby, whose catch-up only
#    appended (the generation had not moved) and whose counts equal the rows;
#  - DELETE and VACUUM move the generation: the standby's next catch-up
#    replaces the changed pages' entries, and its answers equal the CPU's;
#  - an unlogged index (page LSNs do not move) counts its rows on the
#    metapage, every insert moving the generation, and its GPU copy finds
#    every row.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my ($primary, $standby) = fake_gpu_primary_standby($fake, "max_connections = 40\n");

my $rows = 4000;
my $lists = 20;
$primary->safe_psql('postgres', "SELECT setseed(0.5);\n"
	  . grouped_items_sql($rows, 23, 0.2)
	  . "CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = $lists);\n"
	  . "CREATE SEQUENCE ins START 100000;\n");
$primary->wait_for_catchup($standby, 'replay');

my $gpu = 'SET gpuivf.device = gpu; SET gpuivf.probes = 4; SET enable_seqscan = off;';
my $cpu = 'SET gpuivf.device = cpu; SET gpuivf.probes = 4; SET enable_seqscan = off;';

# new rows (id >= 100000) whose nearest row by a GPU query is another one
sub missed_new_rows
{
	my ($node) = @_;
	return $node->safe_psql('postgres', "$gpu SELECT count(*) FROM items i WHERE i.id >= 100000 AND "
		  . "(SELECT j.id FROM items j ORDER BY j.v <-> i.v LIMIT 1) IS DISTINCT FROM i.id");
}

sub info
{
	my ($node, $key) = @_;
	return $node->safe_psql('postgres', "SELECT gpuivf_index_info('items_v')->>'$key'");
}

# both copies loaded before the inserts
for my $node ($primary, $standby)
{
	is($node->safe_psql('postgres', "$gpu SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = 5) LIMIT 1"),
		'5', $node->name . ': a GPU query finds a row by its own vector');
}
my $generation = info($primary, 'generation');
my $version = info($primary, 'version');

# ---------------------------------------------- concurrent inserts
my %scripts = (
	# a new row near a base row of any group (so every list gets rows), then
	# the nearest row to its own vector on the GPU: it must be the new row
	'insert_find' => insert_find_script('ins', "(:k % $rows) + 1"),
);
my $bench;
{
	local $ENV{PGOPTIONS} = '-c gpuivf.device=gpu -c gpuivf.probes=4 -c enable_seqscan=off';
	$bench = start_pgbench($primary, '-c 8 -j 2 -T 6', \%scripts);
}
my ($rc, $out, $err) = finish_pgbench($bench);
is($rc, 0, 'pgbench finished without client errors') or diag("stdout:\n$out\nstderr:\n$err");
unlike($err, qr/not the next GPU query|ERROR/, 'every committed row was its client\'s next GPU answer');
my $inserted = $primary->safe_psql('postgres', 'SELECT count(*) FROM items WHERE id >= 100000');
cmp_ok($inserted, '>', 50, 'the clients inserted rows meanwhile');
cmp_ok($primary->safe_psql('postgres',
		"SELECT count(DISTINCT ((i.id % $rows) + 1) % 23) FROM items i WHERE i.id >= 100000"),
	'>=', 20, 'near rows of (nearly) every group, so into many lists');

is(info($primary, 'generation'), $generation, 'the inserts left the metapage generation where it was');
cmp_ok(info($primary, 'version'), '>', $version, 'while the version of the rows moved');
my $count = $primary->safe_psql('postgres', 'SELECT count(*) FROM items');
is(info($primary, 'vectors'), $count, 'the directory\'s counts equal the table\'s rows');
is($primary->safe_psql('postgres', "SELECT gpuivf_verify('items_v', true)"), '',
	'gpuivf_verify (heapallindexed) agrees');
is(missed_new_rows($primary), '0', 'every new row is found by a GPU query on the primary');

# ----------------------------------------------- the standby replays them
$primary->wait_for_catchup($standby, 'replay');
my $off = -s $standby->logfile;
is(missed_new_rows($standby), '0', 'every new row is found by a GPU query on the standby');
my @ups = grep { $_->{kind} eq 'caught up' } @{ worker_syncs($standby, $off) };
ok(@ups >= 1 && $ups[0]{by_generation} eq 'yes' && $ups[0]{inserts_only} eq 'yes' && $ups[0]{removed} == 0,
	'the standby\'s copy caught up by appending: the generation had not moved')
  or diag explain \@ups;
is(info($standby, 'vectors'), $count, 'the standby\'s directory counts the same rows');
is($standby->safe_psql('postgres', "SELECT gpuivf_verify('items_v')"), '',
	'gpuivf_verify agrees on the standby');

# ----------------------------------------------------- DELETE + VACUUM
$primary->safe_psql('postgres', 'DELETE FROM items WHERE id % 7 = 3; VACUUM items;');
isnt(info($primary, 'generation'), $generation, 'VACUUM moved the generation');
$primary->wait_for_catchup($standby, 'replay');
$off = -s $standby->logfile;
my @probe_ids = (1, 17, 450, 999, 2222, 3999);
my $answers = sub {
	my ($node, $settings) = @_;
	return join "\n", map {
		knn_answer($node, 'items', "(SELECT v FROM items WHERE id = $_)", 10, settings => $settings)
	} @probe_ids;
};
is($answers->($standby, $gpu), $answers->($standby, $cpu),
	'after DELETE and VACUUM the standby\'s GPU answers equal its CPU answers');
@ups = grep { $_->{kind} eq 'caught up' } @{ worker_syncs($standby, $off) };
ok(@ups >= 1 && $ups[0]{by_generation} eq 'no' && $ups[0]{removed} > 0,
	'its catch-up saw entries removed (the generation moved) and replaced them')
  or diag explain \@ups;
is(info($standby, 'vectors'), $primary->safe_psql('postgres', 'SELECT count(*) FROM items'),
	'the counts follow the deletions');

# ------------------------------------------------------ unlogged index
$primary->safe_psql('postgres', "SELECT setseed(0.5);\n"
	  . "CREATE UNLOGGED TABLE u AS SELECT * FROM items WHERE id <= 2000;\n"
	  . "CREATE INDEX u_v ON u USING gpuivf (v) WITH (lists = 10);\n");
my $ugen = $primary->safe_psql('postgres', "SELECT gpuivf_index_info('u_v')->>'generation'");
is($primary->safe_psql('postgres', "$gpu SELECT id FROM u ORDER BY v <-> (SELECT v FROM u WHERE id = 5) LIMIT 1"),
	'5', 'unlogged: a GPU query finds a row');
$primary->safe_psql('postgres', "INSERT INTO u SELECT 100000 + id, ARRAY(SELECT x + 0.001 FROM unnest(v) x) "
	  . "FROM u WHERE id IN (1, 2, 4, 5, 8)");
cmp_ok($primary->safe_psql('postgres', "SELECT gpuivf_index_info('u_v')->>'generation'"), '>=', $ugen + 5,
	'unlogged: each of five inserts moved the metapage generation');
is($primary->safe_psql('postgres', "$gpu SELECT count(*) FROM u i WHERE i.id >= 100000 AND "
		  . "(SELECT j.id FROM u j ORDER BY j.v <-> i.v LIMIT 1) = i.id"),
	'5', 'unlogged: the GPU copy finds every new row');

done_testing();
