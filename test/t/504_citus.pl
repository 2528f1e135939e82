
# gpuivf under Citus: a coordinator and two workers, a table distributed by
# id over four shards (two per worker), a reference table, and on the
# coordinator one plain table with the same rows (the single node):
#  - CREATE INDEX ... USING gpuivf on the distributed table builds a trained
#    gpuivf index on every shard, with the index's target_recall option
#    (where the build has it; else the target by ALTER DATABASE ... SET);
#  - ORDER BY v <-> q LIMIT k is pushed to every shard as Limit -> GpuivfKnn
#    -> Index Scan and merged on the coordinator; in exact mode (gpuivf.probes
#    by ALTER DATABASE ... SET on the coordinator, which Citus sets on every
#    node, or SET LOCAL propagated by Citus) the answers (ids and distances)
#    equal the single node's;
#  - ANALYZE of the distributed table calibrates every shard's index, and
#    automatic probes then reach the index's recall target on every shard;
#  - rows inserted through the coordinator are found;
#  - a gpuivf index on a reference table answers like the single node;
#  - a LATERAL kNN join is pushed down when the outer table is distributed
#    and colocated and the subquery keeps to its tenant (each worker answers
#    for its tenants), and gives the single node's rows; Citus refuses the
#    LATERAL join whose outer side is a reference table (see README).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $pg_config = $ENV{PG_CONFIG} // 'pg_config';
my $sharedir = `$pg_config --sharedir`;
chomp $sharedir;
plan skip_all => ($ENV{CITUS_MISSING}
	  || "Citus is not installed in $sharedir (scripts/test.sh builds it from ../shared/vendor when that is there)")
  unless -f "$sharedir/extension/citus.control";

my $k = 10;
my $nq = 30;
my $lists = 8;
my $data = generate_data(rows => 12000, dims => 16, queries => $nq, seed => 504);
my $queries = read_fvecs($data->{query_fvecs});

my @nodes;
for my $name (qw(coordinator worker1 worker2))
{
	push @nodes, gpuivf_node("citus_$name", conf => qq(
shared_preload_libraries = 'citus'
citus.node_conninfo = 'sslmode=disable'
max_parallel_workers_per_gather = 0
jit = off
));
	$nodes[-1]->safe_psql('postgres', 'CREATE EXTENSION citus');
}
my ($coord, @workers) = @nodes;
$coord->safe_psql('postgres', sprintf("SELECT citus_set_coordinator_host('%s', %d)", $coord->host, $coord->port));
$coord->safe_psql('postgres', sprintf("SELECT citus_add_node('%s', %d)", $_->host, $_->port)) for @workers;
is($coord->safe_psql('postgres', 'SELECT count(*) FROM citus_get_active_worker_nodes()'), '2',
	'a coordinator with two workers');

# The recall target goes to every shard with the index (its target_recall
# option); a build without that option sets it by ALTER DATABASE ... SET on
# the coordinator instead, which Citus sets on every node.
my $has_option = $coord->psql('postgres', q{
	CREATE TEMP TABLE opt (v real[]);
	CREATE INDEX ON opt USING gpuivf (v) WITH (target_recall = 0.97)}) == 0;
my $target = $has_option ? ', target_recall = 0.97' : '';
$coord->safe_psql('postgres', 'ALTER DATABASE postgres SET gpuivf.target_recall = 0.97') unless $has_option;

load_vectors($coord, 'flat', $data->{base_copy});
$coord->safe_psql('postgres', qq{
	ALTER TABLE flat ADD COLUMN tenant_id int;
	UPDATE flat SET tenant_id = id % 8;
	CREATE INDEX flat_v ON flat USING gpuivf (v) WITH (lists = $lists$target);
	VACUUM ANALYZE flat;
	CREATE TABLE items (id bigint PRIMARY KEY, tenant_id int, v real[]);
	SELECT create_distributed_table('items', 'id', shard_count := 4);
	INSERT INTO items SELECT id, tenant_id, v FROM flat;
	CREATE TABLE queries (qid int, tenant_id int, v real[]);
});
my ($rc, $out, $err) = $coord->psql('postgres',
	"CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = $lists$target)");
