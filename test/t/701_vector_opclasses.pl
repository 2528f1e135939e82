
# gpuivf on pgvector's vector and halfvec columns (extension gpuivf_vector):
# every operator class builds, answers like the same data as real[] (same
# options: the same lists, codes and rows), in exact mode exactly like a
# sequential scan ordered by pgvector's own operator, keeps halfvec as halves
# (a smaller index), takes dims from the typmod, and passes gpuivf_verify.
# Skipped, with the reason, without pgvector.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $why = pgvector_missing();
plan skip_all => $why if $why;

my $node = pgvector_node('vector_opclasses');
my $data = generate_data(rows => 4000, dims => 32, queries => 25, seed => 501);
my $queries = read_fvecs($data->{query_fvecs});
load_vectors($node, 'items', $data->{base_copy});
# the same rows as vector(32), as halfvec(32), and the halfvec's values
# (rounded to half precision) as real[] again
$node->safe_psql('postgres', q{
	CREATE TABLE items_v AS SELECT id, v::vector(32) AS v FROM items;
	CREATE TABLE items_h AS SELECT id, v::halfvec(32) AS v FROM items;
	CREATE TABLE items_hr AS SELECT id, v::vector::real[] AS v FROM items_h;
});

my $lists = 40;
my %suffix = (l2 => 'l2_ops', ip => 'ip_ops', cosine => 'cosine_ops');
for my $metric (qw(l2 ip cosine))
{
	my %opclass = (real => metric_opclass($metric), vector => "vector_$suffix{$metric}",
		halfvec => "halfvec_$suffix{$metric}");
	my $with = "WITH (lists = $lists, pq_m = 8)";
	$node->safe_psql('postgres', qq{
		CREATE INDEX items_idx ON items USING gpuivf (v $opclass{real}) $with;
		CREATE INDEX items_v_idx ON items_v USING gpuivf (v $opclass{vector}) $with;
		CREATE INDEX items_h_idx ON items_h USING gpuivf (v $opclass{halfvec}) $with;
		CREATE INDEX items_hr_idx ON items_hr USING gpuivf (v $opclass{real}) $with;
	});

	# approximate answers: the same model, codes and exact re-rank bits
	my $approx = 'SET gpuivf.probes = 4;';
	my $real = knn_ids($node, 'items', $metric, $queries, 10, settings => $approx);
	is_deeply(knn_ids($node, 'items_v', $metric, $queries, 10, settings => $approx, type => 'vector'),
		$real, "$metric: vector column answers exactly as the same data as real[]");
	is_deeply(knn_ids($node, 'items_h', $metric, $queries, 10, settings => $approx, type => 'halfvec'),
		knn_ids($node, 'items_hr', $metric, $queries, 10, settings => $approx, type => 'halfvec::vector::real[]'),
		"$metric: halfvec column answers exactly as its widened values as real[]");
	is(list_sizes($node, 'items_v_idx', $lists), list_sizes($node, 'items_idx', $lists),
		"$metric: vector and real[] indexes have the same lists");

	# exact mode against pgvector's operator in a sequential scan
	my $exact = "SET gpuivf.probes = $lists;";
	for my $case ([ 'items_v', 'vector' ], [ 'items_h', 'halfvec' ])
	{
		my ($table, $type) = @$case;
		is_deeply(knn_ids($node, $table, $metric, $queries, 10, settings => $exact, type => $type),
			knn_ids($node, $table, $metric, $queries, 10, seqscan => 1, type => $type),
			"$metric: $type exact scan returns the sequential scan's rows in its order");
	}
	for my $index (qw(items_v_idx items_h_idx))
	{
		$node->safe_psql('postgres', "SELECT gpuivf_verify('$index', true)");
		pass("$metric: gpuivf_verify($index, true)");
	}
	$node->safe_psql('postgres', 'DROP INDEX items_idx, items_v_idx, items_h_idx, items_hr_idx');
}

# what the index says of itself; halfvec keeps halves: fewer pages
$node->safe_psql('postgres', q{
	CREATE INDEX items_v_idx ON items_v USING gpuivf (v) WITH (lists = 40);
	CREATE INDEX items_h_idx ON items_h USING gpuivf (v) WITH (lists = 40);
});
my $vinfo = index_info($node, 'items_v_idx');
my $hinfo = index_info($node, 'items_h_idx');
is_deeply([ @$vinfo{qw(type storage rerank_from dims metric)} ], [ qw(vector float4 index 32 l2) ],
	'vector_l2_ops is the default for vector: type, storage, re-rank source, dims, metric');
is_deeply([ @$hinfo{qw(type storage rerank_from dims metric)} ], [ qw(halfvec float16 index 32 l2) ],
	'halfvec_l2_ops is the default for halfvec, kept as float16');
