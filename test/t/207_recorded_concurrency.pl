
# The recorded-query reservoirs under concurrency: clients querying four
# indexes at once while their reservoirs are created (a shared memory area
# too small for all four: the fourth index waits, busy ones are not evicted
# for it), restarted by ANALYZE and freed by DROP INDEX, in another session,
# again and again.  Nothing fails, the server
# stays up, every reservoir holds no more than it may, and the calibrations
# that took recorded queries stored them in indexes that verify.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

# 1 MB of reservoirs; each index's (1000 queries of 64 dimensions, 264 bytes
# a slot) takes five of its sixteen 64 kB units: three fit, four do not
my $node = gpuivf_node('recorded_concurrency', conf => qq(
shared_preload_libraries = 'gpuivf'
gpuivf.query_sample_memory = 1MB
gpuivf.analyze_sample = 50
max_connections = 40
autovacuum = off
));
my $data = generate_data(rows => 4000, dims => 64, queries => 0, seed => 3);
for my $i (1 .. 4)
{
	load_vectors($node, "t$i", $data->{base_copy});
	$node->safe_psql('postgres', "CREATE INDEX t${i}_idx ON t$i USING gpuivf (v) WITH (lists = 20)");
}

# each transaction: a kNN query on a random table with a random row as query
my $bench = start_pgbench($node, '-c 6 -j 2 -T 12', { knn => q{\set t random(1, 4)
\set id random(0, 3999)
SET enable_seqscan = off;
SELECT count(*) FROM (SELECT id FROM t:t ORDER BY v <-> (SELECT v FROM t:t WHERE id = :id) LIMIT 10) s;
} });

# meanwhile: ANALYZE (takes and restarts reservoirs), DROP and CREATE INDEX
# (frees one), queries of the remaining indexes' information
my $rounds = 0;
my $t0 = time;
while (time - $t0 < 10)
{
	$node->safe_psql('postgres', 'ANALYZE t1; ANALYZE t2');
	$node->safe_psql('postgres', 'DROP INDEX t3_idx; CREATE INDEX t3_idx ON t3 USING gpuivf (v) WITH (lists = 20)');
	$node->safe_psql('postgres', q{SELECT gpuivf_index_info('t4_idx') -> 'recorded_queries'});
	$rounds++;
}
my ($rc, $out, $err) = finish_pgbench($bench);
is($rc, 0, "six clients queried four indexes for 12 s while $rounds rounds of ANALYZE, DROP and CREATE INDEX ran")
  or diag($err);
like($out, qr/number of failed transactions: 0/, 'no query failed') if $out =~ /failed transactions/;

my $with = 0;
for my $i (1 .. 4)
{
	my ($held, $cap) = split /\|/, $node->safe_psql('postgres',
		"SELECT r ->> 'held', r ->> 'capacity' FROM (SELECT gpuivf_index_info('t${i}_idx') -> 'recorded_queries' AS r) s");
	cmp_ok($held, '<=', $cap, "t$i: the reservoir holds $held of its $cap slots at most");
	$with++ if $cap > 0;
}
# a busy reservoir is not evicted for another: three fit, the fourth waits
cmp_ok($with, '<=', 3, "$with indexes have a reservoir, no more than 1 MB holds");
$node->safe_psql('postgres', 'ANALYZE t1; ANALYZE t2; ANALYZE t3; ANALYZE t4');
for my $i (1 .. 4)
{
	$node->safe_psql('postgres', "SELECT gpuivf_verify('t${i}_idx', true)");
	pass("t$i: the index verifies (calibrated on " . $node->safe_psql('postgres',
		"SELECT gpuivf_index_info('t${i}_idx') #>> '{calibration,source}'") . ')');
}
ok(!$node->log_contains('TRAP|terminated by signal|PANIC'), 'no crash, no failed assertion');
is($node->safe_psql('postgres', 'SELECT 1'), '1', 'the server is up');

$node->stop;
done_testing();
