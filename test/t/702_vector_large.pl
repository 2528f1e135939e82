
# Vectors larger than an index page, and re-rank from the table's column.
#  - vector(3072) (OpenAI text-embedding-3-large's size): too large for a
#    page, so the index re-ranks from the table (rerank_from 'auto'); exact
#    mode equals a sequential scan, the approximate answers find the nearest
#    rows, inserts are found, VACUUM and gpuivf_verify hold;
#    rerank_from = 'index' is refused with a clear error;
#  - halfvec(4000) fits a page as halves: kept in the index;
#  - real[] of 16,000 dimensions (pgvector's limit) builds and answers;
#  - rerank_from = 'table' on small vectors gives the answers of the
#    index-stored copy (the same exact distances), with a smaller index, also
#    when the scan must go deeper than round 1 and for an expression index;
#  - an untrained index re-ranking from the table answers exactly.
# Skipped, with the reason, without pgvector.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $why = pgvector_missing();
plan skip_all => $why if $why;

my $node = pgvector_node('vector_large');

# clustered rows: centre (id % 12) plus noise, in $dims dimensions
sub make_table
{
	my ($table, $type, $dims, $rows) = @_;
	$node->safe_psql('postgres', qq{
		SELECT setseed(0.502);
		CREATE TABLE $table (id int, v $type);
		INSERT INTO $table
		SELECT i, ARRAY(SELECT ((i % 12) * 0.1 + random() * 0.2 - 0.1)::real
		                FROM generate_series(1, $dims) WHERE i > 0)::$type
		FROM generate_series(1, $rows) i;
	});
}

