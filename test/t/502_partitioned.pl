
# gpuivf on a partitioned table (one partition per tenant, one of them split
# again by hash), compared with one plain table holding the same rows:
#  - CREATE INDEX on the partitioned table makes a gpuivf index on every
#    partition, also on partitions created or attached later;
#  - ORDER BY v <-> q LIMIT k over all partitions runs as a Merge Append of
#    gpuivf scans, each of which is asked for the LIMIT (EXPLAIN shows it),
#    also for LIMIT $1 in a generic plan; in exact mode the answers (ids and
#    distances) equal the plain table's;
#  - WHERE tenant_id = c prunes to one partition, at plan time and, in a
#    generic plan, at run time, with the plain table's answers;
#  - ANALYZE of the partitioned table calibrates every partition's index;
#    with automatic probes recall@10 reaches a floor;
#  - rows inserted through the partitioned table are found;
#  - a LATERAL kNN join over the partitioned table is batched, one search
#    call per partition for all outer rows, and returns the nested loop's
#    rows (and the plain table's in exact mode); a per-tenant LATERAL join,
#    whose partitions are pruned per outer row, is left a nested loop.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $k = 10;
my $nq = 40;
my $node = gpuivf_node('partitioned', conf => "max_parallel_workers_per_gather = 0\njit = off\n");
my $data = generate_data(rows => 16000, dims => 24, queries => $nq, seed => 502);
my $queries = read_fvecs($data->{query_fvecs});
load_vectors($node, 'flat', $data->{base_copy});

# tenant = id % 4; tenant 3 is split again by hash of id into two partitions
$node->safe_psql('postgres', q{
	ALTER TABLE flat ADD COLUMN tenant_id int;
	UPDATE flat SET tenant_id = id % 4;
	CREATE TABLE docs (tenant_id int NOT NULL, id bigint, v real[]) PARTITION BY LIST (tenant_id);
	CREATE TABLE docs_0 PARTITION OF docs FOR VALUES IN (0);
	CREATE TABLE docs_1 PARTITION OF docs FOR VALUES IN (1);
	CREATE TABLE docs_2 PARTITION OF docs FOR VALUES IN (2);
	CREATE TABLE docs_3 PARTITION OF docs FOR VALUES IN (3) PARTITION BY HASH (id);
	CREATE TABLE docs_3a PARTITION OF docs_3 FOR VALUES WITH (MODULUS 2, REMAINDER 0);
	CREATE TABLE docs_3b PARTITION OF docs_3 FOR VALUES WITH (MODULUS 2, REMAINDER 1);
	INSERT INTO docs SELECT tenant_id, id, v FROM flat;
	CREATE TABLE queries (qid int, tenant_id int, v real[]);
});
my $values = join(",\n", map { "($_, " . ($_ % 4) . ', ' . vec_literal($queries->[$_]) . ')' } 0 .. $#$queries);
$node->safe_psql('postgres', "INSERT INTO queries VALUES $values");
$node->safe_psql('postgres', q{
	CREATE INDEX flat_v ON flat USING gpuivf (v) WITH (lists = 16);
	CREATE INDEX docs_v ON docs USING gpuivf (v) WITH (lists = 16);
	VACUUM ANALYZE flat; VACUUM ANALYZE docs; ANALYZE queries;
});

# ------------------------------------------------------------- the indexes
my $leaf_indexes = q{
	SELECT string_agg(c.relname || ':' || i.relname, ',' ORDER BY c.relname)
	FROM pg_partition_tree('docs') t
	JOIN pg_class c ON c.oid = t.relid AND c.relkind = 'r'
	JOIN pg_index x ON x.indrelid = c.oid
	JOIN pg_class i ON i.oid = x.indexrelid
	JOIN pg_am a ON a.oid = i.relam AND a.amname = 'gpuivf'};
is($node->safe_psql('postgres', $leaf_indexes),
	'docs_0:docs_0_v_idx,docs_1:docs_1_v_idx,docs_2:docs_2_v_idx,docs_3a:docs_3a_v_idx,docs_3b:docs_3b_v_idx',
	'CREATE INDEX on the partitioned table made a gpuivf index on every partition');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM pg_partition_tree('docs_v') t WHERE t.isleaf}), '5',
	'they are the partitions of the partitioned index');
my $trained = q{
	SELECT string_agg((gpuivf_index_info(t.relid)->>'trained'), ',')
	FROM pg_partition_tree('docs_v') t WHERE t.isleaf};
is($node->safe_psql('postgres', $trained), 'true,true,true,true,true', 'every partition\'s index is trained');

# ---------------------------------------------------------- query helpers
sub qvec { return vec_literal($queries->[ $_[0] ]); }