is($rc, 0, 'CREATE INDEX USING gpuivf on the distributed table');
unlike($err, qr/not trained/, 'without a NOTICE about the coordinator\'s empty table (its rows are in the shards)');
my $values = join(",\n", map { "($_, " . ($_ % 8) . ', ' . vec_literal($queries->[$_]) . ')' } 0 .. $#$queries);
$coord->safe_psql('postgres', "INSERT INTO queries VALUES $values; ANALYZE queries;");

# a query on every shard's index, the results in shard order
# (run_command_on_shards puts each shard table's name for %1$s)
sub on_shards
{
	my ($sql) = @_;
	return $coord->safe_psql('postgres', qq{
		SELECT string_agg(result, ',' ORDER BY shardid) FROM run_command_on_shards('items', \$cmd\$
			SELECT $sql FROM pg_index x WHERE x.indrelid = '%1\$s'::regclass
			AND x.indexrelid::regclass::text LIKE 'items_v_%%' \$cmd\$)});
}
is(on_shards(q{gpuivf_index_info(x.indexrelid)->>'trained'}), 'true,true,true,true',
	'CREATE INDEX built a trained gpuivf index on every shard');
SKIP:
{
	skip 'this build has no target_recall index option (the target comes from ALTER DATABASE ... SET)', 1
	  unless $has_option;
	is(on_shards(q{gpuivf_index_info(x.indexrelid)->'probes'->>'target_source'}),
		'index option,index option,index option,index option', 'each with the index\'s target_recall option');
}
is($coord->safe_psql('postgres', q{SELECT sum((gpuivf_index_info('items_v')->>'vectors')::int)}), '0',
	'(the coordinator\'s shell table holds no rows: its own index stays empty)');

# ----------------------------------------------------------- the plan
sub qvec { return vec_literal($queries->[ $_[0] ]); }
my $q0 = qvec(0);
my $plan = $coord->safe_psql('postgres', "SET citus.explain_all_tasks = on; EXPLAIN (COSTS OFF) "
	  . "SELECT id FROM items ORDER BY v <-> $q0 LIMIT $k");
like($plan, qr/Limit\n\s+->  Sort\n.*\n\s+->  Custom Scan \(Citus Adaptive\)\n\s+Task Count: 4/,
	'kNN over the distributed table: four tasks merged on the coordinator') or diag $plan;
is(scalar(() = $plan =~ /->  Limit\n\s+->  Custom Scan \(GpuivfKnn\)\n\s+Rows Asked: LIMIT\n\s+->  Index Scan using items_v_\d+/g),
	4, 'every shard runs Limit -> GpuivfKnn -> Index Scan on its gpuivf index') or diag $plan;

# "id:distance,..." of the k nearest rows of query $qi
sub knn
{
	my ($table, $qi, $settings, $where) = @_;
	return knn_answer($coord, $table, qvec($qi), $k, settings => $settings, where => $where);
}

# ---------------------------------------------------------- exact mode
# A session's SET stays on the coordinator; SET LOCAL reaches the workers
# with citus.propagate_set_commands = local.
my $local_exact = "SET citus.propagate_set_commands = local; BEGIN; SET LOCAL gpuivf.probes = $lists;";
my $flat_exact = sub { knn('flat', $_[0], "SET gpuivf.probes = $lists;") };
my ($same, $diff) = count_same($nq, sub { knn('items', $_[0], $local_exact) }, $flat_exact);
is($same, $nq, 'exact mode (SET LOCAL propagated): the shards give the single node\'s answers (ids and distances)')
  or diag $diff;
# ALTER DATABASE ... SET on the coordinator: Citus sets it on every node
$coord->safe_psql('postgres', "ALTER DATABASE postgres SET gpuivf.probes = $lists");
is($coord->safe_psql('postgres',
		q{SELECT string_agg(result, ',') FROM run_command_on_workers($$SELECT current_setting('gpuivf.probes')$$)}),
	"$lists,$lists", 'ALTER DATABASE ... SET gpuivf.probes on the coordinator reaches the workers');
($same, $diff) = count_same($nq, sub { knn('items', $_[0]) }, $flat_exact);
is($same, $nq, 'exact mode (ALTER DATABASE): the single node\'s answers') or diag $diff;
$coord->safe_psql('postgres', 'ALTER DATABASE postgres RESET gpuivf.probes');

# ------------------------------------------ ANALYZE, automatic probes
$coord->safe_psql('postgres', q{
	INSERT INTO items SELECT id + 100000, tenant_id, ARRAY(SELECT x + 0.01 FROM unnest(v) x) FROM flat WHERE id % 5 = 0;
	INSERT INTO flat SELECT id + 100000, ARRAY(SELECT x + 0.01 FROM unnest(v) x), tenant_id FROM flat WHERE id % 5 = 0;
});
my $measured = q{(gpuivf_index_info(x.indexrelid)->'calibration'->>'vectors') || '/' || (SELECT count(*) FROM %1$s)};
my $before = on_shards($measured);
$coord->safe_psql('postgres', 'ANALYZE items');
my $after = on_shards($measured);
isnt($after, $before, 'ANALYZE of the distributed table measured every shard\'s curve again');
is(scalar(grep { m{^(\d+)/\1$} } split /,/, $after), 4, 'each on all of its shard\'s rows') or diag $after;
is(on_shards(q{gpuivf_index_info(x.indexrelid)->'probes'->>'source'}), 'curve,curve,curve,curve',
	'every shard chooses its probes from its curve');

# the rows inserted above are copies shifted by 0.01: the truth of the
# original rows no longer holds; recall is measured against the single node
# in exact mode instead
my (@got, @truth);
for my $qi (0 .. $nq - 1)
{
	push @got, [ map { (split /:/)[0] } split /,/, knn('items', $qi) ];
	push @truth, [ map { (split /:/)[0] } split /,/, $flat_exact->($qi) ];
}
my $recall = recall_at(\@got, \@truth, $k);
note sprintf('recall@%d through the coordinator, automatic probes, target 0.97: %.3f', $k, $recall);
cmp_ok($recall, '>=', 0.95, 'automatic probes on every shard reach the recall target');

# -------------------------------------------------------------- inserts
$coord->safe_psql('postgres', "INSERT INTO items VALUES (-1, 3, $q0), (-2, 5, $q0)");
is($coord->safe_psql('postgres', "SELECT string_agg(id::text, ',' ORDER BY id) FROM "
	  . "(SELECT id FROM items ORDER BY v <-> $q0 LIMIT 2) s"),
	'-2,-1', 'rows inserted through the coordinator are found');
$coord->safe_psql('postgres', 'DELETE FROM items WHERE id < 0');

# ------------------------------------------------------ reference table
$coord->safe_psql('postgres', qq{
	CREATE TABLE ref (id bigint PRIMARY KEY, v real[]);
	SELECT create_reference_table('ref');
	INSERT INTO ref SELECT id, v FROM flat WHERE id < 3000;
	CREATE TABLE ref_flat AS SELECT id, v FROM flat WHERE id < 3000;
	SET client_min_messages = warning;
	CREATE INDEX ref_v ON ref USING gpuivf (v) WITH (lists = 4);
	CREATE INDEX ref_flat_v ON ref_flat USING gpuivf (v) WITH (lists = 4);
});
is(knn('ref', 7, $local_exact =~ s/probes = $lists/probes = 4/r), knn('ref_flat', 7, 'SET gpuivf.probes = 4;'),
	'a gpuivf index on a reference table answers like the single node');

# ------------------------------------------------------ LATERAL kNN joins
$coord->safe_psql('postgres', q{
	CREATE TABLE docs (tenant_id int, id bigint, v real[]);
	SELECT create_distributed_table('docs', 'tenant_id', shard_count := 4);
	INSERT INTO docs SELECT tenant_id, id, v FROM flat;
	SET client_min_messages = warning;
	CREATE INDEX docs_v ON docs USING gpuivf (v) WITH (lists = 4);
	CREATE TABLE tq (tenant_id int, qid int, v real[]);
	SELECT create_distributed_table('tq', 'tenant_id', colocate_with := 'docs');
	INSERT INTO tq SELECT tenant_id, qid, v FROM queries;
	ANALYZE docs; ANALYZE tq;
});
my $tenant_join = qq{
	SELECT string_agg(q.qid || ':' || n.id || ':' || n.d, ',' ORDER BY q.qid, n.d, n.id)
	FROM %s q CROSS JOIN LATERAL (
		SELECT i.id, i.v <-> q.v AS d FROM %s i WHERE i.tenant_id = q.tenant_id
		ORDER BY i.v <-> q.v LIMIT $k) n};
$plan = $coord->safe_psql('postgres', 'EXPLAIN (COSTS OFF) ' . sprintf($tenant_join, 'tq', 'docs'));
like($plan, qr/Custom Scan \(Citus Adaptive\)\n\s+Task Count: 4\n.*\n\s+->  Task\n.*\n\s+->  Nested Loop\n\s+->  Custom Scan \(GpuivfBatchKnn\)/,
	'a per-tenant LATERAL kNN join of colocated tables is pushed down whole to the workers, and batched there')
  or diag $plan;
is($coord->safe_psql('postgres', "$local_exact " . sprintf($tenant_join, 'tq', 'docs')),
	$coord->safe_psql('postgres', 'SET enable_indexscan = off; ' . sprintf($tenant_join, 'queries', 'flat')),
	'and gives each tenant\'s exact answer');
($rc, $out, $err) = $coord->psql('postgres', q{
	SELECT q.id, n.id FROM ref q CROSS JOIN LATERAL (
		SELECT i.id FROM items i ORDER BY i.v <-> q.v LIMIT 3) n LIMIT 1});
like($err, qr/cannot push down this subquery/,
	'Citus refuses a LATERAL kNN join (LIMIT in the subquery) whose outer side is a reference table');

$_->stop for @nodes;
done_testing();
