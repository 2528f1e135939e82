
# Shards through postgres_fdw: three clusters, a coordinator whose
# partitioned table has one foreign partition on each of two shard servers
# (CREATE SERVER ... OPTIONS (extensions 'gpuivf', async_capable 'true')),
# each shard with its own gpuivf index; the coordinator also holds all rows
# in one plain table, the single-server reference.
#  - ORDER BY v <-> q LIMIT k is sent to every shard with its ORDER BY and
#    the LIMIT (EXPLAIN VERBOSE's remote SQL), also LIMIT + OFFSET and a
#    LIMIT parameter of a generic plan;
#  - the shards are asked at once: an Append of async foreign scans under a
#    Sort, and with shards that take 2 s each the query takes about 2 s (4 s
#    with enable_async_append = off);
#  - in exact mode (gpuivf.probes in the servers' libpq options) the
#    answers (ids and distances) equal the single server's;
#  - WHERE tenant_id = c reaches one shard, its filter and the LIMIT remote;
#  - rows inserted through the coordinator are found;
#  - a LATERAL kNN join gives the single server's rows in exact mode;
#  - without extensions 'gpuivf' nothing is pushed (the coordinator sorts
#    every row itself) and the answers are still right.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use GpuivfTest;

my $k = 10;
my $nq = 30;
my $lists = 12;
my $data = generate_data(rows => 12000, dims => 16, queries => $nq, seed => 503);
my $queries = read_fvecs($data->{query_fvecs});

# rows of tenants 0 and 1 live on shard 1, of tenants 2 and 3 on shard 2
my @shards;
for my $s (1, 2)
{
	my $node = gpuivf_node("shard$s");
	load_vectors($node, 'loaded', $data->{base_copy});
	my $tenants = $s == 1 ? '(0, 1)' : '(2, 3)';
	$node->safe_psql('postgres', qq{
		CREATE TABLE items (tenant_id int NOT NULL, id bigint, v real[]);
		INSERT INTO items SELECT id % 4, id, v FROM loaded WHERE id % 4 IN $tenants;
		DROP TABLE loaded;
		CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = $lists);
		VACUUM ANALYZE items;
		-- a view that takes 2 s to answer, for the concurrency check
		CREATE VIEW items_slow AS SELECT * FROM items WHERE (SELECT pg_sleep(2)) IS NOT NULL;
	});
	push @shards, $node;
}