# "id:distance,..." of the k nearest rows of query $qi in $table
sub knn
{
	my ($table, $qi, $settings, $where) = @_;
	return knn_answer($node, $table, qvec($qi), $k, settings => $settings, where => $where);
}
my $exact = 'SET gpuivf.probes = 16; SET enable_seqscan = off;';

# -------------------------------------------------------------- the plans
my $q0 = qvec(0);
my $plan = $node->safe_psql('postgres',
	"EXPLAIN (COSTS OFF) SELECT id FROM docs ORDER BY v <-> $q0 LIMIT $k");
like($plan, qr/Limit\n\s+->  Merge Append\n/, 'ORDER BY v <-> q LIMIT k over the partitions is a Merge Append');
my @scans = $plan =~ /Custom Scan \(GpuivfKnn\)\n\s+Rows Asked: LIMIT\n\s+->  Index Scan using docs_\w+_v_idx/g;
is(scalar(@scans), 5, 'of five gpuivf scans, each asked for the LIMIT') or diag $plan;

$plan = $node->safe_psql('postgres',
	"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT id FROM docs ORDER BY v <-> $q0 LIMIT 7");
my @asked = $plan =~ /Rows Asked: (\d+)/g;
is(join(',', @asked), '7,7,7,7,7', 'EXPLAIN ANALYZE: every partition\'s scan asked the engine for 7 rows')
  or diag $plan;

$plan = $node->safe_psql('postgres', qq{
	SET plan_cache_mode = force_generic_plan;
	PREPARE knn(real[], int) AS SELECT id FROM docs ORDER BY v <-> \$1 LIMIT \$2;
	EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE knn($q0, 3)});
@asked = $plan =~ /Rows Asked: (\d+)/g;
is(join(',', @asked), '3,3,3,3,3', 'a generic plan with LIMIT $2 asks every partition for 3 rows')
  or diag $plan;

# ------------------------------------------- exact mode = the plain table
my ($same, $diff) = count_same($nq, sub { knn('docs', $_[0], $exact) }, sub { knn('flat', $_[0], $exact) });
is($same, $nq, 'exact mode: all partitions give the plain table\'s answers (ids and distances)')
  or diag $diff;

# ----------------------------------------------------- one tenant: pruning
$plan = $node->safe_psql('postgres',
	"EXPLAIN (COSTS OFF) SELECT id FROM docs WHERE tenant_id = 2 ORDER BY v <-> $q0 LIMIT $k");
like($plan, qr/Index Scan using docs_2_v_idx on docs_2/, 'WHERE tenant_id = 2 scans tenant 2\'s partition');
unlike($plan, qr/docs_[013]/, 'and no other') or diag $plan;
like($plan, qr/Rows Asked: LIMIT\n/, 'asking for the LIMIT (the partition\'s own constraint is no filter that raises it)');

$plan = $node->safe_psql('postgres', qq{
	SET plan_cache_mode = force_generic_plan;
	PREPARE tenant(int, real[]) AS SELECT id FROM docs WHERE tenant_id = \$1 ORDER BY v <-> \$2 LIMIT $k;
	EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE tenant(3, $q0)});
like($plan, qr/Subplans Removed: 3/, 'a generic plan prunes the other partitions at run time');
@asked = $plan =~ /Rows Asked: (\d+)/g;
is(join(',', @asked), "$k,$k", 'and asks the two partitions of tenant 3 for the LIMIT') or diag $plan;

($same, $diff) = count_same($nq,
	sub { knn('docs', $_[0], $exact, 'tenant_id = ' . $_[0] % 4) },
	sub { knn('flat', $_[0], 'SET enable_indexscan = off;', 'tenant_id = ' . $_[0] % 4) });
is($same, $nq, 'per tenant, exact mode gives the exact answer of that tenant\'s rows') or diag $diff;

# ------------------------------------- ANALYZE, automatic probes, recall
is($node->safe_psql('postgres', q{
	SELECT string_agg(gpuivf_index_info(t.relid)->'probes'->>'source', ',')
	FROM pg_partition_tree('docs_v') t WHERE t.isleaf}), 'curve,curve,curve,curve,curve',
	'ANALYZE of the partitioned table calibrated every partition\'s index');

my $truth = ground_truth($data->{base_fvecs}, $data->{query_fvecs}, $k);
my $got = knn_ids($node, 'docs', 'l2', $queries, $k, settings => 'SET enable_seqscan = on;');
my $recall = recall_at($got, $truth, $k);
note sprintf('recall@%d over the partitions, automatic probes: %.3f', $k, $recall);
cmp_ok($recall, '>=', 0.9, 'automatic probes give recall@10 >= 0.9 over the partitions');

