
# What an index does when the dimension of a column's vectors changes:
#  - an untrained index (built on a table without vectors) that holds no
#    vector any more (every row deleted, VACUUM) takes the dimension of the
#    next row, as it took the first one's;
#  - a trained index keeps its model's dimension: an insert of another
#    dimension fails with an error that names the index, says why, and
#    whose HINT (REINDEX) works: the rebuilt index takes the new dimension;
#  - a query of another dimension on an index that holds no vector returns
#    no rows, as a sequential scan of the table does; on one that holds
#    vectors, an error that names the index.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('index_dimension_change', conf => "autovacuum = off\n");
my $idx = 'SET enable_seqscan = off; SET gpuivf.probes = 2;';
my $seq = 'SET enable_indexscan = off; SET enable_bitmapscan = off;';
sub vecs
{
	my ($dims, $from, $to) = @_;
	return "SELECT g, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, $dims) WHERE g > 0) "
	  . "FROM generate_series($from, $to) g";
}
my $q3 = q{'{0.1,0.2,0.3}'};
my $q32 = "'{" . join(',', (0.1) x 32) . "}'";

# ------------------------------------------------------------ untrained
$node->safe_psql('postgres', qq{
	CREATE TABLE u (id int, v real[]);
	CREATE INDEX u_v ON u USING gpuivf (v);
	INSERT INTO u } . vecs(32, 1, 50) . qq{;
	DELETE FROM u;
	VACUUM u;
	INSERT INTO u } . vecs(3, 1, 50) . qq{;
});
pass('an emptied untrained index takes the dimension of the next row');
is($node->safe_psql('postgres', "$idx SELECT count(*) FROM (SELECT id FROM u ORDER BY v <-> $q3 LIMIT 100) s"),
	'50', 'and finds the new rows through an index scan');
is($node->safe_psql('postgres', q{SELECT gpuivf_index_info('u_v')->>'dims'}), '3',
	'gpuivf_index_info shows the new dimension');
$node->safe_psql('postgres', q{SELECT gpuivf_verify('u_v', true)});
pass('gpuivf_verify(u_v, true) passes');
my ($rc, $out, $err) = $node->psql('postgres', 'INSERT INTO u ' . vecs(32, 51, 51));
like($err, qr/ERROR:  vector has 32 dimensions, but gpuivf index "u_v" has 3/,
	'while it holds vectors, another dimension is refused, naming the index');

# -------------------------------------------------------------- trained
$node->safe_psql('postgres', qq{
	CREATE TABLE t (id int, v real[]);
	INSERT INTO t } . vecs(32, 1, 2000) . qq{;
	CREATE INDEX t_v ON t USING gpuivf (v) WITH (lists = 4);
});
($rc, $out, $err) = $node->psql('postgres', "$idx SELECT id FROM t ORDER BY v <-> $q3 LIMIT 3");
like($err, qr/ERROR:  query vector has 3 dimensions, but gpuivf index "t_v" has 32/,
	'a query of another dimension on an index holding vectors: an error naming the index');

$node->safe_psql('postgres', 'DELETE FROM t; VACUUM t;');
is($node->safe_psql('postgres', q{SELECT gpuivf_index_info('t_v')->>'vectors'}), '0', 'every row deleted and vacuumed');
is($node->safe_psql('postgres', "$idx SELECT count(*) FROM (SELECT id FROM t ORDER BY v <-> $q3 LIMIT 3) s"),
	'0', 'a query of another dimension on the emptied index returns no rows');
is($node->safe_psql('postgres', "$seq SELECT count(*) FROM (SELECT id FROM t ORDER BY v <-> $q3 LIMIT 3) s"),
	'0', 'as a sequential scan does');

($rc, $out, $err) = $node->psql('postgres', 'INSERT INTO t ' . vecs(3, 1, 10));
like($err, qr/ERROR:  vector has 3 dimensions, but gpuivf index "t_v" has 32/,
	'an insert of another dimension into the emptied trained index names the index');
like($err, qr/DETAIL:  The index holds no vectors, but it was trained on vectors of 32 dimensions\./,
	'... says why');
like($err, qr/HINT:  To index vectors of another dimension, rebuild the index with REINDEX INDEX t_v/,
	'... and says REINDEX');

# the hint works
$node->safe_psql('postgres', 'REINDEX INDEX t_v; INSERT INTO t ' . vecs(3, 1, 10));
is($node->safe_psql('postgres', "$idx SELECT count(*) FROM (SELECT id FROM t ORDER BY v <-> $q3 LIMIT 100) s"),
	'10', 'after REINDEX the index takes the new dimension and finds the rows');
$node->safe_psql('postgres', q{SELECT gpuivf_verify('t_v', true)});
pass('gpuivf_verify(t_v, true) passes');

$node->stop;
done_testing();