# ids of the 10 nearest rows to row $qid's vector (scaled), by the index or
# (seqscan) by a sorted sequential scan
sub nearest
{
	my ($table, $qid, $settings, $seqscan) = @_;
	my $set = $seqscan ? 'SET enable_indexscan = off; SET enable_bitmapscan = off;' : exact_settings();
	return $node->safe_psql('postgres', "$set $settings
		SELECT string_agg(id::text, ',') FROM (SELECT id FROM $table
		ORDER BY v <-> (SELECT v FROM $table WHERE id = $qid) LIMIT 10) s");
}

sub same_as_seqscan
{
	my ($table, $lists, $name) = @_;
	my @q = (7, 123, 250);
	is_deeply([ map { nearest($table, $_, "SET gpuivf.probes = $lists;", 0) } @q ],
		[ map { nearest($table, $_, '', 1) } @q ], $name);
}

# ------------------------------------------------------------ vector(3072)
make_table('big_v', 'vector(3072)', 3072, 480);
$node->safe_psql('postgres', 'CREATE INDEX big_v_idx ON big_v USING gpuivf (v) WITH (lists = 6)');
my $info = index_info($node, 'big_v_idx');
is_deeply([ @$info{qw(dims rerank_from storage trained)} ], [ 3072, 'table', 'float4', 'true' ],
	'vector(3072): trained, re-ranked from the table (no copy fits a page)');
same_as_seqscan('big_v', 6, 'vector(3072): exact mode returns the sequential scan\'s rows');
is(nearest('big_v', 99, 'SET gpuivf.probes = 2;', 0), nearest('big_v', 99, '', 1),
	'vector(3072): two of six lists find the ten nearest rows');
like($node->safe_psql('postgres', exact_settings() . ' SET gpuivf.probes = 2;
	EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT id FROM big_v
	ORDER BY v <-> (SELECT v FROM big_v WHERE id = 5) LIMIT 10'), qr/Re-ranked: [1-9]\d*/,
	'EXPLAIN shows the candidates re-ranked from the table');
$node->safe_psql('postgres', q{
	INSERT INTO big_v SELECT 100000 + id, v FROM big_v WHERE id <= 20;
	DELETE FROM big_v WHERE id % 9 = 0;
	VACUUM big_v;
});
is($node->safe_psql('postgres', exact_settings() . q{ SET gpuivf.probes = 2;
	SELECT id FROM big_v ORDER BY v <-> (SELECT v FROM big_v WHERE id = 100011) LIMIT 1}), '11',
	'vector(3072): a row inserted after the build is found (its twin first: lower TID)');
$node->safe_psql('postgres', "SELECT gpuivf_verify('big_v_idx', true)");
pass('vector(3072): gpuivf_verify(…, true) after inserts, deletes and VACUUM');
my ($ret, $out, $err) = $node->psql('postgres',
	"CREATE INDEX ON big_v USING gpuivf (v) WITH (lists = 6, rerank_from = 'index')");
like($err, qr/vectors of 3072 dimensions do not fit a page of gpuivf index/,
	'rerank_from = \'index\' is refused for vectors larger than a page');

# ----------------------------------------------------------- halfvec(4000)
make_table('big_h', 'halfvec(4000)', 4000, 300);
$node->safe_psql('postgres', 'CREATE INDEX big_h_idx ON big_h USING gpuivf (v) WITH (lists = 4)');
$info = index_info($node, 'big_h_idx');
is_deeply([ @$info{qw(dims rerank_from storage)} ], [ 4000, 'index', 'float16' ],
	'halfvec(4000): its halves fit a page and are kept in the index');
same_as_seqscan('big_h', 4, 'halfvec(4000): exact mode returns the sequential scan\'s rows');
$node->safe_psql('postgres', "SELECT gpuivf_verify('big_h_idx', true)");
pass('halfvec(4000): gpuivf_verify(…, true)');

# ----------------------------------------------------------- real[] x 16000
make_table('huge_r', 'real[]', 16000, 120);
$node->safe_psql('postgres', 'CREATE INDEX huge_r_idx ON huge_r USING gpuivf (v) WITH (lists = 3)');
is(index_info($node, 'huge_r_idx')->{rerank_from}, 'table', 'real[] of 16000 dimensions: builds, from the table');
is(nearest('huge_r', 40, 'SET gpuivf.probes = 3;', 0), nearest('huge_r', 40, '', 1),
	'real[] of 16000 dimensions: exact mode returns the sequential scan\'s rows');

# ------------------------------------------- rerank_from = 'table' vs 'index'
# two copies of one table (the same heap TIDs), one index each
make_table('small_v', 'vector(32)', 32, 3000);
$node->safe_psql('postgres', q{
	CREATE TABLE small_t AS SELECT * FROM small_v;
	CREATE INDEX small_idx_i ON small_v USING gpuivf (v) WITH (lists = 30, rerank_from = 'index');
	CREATE INDEX small_idx_t ON small_t USING gpuivf (v) WITH (lists = 30, rerank_from = 'table');
});
my %size = map { $_ => $node->safe_psql('postgres', "SELECT pg_relation_size('$_')") } qw(small_idx_i small_idx_t);
cmp_ok($size{small_idx_t}, '<', $size{small_idx_i} / 2,
	"re-rank from the table keeps no copy: $size{small_idx_t} bytes against $size{small_idx_i}");
my $q17 = '(SELECT v FROM small_v WHERE id = 17)';
for my $case (
	[ 'round 1', "SELECT ctid, v <-> $q17 FROM TABLE ORDER BY v <-> $q17 LIMIT 10" ],
	[ 'deeper rounds (a 1% filter)', "SELECT ctid, v <-> $q17 FROM TABLE WHERE id % 100 = 3 ORDER BY v <-> $q17 LIMIT 10" ])
{
	my ($what, $sql) = @$case;
	my ($i, $t) = map { $node->safe_psql('postgres', exact_settings() . ' SET gpuivf.probes = 2; '
		  . ($sql =~ s/TABLE/$_/r)) } qw(small_v small_t);
	is($t, $i, "rerank_from table and index give the same rows and distances: $what");
}
my $plan = $node->safe_psql('postgres', exact_settings() . ' SET gpuivf.probes = 2; EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) '
	  . "SELECT id FROM small_t WHERE id % 100 = 3 ORDER BY v <-> $q17 LIMIT 10");
like($plan, qr/Index Scan using small_idx_t/, 'the filtered query uses the index re-ranking from the table');
like($plan, qr/Deepened: [1-9]/, 'and goes past round 1 (chunks re-ranked from the table)');
$node->safe_psql('postgres', "SELECT gpuivf_verify('small_idx_t', true)");
pass('rerank_from = table: gpuivf_verify(…, true)');

# an expression index re-ranking from the table computes the expression
$node->safe_psql('postgres', q{
	DROP INDEX small_idx_i;
	CREATE INDEX small_expr ON small_v USING gpuivf ((v::halfvec(32)) halfvec_l2_ops)
		WITH (lists = 30, rerank_from = 'table');
});
my $expr_query = 'SELECT string_agg(id::text, \',\') FROM (SELECT id FROM small_v
	ORDER BY v::halfvec(32) <-> (SELECT v::halfvec(32) FROM small_v WHERE id = 55) LIMIT 10) s';
is($node->safe_psql('postgres', exact_settings() . " SET gpuivf.probes = 30; $expr_query"),
	$node->safe_psql('postgres', "SET enable_indexscan = off; $expr_query"),
	'an expression index (v::halfvec(32)) re-ranked from the table: exact mode equals the sequential scan');
like($node->safe_psql('postgres', exact_settings() . " EXPLAIN (COSTS OFF) $expr_query"),
	qr/Index Scan using small_expr/, 'the expression index is used');

# untrained, from the table: every row exact
$node->safe_psql('postgres', q{
	CREATE TABLE empty_big (id int, v vector(3072));
	CREATE INDEX empty_big_idx ON empty_big USING gpuivf (v);
	INSERT INTO empty_big SELECT id, v FROM big_v WHERE id < 60;
});
is_deeply([ @{ index_info($node, 'empty_big_idx') }{qw(trained rerank_from dims)} ], [ 'false', 'table', 3072 ],
	'an untrained vector(3072) index keeps heap TIDs only');
is(nearest('empty_big', 30, '', 0), nearest('empty_big', 30, '', 1),
	'the untrained index answers exactly from the table');
$node->safe_psql('postgres', "SELECT gpuivf_verify('empty_big_idx', true)");
pass('untrained, from the table: gpuivf_verify(…, true)');

$node->stop;
done_testing();