# -------------------------------------------------------------- inserts
$node->safe_psql('postgres', "INSERT INTO docs VALUES (3, -1, $q0), (1, -2, $q0)");
is($node->safe_psql('postgres', "SELECT string_agg(id::text, ',' ORDER BY id) FROM "
	  . "(SELECT id FROM docs ORDER BY v <-> $q0 LIMIT 2) s"),
	'-2,-1', 'rows inserted through the partitioned table are found');
is($node->safe_psql('postgres', "SELECT id FROM docs WHERE tenant_id = 3 ORDER BY v <-> $q0 LIMIT 1"),
	'-1', 'also in their tenant alone');
$node->safe_psql('postgres', 'DELETE FROM docs WHERE id < 0');

# ------------------------------------- partitions created or attached later
$node->safe_psql('postgres', q{
	CREATE TABLE docs_4 PARTITION OF docs FOR VALUES IN (4);
	CREATE TABLE docs_5 (LIKE docs);
	INSERT INTO docs_5 SELECT 5, id + 100000, v FROM flat WHERE id < 500;
	ALTER TABLE docs ATTACH PARTITION docs_5 FOR VALUES IN (5);
	INSERT INTO docs_4 SELECT 4, id + 200000, v FROM flat WHERE id < 300;
});
is($node->safe_psql('postgres', q{
	SELECT string_agg(i.relname, ',' ORDER BY i.relname)
	FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
	WHERE x.indrelid IN ('docs_4'::regclass, 'docs_5'::regclass)}),
	'docs_4_v_idx,docs_5_v_idx', 'partitions created or attached later get the gpuivf index');
is($node->safe_psql('postgres',
		"$exact SELECT id FROM docs WHERE tenant_id = 5 ORDER BY v <-> (SELECT v FROM flat WHERE id = 77) LIMIT 1"),
	'100077', 'and answer for their rows');
$node->safe_psql('postgres', 'DROP TABLE docs_4, docs_5');

# ------------------------------------------------------ LATERAL kNN join
my $join = qq{
	SELECT string_agg(q.qid || ':' || n.id || ':' || n.d, ',' ORDER BY q.qid, n.d, n.id)
	FROM queries q CROSS JOIN LATERAL (
		SELECT i.id, i.v <-> q.v AS d FROM %s i ORDER BY i.v <-> q.v LIMIT $k) n};
my $nl = $node->safe_psql('postgres', 'SET gpuivf.enable_batch_join = off; ' . sprintf($join, 'docs'));
$plan = $node->safe_psql('postgres', 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' . sprintf($join, 'docs'));
like($plan, qr/Custom Scan \(GpuivfBatchKnn\).*\n\s+Indexes: docs_0_v_idx, docs_1_v_idx, docs_2_v_idx, docs_3a_v_idx, docs_3b_v_idx\n/,
	'a LATERAL kNN join over the partitions is batched on every partition\'s index') or diag $plan;
like($plan, qr/Batches: 5\n\s+Searches: 200\n/, 'one search call per partition for the 40 outer rows');
@asked = $plan =~ /Batched Searches: (\d+)/g;
is(join(',', @asked), '40,40,40,40,40', 'every partition\'s scan took the round 1 computed ahead for every row')
  or diag $plan;
is($node->safe_psql('postgres', sprintf($join, 'docs')), $nl,
	'and the join returns the nested loop\'s rows');
is($node->safe_psql('postgres', $exact . sprintf($join, 'docs')),
	$node->safe_psql('postgres', $exact . sprintf($join, 'flat')),
	'and in exact mode the plain table\'s rows');
my $tenant_join = qq{
	SELECT string_agg(q.qid || ':' || n.id || ':' || n.d, ',' ORDER BY q.qid, n.d, n.id)
	FROM queries q CROSS JOIN LATERAL (
		SELECT i.id, i.v <-> q.v AS d FROM %s i WHERE i.tenant_id = q.tenant_id
		ORDER BY i.v <-> q.v LIMIT $k) n};
unlike($node->safe_psql('postgres', 'EXPLAIN (COSTS OFF) ' . sprintf($tenant_join, 'docs')), qr/GpuivfBatchKnn/,
	'a per-tenant LATERAL join (partitions pruned per outer row) is not batched: it searches one partition a row');
is($node->safe_psql('postgres', $exact . sprintf($tenant_join, 'docs')),
	$node->safe_psql('postgres', 'SET enable_indexscan = off; ' . sprintf($tenant_join, 'flat')),
	'a per-tenant LATERAL join (run-time pruning per row) gives each tenant\'s exact answer');

for my $idx ('flat_v', map { "docs_${_}_v_idx" } qw(0 1 2 3a 3b))
{
	$node->safe_psql('postgres', "SELECT gpuivf_verify('$idx', true)");
}
pass('every index verifies (heapallindexed)');

$node->stop;
done_testing();
