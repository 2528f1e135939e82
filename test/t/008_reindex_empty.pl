
# An index built on an empty table (untrained: a NOTICE says so) takes its
# dimensions from the first insert, answers exactly while untrained, and
# REINDEX CONCURRENTLY — with inserts running meanwhile — trains it without
# losing a row.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('reindex');
my $data = generate_data(rows => 4000, dims => 24, queries => 10, seed => 13);
my $queries = read_fvecs($data->{query_fvecs});
my $q = vec_literal($queries->[0]);

$node->safe_psql('postgres', 'CREATE TABLE items (id bigint, v real[])');
my ($ret, $stdout, $stderr) = $node->psql('postgres', 'CREATE INDEX items_v_idx ON items USING gpuivf (v)');
is($ret, 0, 'CREATE INDEX on an empty table succeeds');
like($stderr, qr/NOTICE:/, 'and says so in a NOTICE');
note "notice: $stderr";

my $info = index_info($node, 'items_v_idx');
is($info->{trained}, 'false', 'the empty-table index is untrained');
is($info->{dims}, 0, 'and has no dimensions yet');
is($node->safe_psql('postgres', "SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> $q LIMIT 5) s"),
	'0', 'a query on the empty index returns no rows');

load_vectors($node, 'items', $data->{base_copy}, no_create => 1);
$info = index_info($node, 'items_v_idx');
is($info->{dims}, 24, 'dimensions come from the first insert');
is($info->{vectors}, 4000, 'all 4000 inserted vectors are in the index');
my ($r2, $o2, $e2) = $node->psql('postgres', q{INSERT INTO items VALUES (-1, '{1,2,3}')});
like($e2, qr/vector has 3 dimensions, but gpuivf index "items_v_idx" has 24/, 'a vector of other dimensions is rejected, naming the index');

my $seq_sql = "SET enable_indexscan = off; SELECT id FROM items ORDER BY v <-> $q, id LIMIT 10";
my $idx_sql = "SET enable_seqscan = off; SELECT id FROM items ORDER BY v <-> $q LIMIT 10";
assert_index_scan($node, 'items_v_idx', "SELECT id FROM items ORDER BY v <-> $q LIMIT 10", '', 'queries use the untrained index');
is($node->safe_psql('postgres', $idx_sql), $node->safe_psql('postgres', $seq_sql),
	'the untrained index answers exactly (brute force over its vectors)');
$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v_idx', true)});
pass('gpuivf_verify(…, true) passes on the untrained index');

# REINDEX CONCURRENTLY while rows keep coming in.
$node->safe_psql('postgres', q{
	CREATE SEQUENCE items_id START 1000000;
	ALTER TABLE items ALTER id SET DEFAULT nextval('items_id');
});
my $bench = start_pgbench($node, '-c 2 -j 2 -T 8', {
	'insert' => q{INSERT INTO items (v) SELECT v FROM items WHERE id = (SELECT (random() * 3999)::int);
} });
# wait until the inserts are flowing, then rebuild under them
$node->poll_query_until('postgres', 'SELECT count(*) > 4100 FROM items') or die 'no inserts';
my $before = $node->safe_psql('postgres', 'SELECT count(*) FROM items');
$node->safe_psql('postgres', 'REINDEX INDEX CONCURRENTLY items_v_idx');
my $after = $node->safe_psql('postgres', 'SELECT count(*) FROM items');
cmp_ok($after, '>', $before, "rows were inserted while REINDEX CONCURRENTLY ran ($before -> $after)");
my ($rc, $out, $err) = finish_pgbench($bench);
is($rc, 0, 'inserts during REINDEX CONCURRENTLY succeeded') or diag($err);

$info = index_info($node, 'items_v_idx');
is($info->{trained}, 'true', 'REINDEX CONCURRENTLY trained the index');
cmp_ok($info->{lists}, '>=', 4, "with the automatic list count ($info->{lists} lists for the rows it saw)");
$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v_idx', true)});
pass('gpuivf_verify(…, true) passes after REINDEX CONCURRENTLY');
my $rows = $node->safe_psql('postgres', 'SELECT count(*) FROM items WHERE v IS NOT NULL');
my @exact = count_via_index($node, 'items', 'l2', $q, "SET gpuivf.probes = $info->{lists};");
is_deeply(\@exact, [ $rows, $rows ], "exact mode returns each of the $rows rows once");
my $dist_idx = $node->safe_psql('postgres',
	exact_settings() . "SET gpuivf.probes = $info->{lists}; SELECT v <-> $q FROM items ORDER BY v <-> $q LIMIT 10");
my $dist_seq = $node->safe_psql('postgres', "SET enable_indexscan = off; SELECT v <-> $q FROM items ORDER BY v <-> $q LIMIT 10");
is($dist_idx, $dist_seq, 'exact mode top-10 distances equal a sequential scan\'s');

$node->stop;
done_testing();
