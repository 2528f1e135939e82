
# pgvector columns through the life of a database: a streaming standby
# replays builds, inserts, deletes and VACUUM of vector, halfvec and
# re-rank-from-table indexes with wal_consistency_checking = 'all' and
# answers as the primary does; pg_dump / pg_restore brings the indexes back
# (operator classes, rerank_from) answering the same; REINDEX CONCURRENTLY
# rebuilds them, and ANALYZE calibrates them.  Skipped, with the reason,
# without pgvector.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $why = pgvector_missing();
plan skip_all => $why if $why;

my $primary = pgvector_node('vector_primary', allows_streaming => 1,
	conf => "wal_consistency_checking = 'all'\n");
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('vector_standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

$primary->safe_psql('postgres', 'SELECT setseed(0.504);' . grouped_items_sql(5000, 31, 0.2) . q{
	CREATE TABLE docs (id int, v vector(16), h halfvec(16));
	INSERT INTO docs SELECT id, v::vector, v::halfvec FROM items WHERE id <= 4000;
	CREATE INDEX docs_v_idx ON docs USING gpuivf (v vector_cosine_ops) WITH (lists = 30);
	CREATE INDEX docs_h_idx ON docs USING gpuivf (h) WITH (lists = 30);
	CREATE INDEX docs_t_idx ON docs USING gpuivf (v vector_l2_ops) WITH (lists = 30, rerank_from = 'table');
	CREATE TABLE later (id int, h halfvec(16));
	CREATE INDEX later_h_idx ON later USING gpuivf (h halfvec_ip_ops);
});
$primary->safe_psql('postgres', q{
	INSERT INTO docs SELECT id, v::vector, v::halfvec FROM items WHERE id > 4000;
	INSERT INTO later SELECT id, v::halfvec FROM items WHERE id % 3 = 0;
	DELETE FROM docs WHERE id % 7 = 0;
	DELETE FROM later WHERE id % 2 = 0;
	VACUUM docs;
	VACUUM later;
	INSERT INTO docs SELECT id + 100000, v::vector, v::halfvec FROM items WHERE id % 5 = 0;
});
$primary->wait_for_catchup($standby, 'replay');
ok(!$standby->log_contains('inconsistent page found'), 'replay: every page image matched the primary\'s');

# the same answers on both nodes, approximate and exact
sub answers
{
	my ($node, $db, $probes) = @_;
	my $sql = exact_settings() . " SET gpuivf.probes = $probes;\n";
	for my $q (1, 500, 2222)
	{
		$sql .= "SELECT ARRAY(SELECT id FROM docs ORDER BY v <=> (SELECT v FROM docs WHERE id = $q) LIMIT 10);\n"
		  . "SELECT ARRAY(SELECT id FROM docs ORDER BY h <-> (SELECT h FROM docs WHERE id = $q) LIMIT 10);\n"
		  . "SELECT ARRAY(SELECT id FROM docs ORDER BY v <-> (SELECT v FROM docs WHERE id = $q) LIMIT 10);\n"
		  . "SELECT ARRAY(SELECT id FROM later ORDER BY h <#> (SELECT h FROM docs WHERE id = $q) LIMIT 10);\n";
	}
	return $node->safe_psql($db // 'postgres', $sql);
}
is(answers($standby, undef, 3), answers($primary, undef, 3), 'the standby answers as the primary (3 probes)');
is(answers($standby, undef, 30), answers($primary, undef, 30), 'the standby answers as the primary (exact)');
for my $index (qw(docs_v_idx docs_h_idx docs_t_idx later_h_idx))
{
	$standby->safe_psql('postgres', "SELECT gpuivf_verify('$index')");
	pass("standby: gpuivf_verify($index)");
}

# dump and restore
my $dump = PostgreSQL::Test::Utils::tempdir() . '/docs.dump';
$primary->command_ok([ 'pg_dump', '-Fc', '-h', $primary->host, '-p', $primary->port, '-f', $dump, 'postgres' ],
	'pg_dump -Fc of a database with gpuivf_vector');
$primary->safe_psql('postgres', 'CREATE DATABASE restored');
$primary->command_ok([ 'pg_restore', '-h', $primary->host, '-p', $primary->port, '-d', 'restored', $dump ],
	'pg_restore');
my $defs = q{SELECT indexdef FROM pg_indexes WHERE tablename IN ('docs', 'later') ORDER BY indexname};
is($primary->safe_psql('restored', $defs), $primary->safe_psql('postgres', $defs),
	'index definitions (operator classes, rerank_from) come back');
like($primary->safe_psql('restored', $defs), qr/rerank_from='?table'?/, 'rerank_from = table is restored');
is(answers($primary, 'restored', 30), answers($primary, 'postgres', 30),
	'the restored indexes answer as the originals in exact mode');
$primary->safe_psql('restored', "SELECT gpuivf_verify('docs_t_idx', true)");
pass('the restored index that re-ranks from the table verifies');

# REINDEX CONCURRENTLY, then ANALYZE's calibration
my $before = answers($primary, undef, 30);
$primary->safe_psql('postgres', 'REINDEX INDEX CONCURRENTLY docs_h_idx; REINDEX INDEX CONCURRENTLY docs_t_idx');
is(answers($primary, undef, 30), $before, 'after REINDEX CONCURRENTLY the same exact answers');
is_deeply([ @{ index_info($primary, 'docs_t_idx') }{qw(rerank_from storage)} ], [ 'table', 'float4' ],
	'the rebuilt index keeps re-ranking from the table');
$primary->safe_psql('postgres', 'ANALYZE docs');
for my $index (qw(docs_v_idx docs_h_idx docs_t_idx))
{
	my $src = $primary->safe_psql('postgres', "SELECT gpuivf_index_info('$index') -> 'probes' ->> 'source'");
	is($src, 'curve', "$index: ANALYZE measured a recall curve that scans use");
}

$standby->stop;
$primary->stop;
done_testing();
