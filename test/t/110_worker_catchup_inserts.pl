
# A GPU copy catches up with inserts by walking only the lists that changed
# since its last walk (list change counters in shared memory: src/pg/README.md,
# "Never stale"), with the CPU stand-in of the GPU engine.  The worker's
# DEBUG1 line of each catch-up says how many lists it walked, how many
# entries it removed first and whether only inserts happened:
#  - a load walks every list; after one committed insert the next GPU query
#    finds the row, and its catch-up walked one list and only appended;
#  - after DELETE + VACUUM the catch-up knows entries were removed (it
#    replaces the changed pages' entries) and the answers equal the CPU's;
#  - inserting and querying clients at once (pgbench): each inserted row,
#    once committed, is the answer of its client's next GPU query for its own
#    vector; the catch-ups meanwhile only appended, most of them walked a
#    few of the lists; afterwards the answers equal the CPU's;
#  - the same with clients deleting rows and running VACUUM among them:
#    catch-ups after removals replace the changed pages' entries, and
#    afterwards the answers equal the CPU's and the index verifies.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my $lists = 20;
my $node = fake_gpu_node('worker_catchup', $fake, "log_min_messages = debug1\nmax_connections = 40\n");
is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is ready with the stand-in engine');

# CREATE INDEX has the worker load the copy once its pages are written
my $off = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT setseed(0.25);}
	  . grouped_items_sql(3000, 23, 0.2)
	  . qq{CREATE INDEX items_id ON items (id);
	       CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = $lists);});

my $gpu = 'SET gpuivf.device = gpu; SET gpuivf.probes = 4; SET enable_seqscan = off;';
my $cpu = 'SET gpuivf.device = cpu; SET gpuivf.probes = 4; SET enable_seqscan = off;';

sub syncs_since { return worker_syncs($node, $_[0]); }

sub nearest
{
	my ($vec_sql) = @_;
	return $node->safe_psql('postgres', "$gpu SELECT id FROM items ORDER BY v <-> ($vec_sql) LIMIT 1");
}

my @probe_ids = (1, 17, 450, 999, 1500, 2222, 2999);
sub answers
{
	my ($settings) = @_;
	return join "\n", map {
		knn_answer($node, 'items', "(SELECT v FROM items WHERE id = $_)", 10, settings => $settings)
	} @probe_ids;
}

# ------------------------------------------------------------ the load
is(nearest('SELECT v FROM items WHERE id = 5'), '5', 'a GPU query finds a row by its own vector');
my $s = syncs_since($off);
my ($load) = grep { $_->{kind} eq 'loaded' } @$s;
ok($load, 'the worker loaded the copy');
is($load && "$load->{walked} of $load->{lists}", "$lists of $lists", 'a load walks every list');

# ------------------------------------------------- one insert, one list
$off = -s $node->logfile;
$node->safe_psql('postgres',
	'INSERT INTO items SELECT 100001, ARRAY(SELECT x + 0.001 FROM unnest(v) x) FROM items WHERE id = 7');
is(nearest('SELECT v FROM items WHERE id = 100001'), '100001',
	'the committed row is the next GPU query\'s answer for its own vector');
$s = [ grep { $_->{kind} eq 'caught up' } @{ syncs_since($off) } ];
is(scalar(@$s), 1, 'the copy caught up once');
is($s->[0] && "$s->[0]{walked} of $s->[0]{lists}", "1 of $lists", 'that catch-up walked the one list that changed');
is($s->[0] && "$s->[0]{removed} $s->[0]{inserts_only}", '0 yes', 'and appended, removing nothing');

# five inserts into at most five lists
$off = -s $node->logfile;
$node->safe_psql('postgres',
	'INSERT INTO items SELECT 100001 + id, ARRAY(SELECT x + 0.001 FROM unnest(v) x) FROM items WHERE id IN (1, 2, 3, 4, 5)');
is(nearest('SELECT v FROM items WHERE id = 100004'), '100004', 'rows of a multi-row insert are found');
$s = [ grep { $_->{kind} eq 'caught up' } @{ syncs_since($off) } ];
ok(@$s == 1 && $s->[0]{walked} >= 1 && $s->[0]{walked} <= 5,
	'after five inserts the catch-up walked between one and five lists')
  or diag explain $s;

# ------------------------------------------------- DELETE + VACUUM
$off = -s $node->logfile;
$node->safe_psql('postgres', 'DELETE FROM items WHERE id % 10 = 3; VACUUM items;');
# the new rows reuse the freed space
$node->safe_psql('postgres',
	'INSERT INTO items SELECT 200000 + id, ARRAY(SELECT x + 0.002 FROM unnest(v) x) FROM items WHERE id BETWEEN 1 AND 40');
