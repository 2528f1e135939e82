
# Crash during concurrent inserts: a backend killed with SIGKILL in the middle
# of inserting (the postmaster then restarts every backend and replays WAL),
# and later an immediate shutdown, leave an index that gpuivf_verify(…, true)
# accepts and that returns every committed row, in exact mode and without a
# LIMIT at the default probes.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use GpuivfTest;

my $node = gpuivf_node('crash', conf => "restart_after_crash = on\n");
my $dims = 32;
my $data = generate_data(rows => 3000, dims => $dims, queries => 1, seed => 21);
my $q = vec_literal(read_fvecs($data->{query_fvecs})->[0]);

load_vectors($node, 'items', $data->{base_copy});
$node->safe_psql('postgres', q{
	CREATE SEQUENCE items_id START 1000000;
	ALTER TABLE items ALTER id SET DEFAULT nextval('items_id');
	CREATE INDEX items_id_idx ON items (id);
	CREATE INDEX items_v_idx ON items USING gpuivf (v) WITH (lists = 16);
});

# Ten rows per transaction, each near one of ten consecutive base rows (so
# they spread over the lists), with a NULL vector now and then.
my $insert = q{\set r random(0, 2990)
INSERT INTO items (v)
SELECT CASE WHEN random() < 0.02 THEN NULL ELSE
       (SELECT array_agg(x + ((random() - 0.5) * 0.1)::real) FROM unnest(b.v) AS x) END
FROM items b WHERE b.id BETWEEN :r AND :r + 9;
};

sub wait_for_rows
{
	my ($min) = @_;
	for (1 .. 600)
	{
		my $n = $node->safe_psql('postgres', 'SELECT count(*) FROM items');
		return $n if $n >= $min;
		usleep(100_000);
	}
	return 0;
}

sub check_index
{
	my ($when) = @_;
	$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v_idx', true)});
	pass("$when: gpuivf_verify(items_v_idx, true) passes");

	my $rows = $node->safe_psql('postgres', 'SELECT count(*) FROM items WHERE v IS NOT NULL');
	my $lists = index_lists($node, 'items_v_idx');
	my @exact = count_via_index($node, 'items', 'l2', $q, "SET gpuivf.probes = $lists;");
	is_deeply(\@exact, [ $rows, $rows ], "$when: exact mode returns each of the $rows rows once");
	my @approx = count_via_index($node, 'items', 'l2', $q, 'SET gpuivf.probes = 1;');
	is_deeply(\@approx, [ $rows, $rows ], "$when: without LIMIT a 1-probe scan still reaches all $rows rows");
	return;
}

assert_index_scan($node, 'items_v_idx', "SELECT id FROM items ORDER BY v <-> $q", '', 'the counts below go through the index');

# 1. SIGKILL an inserting backend.
my $bench = start_pgbench($node, '-c 2 -j 2 -T 60', { 'insert' => $insert });
my $before = $node->safe_psql('postgres', 'SELECT count(*) FROM items');
ok(wait_for_rows($before + 500), 'concurrent inserts are running');
my $victim = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE query LIKE '%INSERT INTO items%' AND pid <> pg_backend_pid()
	  ORDER BY state = 'active' DESC LIMIT 1});
ok($victim =~ /^\d+$/, 'found an inserting backend');
kill 'KILL', $victim;
my ($rc) = finish_pgbench($bench);
isnt($rc, 0, 'pgbench saw the crash');

# The postmaster restarts after the crash; wait until it accepts queries.
$node->poll_query_until('postgres', 'SELECT true') or die 'server did not come back';
ok($node->log_contains('terminated by signal 9'), 'the server went through crash recovery');
check_index('after SIGKILL of a backend');

# 2. Immediate shutdown (no checkpoint) while inserting.
$bench = start_pgbench($node, '-c 2 -j 2 -T 60', { 'insert' => $insert });
$before = $node->safe_psql('postgres', 'SELECT count(*) FROM items');
ok(wait_for_rows($before + 500), 'concurrent inserts are running again');
$node->stop('immediate');
finish_pgbench($bench);
$node->start;
check_index('after an immediate shutdown');

# The index still takes inserts and finds them.
$node->safe_psql('postgres', "INSERT INTO items (id, v) VALUES (-42, $q)");
is($node->safe_psql('postgres', "SELECT id FROM items ORDER BY v <-> $q LIMIT 1"),
	'-42', 'a row inserted after recovery is the nearest to itself');

$node->stop;
done_testing();
