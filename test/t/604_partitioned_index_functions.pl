
# gpuivf_index_info and gpuivf_verify on a partitioned index act on the
# index of every partition: info returns one object per partition's index
# (with its index and table names) and the total of vectors; verify checks
# each of them and reports the first problem under the partition's index
# name.  gpuivf_worker_search, which searches one index, says that it was
# given a partitioned index and how to find the partitions' indexes, rather
# than "is not a gpuivf index" or "has no metapage".

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('partitioned_index_functions');
$node->safe_psql('postgres', q{
	CREATE TABLE parts (id int, tenant int, v real[]) PARTITION BY LIST (tenant);
	CREATE TABLE parts_a PARTITION OF parts FOR VALUES IN (1);
	CREATE TABLE parts_b PARTITION OF parts FOR VALUES IN (2, 3) PARTITION BY LIST (tenant);
	CREATE TABLE parts_b2 PARTITION OF parts_b FOR VALUES IN (2);
	CREATE TABLE parts_b3 PARTITION OF parts_b FOR VALUES IN (3);
	SELECT setseed(0.3);
	INSERT INTO parts SELECT g, 1 + g % 3,
	  ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, 8) WHERE g > 0)
	  FROM generate_series(1, 3000) g;
	CREATE INDEX parts_v ON parts USING gpuivf (v) WITH (lists = 4);
});

my $info = $node->safe_psql('postgres', q{
	SELECT p->>'index', p->>'table', p->>'vectors', p->>'lists'
	FROM jsonb_array_elements(gpuivf_index_info('parts_v')->'partitions') p ORDER BY 1});
is($info, "parts_a_v_idx|parts_a|1000|4\nparts_b2_v_idx|parts_b2|1000|4\nparts_b3_v_idx|parts_b3|1000|4",
	'gpuivf_index_info(partitioned index) has one entry per leaf partition, also below a sub-partitioned one');
is($node->safe_psql('postgres', q{
	SELECT gpuivf_index_info('parts_v')->>'partitioned', gpuivf_index_info('parts_v')->>'vectors'}),
	'true|3000', '... says it is partitioned and sums the vectors');
is($node->safe_psql('postgres', q{SELECT gpuivf_index_info('parts_b_v_idx')->>'vectors'}),
	'2000', 'an intermediate partitioned index covers its own partitions');

my ($rc, $out, $err) = $node->psql('postgres', q{SELECT gpuivf_verify('parts_v', true)});
is($rc, 0, 'gpuivf_verify(partitioned index, true) passes') or diag $err;

# a leaf index that verify must reach: mark the last one invalid
$node->safe_psql('postgres', q{
	UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'parts_b3_v_idx'::regclass});
($rc, $out, $err) = $node->psql('postgres', q{SELECT gpuivf_verify('parts_v')});
like($err, qr/cannot verify index "parts_b3_v_idx"/, 'gpuivf_verify reaches every partition\'s index');
$node->safe_psql('postgres', q{
	UPDATE pg_index SET indisvalid = true WHERE indexrelid = 'parts_b3_v_idx'::regclass});

($rc, $out, $err) = $node->psql('postgres',
	q{SELECT * FROM gpuivf_worker_search('parts_v', '{1,2,3,4,5,6,7,8}', 3)});
like($err, qr/ERROR:  "parts_v" is a partitioned index/,
	'gpuivf_worker_search says it was given a partitioned index');
like($err, qr/HINT:  Call gpuivf_worker_search on each partition's index; SELECT relid FROM pg_partition_tree\('parts_v'\) WHERE isleaf lists them\./,
	'... and how to find the partitions\' indexes');
unlike($err, qr/metapage|REINDEX/, '... without suggesting corruption');

($rc, $out, $err) = $node->psql('postgres', q{SELECT gpuivf_index_info('parts_a')});
like($err, qr/"parts_a" is not a gpuivf index/, 'a table is still not a gpuivf index');

$node->stop;
done_testing();
