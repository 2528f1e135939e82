
# A GPU copy's catch-up after inserts reads a long list from its start page
# on (the first page that had room when the last walk read it: inserts only
# fill pages, src/pg/README.md, "Never stale"), not from its head, and after
# a change that removes entries it reads the lists from their heads again.
# With the CPU stand-in of the GPU engine and lists of several pages each:
#  - after a few inserts, the catch-up read the changed lists from their
#    start pages, and the inserted rows are the next GPU answers;
#  - after DELETE + VACUUM (which frees room in early pages, and new rows
#    fill it), the catch-up reads from the heads and the GPU answers equal
#    the CPU's;
#  - inserting, querying, deleting and VACUUMing clients at once: every
#    inserted row is its client's next GPU answer, and afterwards the GPU
#    answers equal the CPU's.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my $node = fake_gpu_node('worker_insert_page', $fake, "log_min_messages = debug1\nmax_connections = 40\n");
is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is ready with the stand-in engine');

# four lists of about 3,000 rows: several list pages each
$node->safe_psql('postgres', q{SELECT setseed(0.5);}
	  . grouped_items_sql(12000, 4, 0.5)
	  . q{CREATE INDEX items_id ON items (id);
	      CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 4, pq_m = 4);});
# a list page holds fewer than 600 entries (8 kB, each at least 14 bytes)
my $smallest = $node->safe_psql('postgres', q{SELECT gpuivf_index_info('items_v') -> 'list_size' ->> 'min'});
cmp_ok($smallest, '>=', 2400, 'each list holds more rows than four list pages can');
my $gpu = 'SET gpuivf.device = gpu; SET gpuivf.probes = 2; SET enable_seqscan = off;';   # 2 of 4: not exact
my $cpu = 'SET gpuivf.device = cpu; SET gpuivf.probes = 2; SET enable_seqscan = off;';

sub nearest
{
	my ($vec_sql) = @_;
	return $node->safe_psql('postgres', "$gpu SELECT id FROM items ORDER BY v <-> ($vec_sql) LIMIT 1");
}

sub answers
{
	my ($settings) = @_;
	return join "\n", map {
		knn_answer($node, 'items', "(SELECT v FROM items WHERE id = $_)", 10, settings => $settings)
	} (1, 2, 777, 3001, 5998, 11999);
}

# the load, then a catch-up that records where the lists take inserts
is(nearest('SELECT v FROM items WHERE id = 5'), '5', 'a GPU query finds a row by its own vector');
$node->safe_psql('postgres',
	'INSERT INTO items SELECT 100000 + id, ARRAY(SELECT x + 0.001 FROM unnest(v) x) FROM items WHERE id IN (1, 2)');
is(nearest('SELECT v FROM items WHERE id = 100001'), '100001', 'a first inserted row is found');

# -------------------------------------------- inserts: from the start page
my $off = -s $node->logfile;
$node->safe_psql('postgres',
	'INSERT INTO items SELECT 100000 + id, ARRAY(SELECT x + 0.001 FROM unnest(v) x) FROM items WHERE id IN (3, 4, 5, 6)');
is(nearest('SELECT v FROM items WHERE id = 100004'), '100004', 'rows inserted later are found');
my $s = [ grep { $_->{kind} eq 'caught up' } @{ worker_syncs($node, $off) } ];
ok(@$s == 1 && $s->[0]{inserts_only} eq 'yes' && $s->[0]{walked} >= 1
	  && $s->[0]{from_start_page} == $s->[0]{walked},
	'the catch-up read every changed list from its start page on')
  or diag explain $s, grep { /GPU worker/ } split /\n/, slurp_file($node->logfile, $off);
cmp_ok($s->[0] ? $s->[0]{pages} : 99, '<=', 2 * ($s->[0] ? $s->[0]{walked} : 0),
	'and took at most two changed pages a list');

# ------------------------------------------- removals: from the heads
$off = -s $node->logfile;
$node->safe_psql('postgres', 'DELETE FROM items WHERE id % 10 = 3 AND id < 3000; VACUUM items;');
$node->safe_psql('postgres',
	'INSERT INTO items SELECT 200000 + id, ARRAY(SELECT x + 0.002 FROM unnest(v) x) FROM items WHERE id BETWEEN 1 AND 40');
is(nearest('SELECT v FROM items WHERE id = 200011'), '200011', 'a row inserted after VACUUM is found');
$s = [ grep { $_->{kind} eq 'caught up' } @{ worker_syncs($node, $off) } ];
ok(@$s >= 1 && $s->[0]{removed} > 0 && $s->[0]{from_start_page} == 0,
	'the catch-up after VACUUM read the lists from their heads')
  or diag explain $s;
is(answers($gpu), answers($cpu), 'after VACUUM GPU answers equal the CPU answers (ids and distances)');

# a catch-up of inserts after that finds the room VACUUM left
$off = -s $node->logfile;
$node->safe_psql('postgres',
	'INSERT INTO items SELECT 300000 + id, ARRAY(SELECT x + 0.003 FROM unnest(v) x) FROM items WHERE id BETWEEN 41 AND 60');
is(nearest('SELECT v FROM items WHERE id = 300050'), '300050', 'rows inserted into the freed room are found');
is(answers($gpu), answers($cpu), 'and GPU answers equal the CPU answers');

# ---------------------------- inserting, querying, deleting, VACUUM at once
$node->safe_psql('postgres', 'CREATE SEQUENCE ins START 400000');
my %scripts = (
	'insert_find@2' => insert_find_script('ins', '(:k % 1198) * 10 + 1'),
	'delete_vacuum@1' => q{\set r random(1, 1198)
DELETE FROM items WHERE id BETWEEN :r * 10 + 2 AND :r * 10 + 9;
VACUUM items;
},
);
my $bench;
{
	local $ENV{PGOPTIONS} = '-c gpuivf.device=gpu -c gpuivf.probes=2 -c enable_seqscan=off';
	$bench = start_pgbench($node, '-c 5 -j 2 -T 10', \%scripts);
}
my ($rc, $out, $err) = finish_pgbench($bench);
is($rc, 0, 'pgbench finished without client errors') or diag("stdout:\n$out\nstderr:\n$err");
unlike($err, qr/not the next GPU query|ERROR/, 'every inserted row was its client\'s next GPU answer');
is(answers($gpu), answers($cpu), 'afterwards GPU answers equal the CPU answers (ids and distances)');
$node->stop;
done_testing();
