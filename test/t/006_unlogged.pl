
# Unlogged table: after a crash the table is empty and its gpuivf index is
# reset from the init fork (an untrained, empty index) that answers queries
# (no rows), takes inserts and finds them; REINDEX trains it again.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('unlogged');
my $data = generate_data(rows => 3000, dims => 16, queries => 5, seed => 3);
my $queries = read_fvecs($data->{query_fvecs});
my $q = vec_literal($queries->[0]);

load_vectors($node, 'items', $data->{base_copy}, unlogged => 1);
$node->safe_psql('postgres', 'CREATE INDEX items_v_idx ON items USING gpuivf (v) WITH (lists = 10)');
is(index_info($node, 'items_v_idx')->{vectors}, 3000, 'index holds 3000 vectors before the crash');
is(scalar(@{ knn_ids($node, 'items', 'l2', [$queries->[0]], 5)->[0] }), 5, 'kNN query works before the crash');

$node->stop('immediate');
$node->start;

is($node->safe_psql('postgres', 'SELECT count(*) FROM items'), '0', 'the unlogged table is empty after the crash');
my $info = index_info($node, 'items_v_idx');
is($info->{vectors}, 0, 'the index is empty after the crash');
is($info->{trained}, 'false', 'the reset index is untrained (init fork)');
is($node->safe_psql('postgres', "SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> $q LIMIT 5) s"),
	'0', 'a kNN query on the reset index returns no rows');
$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v_idx', true)});
pass('gpuivf_verify passes on the reset index');

# Inserts into the reset index are found, in exact order.
load_vectors($node, 'items', $data->{base_copy}, no_create => 1);
$node->safe_psql('postgres', "INSERT INTO items VALUES (-1, NULL)");
assert_index_scan($node, 'items_v_idx', "SELECT id FROM items ORDER BY v <-> $q LIMIT 10", '', 'queries use the index');
my $by_index = $node->safe_psql('postgres', "SET enable_seqscan = off; SELECT id FROM items ORDER BY v <-> $q LIMIT 10");
my $by_seq = $node->safe_psql('postgres', "SET enable_indexscan = off; SELECT id FROM items ORDER BY v <-> $q, id LIMIT 10");
is($by_index, $by_seq, 'after inserts the reset index returns the exact top-10');
is(index_info($node, 'items_v_idx')->{vectors}, 3000, 'the reset index counts the 3000 new vectors (not the NULL)');
$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v_idx', true)});
pass('gpuivf_verify(…, true) passes after inserts');

# REINDEX trains it (lists appear) and it keeps answering exactly in exact mode.
$node->safe_psql('postgres', 'REINDEX INDEX items_v_idx');
$info = index_info($node, 'items_v_idx');
is($info->{trained}, 'true', 'REINDEX trained the index');
is($info->{lists}, 10, 'with its 10 lists');
$by_index = $node->safe_psql('postgres', "SET enable_seqscan = off; SET gpuivf.probes = 10; SELECT id FROM items ORDER BY v <-> $q LIMIT 10");
is($by_index, $by_seq, 'the retrained index in exact mode returns the same top-10');

# A second crash resets it again.
$node->stop('immediate');
$node->start;
is(index_info($node, 'items_v_idx')->{vectors}, 0, 'a second crash resets the retrained index too');

$node->stop;
done_testing();
