
# The planner integration on pgvector columns as applications write their
# queries: a prepared statement ORDER BY embedding <-> $1 LIMIT $2 (custom
# and generic plans) reaches the index with its LIMIT; ANALYZE's curve picks
# the probes for gpuivf.target_recall and held-out queries reach it; a
# filtered query returns the full LIMIT; EXPLAIN ANALYZE shows the probes,
# their source, rows asked and re-ranks; on a partitioned halfvec table
# the LIMIT reaches every partition's index, exact mode answers like a
# sequential scan, and a LATERAL kNN join is batched on every partition's
# index with the nested loop's rows.  Skipped, with the reason, without
# pgvector.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $why = pgvector_missing();
plan skip_all => $why if $why;

my $node = pgvector_node('vector_planner');
my $data = generate_data(rows => 20000, dims => 32, queries => 60, seed => 505);
my $queries = read_fvecs($data->{query_fvecs});
load_vectors($node, 'items', $data->{base_copy});
$node->safe_psql('postgres', q{
	CREATE TABLE docs (id bigint PRIMARY KEY, cat int, embedding vector(32));
	INSERT INTO docs SELECT id, (hashint8(id) & 2147483647) % 100, v::vector FROM items;
	CREATE INDEX docs_embedding_idx ON docs USING gpuivf (embedding) WITH (lists = 100);
	VACUUM ANALYZE docs;
});

# a prepared statement with both parameters, in custom and generic plans
my $q0 = vec_literal($queries->[0], 'vector');
for my $mode (qw(force_custom_plan force_generic_plan))
{
	my $plan = $node->safe_psql('postgres', qq{
		SET plan_cache_mode = $mode;
		PREPARE knn(vector, int) AS SELECT id FROM docs ORDER BY embedding <-> \$1 LIMIT \$2;
		EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE knn($q0, 7);});
	like($plan, qr/Index Scan using docs_embedding_idx/, "$mode: the prepared statement uses the index");
	like($plan, qr/Rows Asked: 7\b/, "$mode: its LIMIT \$2 reaches the index (7 rows asked)");
	like($plan, qr/Probes From: tuned curve/, "$mode: the probes come from ANALYZE's curve");
	like($plan, qr/Re-ranked: \d+/, "$mode: EXPLAIN shows the re-ranked candidates");
}

# the recall target holds for held-out queries
my $truth = ground_truth($data->{base_fvecs}, $data->{query_fvecs}, 10);
my $ids = knn_ids($node, 'docs', 'l2', $queries, 10, column => 'embedding', type => 'vector');
my $recall = recall_at($ids, $truth, 10);
note "recall\@10 at gpuivf.target_recall 0.95 on a vector column: $recall";
cmp_ok($recall, '>=', 0.93, 'held-out queries reach the 0.95 target (within sampling error)');
my $recall99 = recall_at(knn_ids($node, 'docs', 'l2', $queries, 10, column => 'embedding', type => 'vector',
		settings => 'SET gpuivf.target_recall = 0.99;'), $truth, 10);
note "recall\@10 at target 0.99: $recall99";
cmp_ok($recall99, '>=', 0.97, 'and the 0.99 target');

# a 1% filter still returns the full LIMIT, with the nearest passing rows
my $short = 0;
my $hits = 0;
for my $i (0 .. 19)
{
	my $q = vec_literal($queries->[$i], 'vector');
	my $sql = "SELECT string_agg(id::text, ',') FROM (SELECT id FROM docs WHERE cat = 3
		ORDER BY embedding <-> $q LIMIT 10) s";
	my @got = split /,/, $node->safe_psql('postgres', $sql);
	my %want = map { $_ => 1 } split /,/,
	  $node->safe_psql('postgres', "SET enable_indexscan = off; $sql");
	$short++ if @got < 10;
	$hits += grep { $want{$_} } @got;
}
is($short, 0, 'a 1% filter returns the full LIMIT of 10 rows for every query');
note "filtered recall\@10: " . $hits / 200;
cmp_ok($hits / 200, '>=', 0.8, 'the filtered rows are the nearest passing ones');