# the coordinator loads gpuivf into every session (its planner hook pushes
# the LIMIT to the shards)
my $coord = gpuivf_node('coordinator', conf => "session_preload_libraries = 'gpuivf'\n");
load_vectors($coord, 'loaded', $data->{base_copy});
$coord->safe_psql('postgres', qq{
	CREATE TABLE flat (tenant_id int NOT NULL, id bigint, v real[]);
	INSERT INTO flat SELECT id % 4, id, v FROM loaded;
	DROP TABLE loaded;
	CREATE INDEX flat_v ON flat USING gpuivf (v) WITH (lists = $lists);
	VACUUM ANALYZE flat;
	CREATE EXTENSION postgres_fdw;
	CREATE TABLE queries (qid int, tenant_id int, v real[]);
});
my $values = join(",\n", map { "($_, " . ($_ % 4) . ', ' . vec_literal($queries->[$_]) . ')' } 0 .. $#$queries);
$coord->safe_psql('postgres', "INSERT INTO queries VALUES $values; ANALYZE queries;");

# one partitioned table per kind of server: docs (extensions 'gpuivf',
# async), plain (no extensions), slow (the 2 s views)
for my $s (1, 2)
{
	my ($host, $port) = ($shards[ $s - 1 ]->host, $shards[ $s - 1 ]->port);
	$coord->safe_psql('postgres', qq{
		CREATE SERVER shard$s FOREIGN DATA WRAPPER postgres_fdw
			OPTIONS (host '$host', port '$port', dbname 'postgres', extensions 'gpuivf', async_capable 'true');
		CREATE USER MAPPING FOR CURRENT_USER SERVER shard$s;
		CREATE SERVER plain$s FOREIGN DATA WRAPPER postgres_fdw
			OPTIONS (host '$host', port '$port', dbname 'postgres');
		CREATE USER MAPPING FOR CURRENT_USER SERVER plain$s;
	});
}
$coord->safe_psql('postgres', q{
	CREATE TABLE docs (tenant_id int NOT NULL, id bigint, v real[]) PARTITION BY LIST (tenant_id);
	CREATE FOREIGN TABLE docs_s1 PARTITION OF docs FOR VALUES IN (0, 1) SERVER shard1 OPTIONS (table_name 'items');
	CREATE FOREIGN TABLE docs_s2 PARTITION OF docs FOR VALUES IN (2, 3) SERVER shard2 OPTIONS (table_name 'items');
	CREATE TABLE plain (tenant_id int NOT NULL, id bigint, v real[]) PARTITION BY LIST (tenant_id);
	CREATE FOREIGN TABLE plain_s1 PARTITION OF plain FOR VALUES IN (0, 1) SERVER plain1 OPTIONS (table_name 'items');
	CREATE FOREIGN TABLE plain_s2 PARTITION OF plain FOR VALUES IN (2, 3) SERVER plain2 OPTIONS (table_name 'items');
	CREATE TABLE slow (tenant_id int NOT NULL, id bigint, v real[]) PARTITION BY LIST (tenant_id);
	CREATE FOREIGN TABLE slow_s1 PARTITION OF slow FOR VALUES IN (0, 1) SERVER shard1 OPTIONS (table_name 'items_slow');
	CREATE FOREIGN TABLE slow_s2 PARTITION OF slow FOR VALUES IN (2, 3) SERVER shard2 OPTIONS (table_name 'items_slow');
	ANALYZE docs; ANALYZE plain;
});

sub qvec { return vec_literal($queries->[ $_[0] ]); }
my $q0 = qvec(0);

# ---------------------------------------------------- what reaches the shards
my $plan = $coord->safe_psql('postgres',
	"EXPLAIN (VERBOSE, COSTS OFF) SELECT id, v <-> $q0 AS d FROM docs ORDER BY v <-> $q0 LIMIT $k");
my @remote = $plan =~ /Remote SQL: (.*)/g;
is(scalar(@remote), 2, 'the query reaches both shards') or diag $plan;
is(scalar(grep { /ORDER BY \(v OPERATOR\(public\.<->\) .*\) ASC NULLS LAST LIMIT $k$/ } @remote), 2,
	"each shard is sent the ORDER BY and LIMIT $k") or diag $plan;
like($plan, qr/Limit\n.*\n\s+->  Sort\n.*\n\s+Sort Key: .*\n\s+->  Append\n/,
	'the coordinator sorts the shards\' rows under the LIMIT') or diag $plan;
is(scalar(() = $plan =~ /Async Foreign Scan on public\.docs_s\d/g), 2, 'the shards are asked asynchronously');

$plan = $coord->safe_psql('postgres',
	"EXPLAIN (VERBOSE, COSTS OFF) SELECT id FROM docs ORDER BY v <-> $q0 LIMIT 5 OFFSET 3");
is(scalar(() = $plan =~ /ASC NULLS LAST LIMIT 8$/mg), 2, 'LIMIT 5 OFFSET 3 sends LIMIT 8 to each shard')
  or diag $plan;

$plan = $coord->safe_psql('postgres', qq{
	SET plan_cache_mode = force_generic_plan;
	PREPARE knn(real[], bigint) AS SELECT id FROM docs ORDER BY v <-> \$1 LIMIT \$2;
	EXPLAIN (VERBOSE, COSTS OFF) EXECUTE knn($q0, 4)});
is(scalar(() = $plan =~ /ORDER BY \(v OPERATOR\(public\.<->\) \$1::real\[\]\) ASC NULLS LAST LIMIT \$2::bigint$/mg),
	2, 'a generic plan sends the LIMIT parameter to each shard') or diag $plan;
$plan = $coord->safe_psql('postgres', qq{
	SET plan_cache_mode = force_generic_plan;
	PREPARE knn(real[], int, int) AS SELECT id FROM docs ORDER BY v <-> \$1 LIMIT \$2 OFFSET \$3;
	EXPLAIN (VERBOSE, COSTS OFF) EXECUTE knn($q0, 4, 2)});
is(scalar(() = $plan =~ /ASC NULLS LAST LIMIT \(\$2::bigint \+ \$3::bigint\)$/mg), 2,
	'int parameters for LIMIT and OFFSET: each shard is sent LIMIT ($2 + $3)') or diag $plan;
my @ids = split /\n/, $coord->safe_psql('postgres', qq{
	SET plan_cache_mode = force_generic_plan;
	PREPARE knn(real[], int, int) AS SELECT id FROM docs ORDER BY v <-> \$1 LIMIT \$2 OFFSET \$3;
	EXECUTE knn($q0, 4, 2);});
my @first6 = split /\n/, $coord->safe_psql('postgres', "SELECT id FROM docs ORDER BY v <-> $q0 LIMIT 6");
is("@ids", "@first6[2 .. 5]", 'and returns the 4 rows after the first 2');
my $rows = $coord->safe_psql('postgres', qq{
	SET plan_cache_mode = force_generic_plan;
	PREPARE knn(real[], bigint) AS SELECT id FROM docs ORDER BY v <-> \$1 LIMIT \$2;
	EXECUTE knn($q0, 4); EXECUTE knn($q0, 13);});
is(scalar(split /\n/, $rows), 17, 'the generic plan returns 4, then 13 rows');

# ------------------------------------------ exact mode = a single server
# a session's SET does not travel through postgres_fdw: the servers'
# libpq options carry the setting to every shard connection
$coord->safe_psql('postgres', "ALTER SERVER shard$_ OPTIONS (ADD options '-c gpuivf.probes=$lists')") for 1, 2;
my $exact = "SET gpuivf.probes = $lists;";

# "id:distance,..." of the k nearest rows of query $qi
sub knn
{
	my ($table, $qi, $where, $limit) = @_;
	return knn_answer($coord, $table, qvec($qi), $limit // $k, settings => $exact, where => $where);
}
my ($same, $diff) = count_same($nq, sub { knn('docs', $_[0]) }, sub { knn('flat', $_[0]) });
is($same, $nq, 'exact mode: the shards give the single server\'s answers (ids and distances)') or diag $diff;
is(knn('docs', 3, undef, 25), knn('flat', 3, undef, 25), 'also for LIMIT 25');

# ----------------------------------------------------------- one tenant
$plan = $coord->safe_psql('postgres',
	"EXPLAIN (VERBOSE, COSTS OFF) SELECT id FROM docs WHERE tenant_id = 2 ORDER BY v <-> $q0 LIMIT $k");
@remote = $plan =~ /Remote SQL: (.*)/g;
is(scalar(@remote), 1, 'WHERE tenant_id = 2 reaches one shard') or diag $plan;
like($remote[0] // '', qr/FROM public\.items WHERE \(\(tenant_id = 2\)\) ORDER BY .* LIMIT $k$/,
	'with the filter, the ORDER BY and the LIMIT');
($same, $diff) = count_same($nq,
	sub { knn('docs', $_[0], 'tenant_id = ' . $_[0] % 4) }, sub { knn('flat', $_[0], 'tenant_id = ' . $_[0] % 4) });
is($same, $nq, 'per tenant, the shard gives the single server\'s answers') or diag $diff;

# ------------------------------------------------- shards asked at once
my $slow = "SELECT count(*) FROM (SELECT id FROM slow ORDER BY v <-> $q0 LIMIT $k) s";
like($coord->safe_psql('postgres', "EXPLAIN (VERBOSE, COSTS OFF) $slow"), qr/Async Foreign Scan on public\.slow_s1/,
	'the 2 s shards are asked asynchronously');
my $t0 = time;
is($coord->safe_psql('postgres', $slow), $k, 'the query over two shards that take 2 s each answers');
my $async_s = time - $t0;
$t0 = time;
$coord->safe_psql('postgres', "SET enable_async_append = off; $slow");
my $serial_s = time - $t0;
note sprintf('two 2 s shards: %.2f s asked at once, %.2f s one after the other', $async_s, $serial_s);
cmp_ok($async_s, '<', 3.5, 'in about 2 s: both shards were asked at once');
cmp_ok($serial_s, '>=', 4.0, 'with enable_async_append = off they are asked one after the other (4 s)');

# --------------------------------------------- inserts through the coordinator
$coord->safe_psql('postgres', "INSERT INTO docs VALUES (1, -1, $q0), (3, -3, $q0)");
is($shards[1]->safe_psql('postgres', 'SELECT count(*) FROM items WHERE id = -3'), '1',
	'a row inserted through the coordinator lands on its shard');
is($coord->safe_psql('postgres', "SELECT string_agg(id::text, ',' ORDER BY id) FROM "
	  . "(SELECT id FROM docs ORDER BY v <-> $q0 LIMIT 2) s"),
	'-3,-1', 'rows inserted through the coordinator are found');
$coord->safe_psql('postgres', 'DELETE FROM docs WHERE id < 0');

# ------------------------------------------------------ LATERAL kNN join
my $join = qq{$exact
	SELECT string_agg(q.qid || ':' || n.id || ':' || n.d, ',' ORDER BY q.qid, n.d, n.id)
	FROM queries q CROSS JOIN LATERAL (
		SELECT i.id, i.v <-> q.v AS d FROM %s i ORDER BY i.v <-> q.v LIMIT $k) n};
$plan = $coord->safe_psql('postgres', 'EXPLAIN (VERBOSE, COSTS OFF) ' . sprintf($join =~ s/^\Q$exact\E//r, 'docs'));
is(scalar(() = $plan =~ /ORDER BY \(v OPERATOR\(public\.<->\) \$1::real\[\]\) ASC NULLS LAST LIMIT $k$/mg),
	2, 'a LATERAL kNN join sends each outer row\'s vector and the LIMIT to every shard') or diag $plan;
is($coord->safe_psql('postgres', sprintf($join, 'docs')), $coord->safe_psql('postgres', sprintf($join, 'flat')),
	'and gives the single server\'s rows in exact mode');

# ------------------------------------------ without extensions 'gpuivf'
$plan = $coord->safe_psql('postgres',
	"EXPLAIN (VERBOSE, COSTS OFF) SELECT id FROM plain ORDER BY v <-> $q0 LIMIT $k");
@remote = $plan =~ /Remote SQL: (.*)/g;
is(scalar(grep { !/ORDER BY|LIMIT/ } @remote), 2,
	'without extensions \'gpuivf\' the shards are sent neither ORDER BY nor LIMIT') or diag $plan;
is(knn('plain', 5), knn('flat', 5), 'and the coordinator\'s sort still gives the right answer');

$_->stop for ($coord, @shards);
done_testing();