cmp_ok($hinfo->{pages}, '<', $vinfo->{pages} * 0.8,
	"the halfvec index is smaller ($hinfo->{pages} pages) than the vector one ($vinfo->{pages})");

# the typmod gives an empty table's index its dims; other dims are refused
$node->safe_psql('postgres', q{
	CREATE TABLE empty_v (id int, v vector(8));
	CREATE INDEX empty_v_idx ON empty_v USING gpuivf (v);
});
is(index_info($node, 'empty_v_idx')->{dims}, 8, 'an index on an empty vector(8) column has 8 dims');
$node->safe_psql('postgres', q{INSERT INTO empty_v VALUES (1, '[1,2,3,4,5,6,7,8]'), (2, '[2,2,2,2,2,2,2,2]')});
is($node->safe_psql('postgres', exact_settings()
	  . q{SELECT string_agg(id::text, ',') FROM (SELECT id FROM empty_v ORDER BY v <-> '[1,2,3,4,5,6,7,8]' LIMIT 2) s}),
	'1,2', 'the untrained index answers exactly');
$node->safe_psql('postgres', "SELECT gpuivf_verify('empty_v_idx', true)");
pass('gpuivf_verify of the untrained vector index');

# gpuivf's value bound (1e15) on pgvector's vector, which takes any finite
# value: an insert into the index and a query beyond it are 22003 naming the
# element; pgvector's own operator still orders the table without the index
my ($rc, $out, $err) = $node->psql('postgres', q{INSERT INTO empty_v VALUES (3, '[1,2,3,4,5,6,7,1e16]')});
like($err, qr/vector value 1e\+16 is out of range.*\n.*Element 8 of the vector/s,
	'a vector value beyond 1e15 is refused by the index, naming the element');
($rc, $out, $err) = $node->psql('postgres', exact_settings()
	  . q{SELECT id FROM empty_v ORDER BY v <-> '[1,2,3,4,5,6,7,1e16]' LIMIT 1});
like($err, qr/vector value 1e\+16 is out of range/, 'and so is such a query through the index');
is($node->safe_psql('postgres', q{SET enable_indexscan = off;
	SELECT count(*) FROM (SELECT id FROM empty_v ORDER BY v <-> '[1,2,3,4,5,6,7,1e16]' LIMIT 2) s}), '2',
	'pgvector\'s operator itself (a sequential scan) takes it');

# the operator classes are valid (amvalidate) and support function 1 computes
# what pgvector's operator computes
is($node->safe_psql('postgres', q{
	SELECT string_agg(opcname || '=' || amvalidate(c.oid)::int, ',' ORDER BY opcname)
	FROM pg_opclass c WHERE opcmethod = (SELECT oid FROM pg_am WHERE amname = 'gpuivf')
	  AND opcname LIKE ANY (ARRAY['vector%', 'halfvec%'])}),
	'halfvec_cosine_ops=1,halfvec_ip_ops=1,halfvec_l2_ops=1,vector_cosine_ops=1,vector_ip_ops=1,vector_l2_ops=1',
	'the six operator classes pass amvalidate');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM items_v a, items_v b
	WHERE a.id < 30 AND b.id < 30
	  AND (abs(gpuivf_l2_distance(a.v, b.v) - (a.v <-> b.v)) > 1e-6 * (1 + (a.v <-> b.v))
	    OR abs(gpuivf_negative_inner_product(a.v, b.v) - (a.v <#> b.v)) > 1e-5 * (1 + abs(a.v <#> b.v))
	    OR abs(gpuivf_cosine_distance(a.v, b.v) - (a.v <=> b.v)) > 1e-6)}), '0',
	"gpuivf's distances on vector agree with pgvector's operators");
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM items_h a, items_h b
	WHERE a.id < 30 AND b.id < 30
	  AND (abs(gpuivf_l2_distance(a.v, b.v) - (a.v <-> b.v)) > 1e-6 * (1 + (a.v <-> b.v))
	    OR abs(gpuivf_cosine_distance(a.v, b.v) - (a.v <=> b.v)) > 1e-6)}), '0',
	"gpuivf's distances on halfvec agree with pgvector's operators");

# inserts after the build, VACUUM, verify
$node->safe_psql('postgres', q{
	INSERT INTO items_h SELECT id + 100000, v FROM items_h WHERE id < 300;
	DELETE FROM items_h WHERE id % 5 = 0;
	VACUUM items_h;
});
$node->safe_psql('postgres', "SELECT gpuivf_verify('items_h_idx', true)");
pass('halfvec index after inserts, deletes and VACUUM passes gpuivf_verify(…, true)');

$node->stop;
done_testing();