# gpuivf_calibrate on given queries: of the column's type, or real[] cast
# to it as an INSERT would (vector and halfvec)
is($node->safe_psql('postgres', q{
	SELECT gpuivf_calibrate('docs_embedding_idx', 'SELECT embedding FROM docs WHERE id % 100 = 7')
	  #>> '{calibration,sample}'}), '200', 'gpuivf_calibrate on vector queries of the vector column');
is($node->safe_psql('postgres', q{
	SELECT gpuivf_calibrate('docs_embedding_idx', 'SELECT v FROM items WHERE id < 150')
	  #>> '{calibration,sample}'}), '150', 'and on real[] queries, cast to vector');
is($node->safe_psql('postgres', "SELECT gpuivf_index_info('docs_embedding_idx') #>> '{calibration,source}'"),
	'given', 'the index says its calibration queries were given');
my $given = recall_at(knn_ids($node, 'docs', 'l2', $queries, 10, column => 'embedding', type => 'vector'), $truth, 10);
note "recall\@10 at target 0.95, calibrated on given queries: $given";
cmp_ok($given, '>=', 0.93, 'held-out queries reach the target calibrated on given queries');

# a partitioned halfvec table: an index on every partition
$node->safe_psql('postgres', q{
	CREATE TABLE parts (id bigint, embedding halfvec(32)) PARTITION BY HASH (id);
	CREATE TABLE parts_0 PARTITION OF parts FOR VALUES WITH (MODULUS 3, REMAINDER 0);
	CREATE TABLE parts_1 PARTITION OF parts FOR VALUES WITH (MODULUS 3, REMAINDER 1);
	CREATE TABLE parts_2 PARTITION OF parts FOR VALUES WITH (MODULUS 3, REMAINDER 2);
	INSERT INTO parts SELECT id, embedding::halfvec FROM docs;
	CREATE INDEX parts_embedding_idx ON parts USING gpuivf (embedding halfvec_cosine_ops) WITH (lists = 20);
	CREATE TABLE pq (qid int, embedding halfvec(32));
	VACUUM ANALYZE parts;
});
is($node->safe_psql('postgres', q{
	SELECT gpuivf_calibrate('parts_0_embedding_idx', 'SELECT v FROM items WHERE id < 120')
	  #>> '{calibration,sample}'}), '120', 'gpuivf_calibrate of a halfvec index on real[] queries, cast to halfvec');
$node->safe_psql('postgres', 'INSERT INTO pq VALUES '
	  . join(',', map { "($_, " . vec_literal($queries->[$_], 'halfvec') . ')' } 0 .. 19) . '; ANALYZE pq');
my $h0 = vec_literal($queries->[0], 'halfvec');
my $pplan = $node->safe_psql('postgres',
	"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT id FROM parts ORDER BY embedding <=> $h0 LIMIT 5");
my @pasked = $pplan =~ /Rows Asked: (\d+)/g;
is(join(',', @pasked), '5,5,5', 'partitioned halfvec table: every partition\'s gpuivf scan is asked for the LIMIT')
  or diag $pplan;
my $pexact = 'SET gpuivf.probes = 20; SET enable_seqscan = off;';
my $ptop = "SELECT string_agg(id || ':' || d, ',' ORDER BY d, id) FROM (
	SELECT id, embedding <=> $h0 AS d FROM parts ORDER BY embedding <=> $h0 LIMIT 10) s";
is($node->safe_psql('postgres', $pexact . $ptop),
	$node->safe_psql('postgres', "SET enable_indexscan = off; $ptop"),
	'in exact mode the partitions\' indexes answer like a sequential scan (ids and distances)');
my $pjoin = q{
	SELECT string_agg(q.qid || ':' || n.id, ',' ORDER BY q.qid, n.d, n.id)
	FROM pq q CROSS JOIN LATERAL (
		SELECT p.id, p.embedding <=> q.embedding AS d FROM parts p
		ORDER BY p.embedding <=> q.embedding LIMIT 5) n};
$pplan = $node->safe_psql('postgres', "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) $pjoin");
like($pplan, qr/Custom Scan \(GpuivfBatchKnn\).*\n\s+Indexes: parts_0_embedding_idx, parts_1_embedding_idx, parts_2_embedding_idx\n/,
	'a LATERAL kNN join over the halfvec partitions is batched on every partition\'s index') or diag $pplan;
like($pplan, qr/Searches: 60\n/, 'every outer row searched on every partition in the batches') or diag $pplan;
is($node->safe_psql('postgres', $pjoin),
	$node->safe_psql('postgres', "SET gpuivf.enable_batch_join = off; $pjoin"),
	'and the batched join returns the nested loop\'s rows');

$node->stop;
done_testing();