is(nearest('SELECT v FROM items WHERE id = 200011'), '200011', 'a row inserted after VACUUM is found');
$s = [ grep { $_->{kind} eq 'caught up' } @{ syncs_since($off) } ];
ok(@$s >= 1 && $s->[0]{removed} > 0 && $s->[0]{inserts_only} eq 'no',
	'the catch-up after VACUUM saw entries removed and replaced the changed pages\' entries')
  or diag explain $s;
is(answers($gpu), answers($cpu), 'after VACUUM GPU answers equal the CPU answers (ids and distances)');

# ---------------------------------- inserting and querying clients at once
$node->safe_psql('postgres', 'CREATE SEQUENCE ins START 300000');
my %scripts = (
	# a new row near a base row (ids ending in 1: none was deleted), then the
	# nearest row to its own vector on the GPU: it must be the new row (fails
	# the client otherwise)
	'insert_find@1' => insert_find_script('ins', '(:k % 298) * 10 + 1'),
	'query@2' => q{\set r random(1, 2990)
SELECT count(*) AS found FROM (SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id >= :r ORDER BY id LIMIT 1) LIMIT 10) s \gset
\if :found != 10
SELECT 'a GPU query returned fewer than 10 rows'::int;
\endif
},
);
my $refreshes = worker_stat($node, 'refreshes');
$off = -s $node->logfile;
my $bench;
{
	local $ENV{PGOPTIONS} = '-c gpuivf.device=gpu -c gpuivf.probes=4 -c enable_seqscan=off';
	$bench = start_pgbench($node, '-c 6 -j 2 -T 12', \%scripts);
}
my ($rc, $out, $err) = finish_pgbench($bench);
is($rc, 0, 'pgbench finished without client errors') or diag("stdout:\n$out\nstderr:\n$err");
unlike($err, qr/not the next GPU query|fewer than 10|ERROR/, 'every inserted row was its client\'s next GPU answer');
my $inserted = $node->safe_psql('postgres', 'SELECT count(*) FROM items WHERE id >= 300000');
cmp_ok($inserted, '>', 20, 'the clients inserted rows meanwhile');
$s = [ grep { $_->{kind} eq 'caught up' } @{ syncs_since($off) } ];
my @walked = sort { $a <=> $b } map { $_->{walked} } @$s;
note sprintf('%d rows inserted, %d catch-ups (gpuivf_stat.refreshes +%d), lists walked: median %s, max %s of %d',
	$inserted, scalar(@$s), worker_stat($node, 'refreshes') - $refreshes,
	$walked[ $#walked / 2 ] // '-', $walked[-1] // '-', $lists);
cmp_ok(scalar(@$s), '>', 0, 'the copy caught up meanwhile');
is(scalar(grep { $_->{removed} > 0 || $_->{inserts_only} ne 'yes' } @$s), 0,
	'every catch-up under inserts only appended (nothing removed)');
my @few = grep { $_->{walked} < $lists / 2 } @$s;
cmp_ok(scalar(@few), '>=', scalar(@$s) / 2, 'most catch-ups walked fewer than half of the lists');
is(answers($gpu), answers($cpu), 'afterwards GPU answers equal the CPU answers (ids and distances)');

# ------------------------- and with DELETE + VACUUM running among them
$scripts{'delete_vacuum@1'} = q{\set r random(1, 298)
DELETE FROM items WHERE id BETWEEN :r * 10 + 2 AND :r * 10 + 9 OR (id >= 300000 AND id % 7 = :r % 7 AND random() < 0.01);
VACUUM items;
};
$off = -s $node->logfile;
{
	local $ENV{PGOPTIONS} = '-c gpuivf.device=gpu -c gpuivf.probes=4 -c enable_seqscan=off';
	$bench = start_pgbench($node, '-c 6 -j 2 -T 10', \%scripts);
}
($rc, $out, $err) = finish_pgbench($bench);
is($rc, 0, 'with DELETE and VACUUM too, pgbench finished without client errors')
  or diag("stdout:\n$out\nstderr:\n$err");
unlike($err, qr/not the next GPU query|fewer than 10|ERROR/,
	'every inserted row was still its client\'s next GPU answer');
$s = [ grep { $_->{kind} eq 'caught up' } @{ syncs_since($off) } ];
cmp_ok(scalar(grep { $_->{inserts_only} eq 'no' && $_->{removed} > 0 } @$s), '>', 0,
	'catch-ups after VACUUM\'s removals replaced the changed pages\' entries');
is(answers($gpu), answers($cpu), 'afterwards GPU answers equal the CPU answers (ids and distances)');
$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v', true)});
pass('the index verifies (heapallindexed)');

$node->stop;
done_testing();
