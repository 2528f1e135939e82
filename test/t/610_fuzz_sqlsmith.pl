
# SQL fuzzing with sqlsmith (Debian package sqlsmith) against a database
# holding gpuivf indexes of every operator class and option extreme, on
# tables with NULL vectors, duplicates, zero vectors and deleted rows (dead
# index entries, and VACUUMed ones), a partitioned table and an untrained
# index, with views of kNN queries and LATERAL kNN joins and functions that
# take sqlsmith's random vectors, k and probes.  sqlsmith runs as a role without superuser rights (it may read and
# write the fuzz tables) in rounds with different settings (CPU, GPU worker
# with the CPU stand-in engine, sequential scans off so that its ORDER BYs
# reach the indexes, one probe, tiny candidate counts), while autovacuum
# vacuums and analyzes the tables it changes.  The test fails when the
# server crashed or an assertion failed (restart_after_crash is off, the log
# is searched for "terminated by signal", "TRAP:" and PANIC), or when an
# index no longer verifies afterwards.
#
# GPUIVF_FUZZ_SECONDS sets the length of the run (default 120, the CI run);
# GPUIVF_FUZZ_SEED its seed (default 1).  The statement count is printed.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $sqlsmith = `command -v sqlsmith 2>/dev/null`;
chomp $sqlsmith;
plan skip_all => 'sqlsmith is not installed (Debian package sqlsmith; scripts/test.sh installs it as root)'
  unless $sqlsmith;

my $seconds = $ENV{GPUIVF_FUZZ_SECONDS} // 120;
my $seed = $ENV{GPUIVF_FUZZ_SEED} // 1;
my $conf = q(
restart_after_crash = off
autovacuum = on
autovacuum_naptime = 1
autovacuum_vacuum_threshold = 20
autovacuum_vacuum_scale_factor = 0
autovacuum_vacuum_insert_threshold = 200
autovacuum_analyze_threshold = 50
autovacuum_analyze_scale_factor = 0
max_connections = 30
gpuivf.analyze_sample = 50
);
my $fake = fake_gpu_engine();
my $node = $fake ? fake_gpu_node('fuzz_sqlsmith', $fake, $conf) : gpuivf_node('fuzz_sqlsmith', conf => $conf);
if ($fake)
{
	is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
		'ready', 'the worker is ready with the stand-in engine');
}

# ------------------------------------------------------------ the database
my $rows = sub {
	my ($dims, $n, $extra) = @_;
	return "SELECT g, CASE WHEN g % 37 = 0 THEN NULL ELSE "
	  . "ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, $dims) WHERE g > 0) END"
	  . ($extra // '') . " FROM generate_series(1, $n) g";
};
$node->safe_psql('postgres', qq{
	CREATE ROLE fuzzer LOGIN;
	SELECT setseed(0.42);
	CREATE TABLE f_l2 (id int, v real[], note text);
	INSERT INTO f_l2 } . $rows->(16, 2000, ", md5(g::text)") . qq{;
	INSERT INTO f_l2 SELECT id + 5000, v, note FROM f_l2 WHERE id % 9 = 0;   -- duplicates
	CREATE INDEX f_l2_default ON f_l2 USING gpuivf (v);
	CREATE INDEX f_l2_one ON f_l2 USING gpuivf (v) WITH (lists = 1, pq_m = 1, pq_bits = 4);
	CREATE INDEX f_l2_many ON f_l2 USING gpuivf (v) WITH (lists = 300, pq_m = 16, pq_bits = 8, rerank = false);
	DELETE FROM f_l2 WHERE id % 11 = 0;                                       -- dead entries

	CREATE TABLE f_ip (id int, v real[]);
	INSERT INTO f_ip } . $rows->(8, 1500) . qq{;
	CREATE INDEX f_ip_v ON f_ip USING gpuivf (v float4_ip_ops) WITH (lists = 8, pq_m = 8, pq_bits = 4);
	CREATE INDEX f_ip_norerank ON f_ip USING gpuivf (v float4_ip_ops) WITH (lists = 4, rerank = false);

	CREATE TABLE f_cos (id int, v real[]);
	INSERT INTO f_cos } . $rows->(12, 1500) . qq{;
	INSERT INTO f_cos SELECT 10000 + g, array_fill(0::real, array[12]) FROM generate_series(1, 20) g;  -- zero vectors
	INSERT INTO f_cos SELECT 20000 + g, array_fill(1e15::real, array[12]) FROM generate_series(1, 5) g; -- the bound
	CREATE INDEX f_cos_v ON f_cos USING gpuivf (v float4_cosine_ops) WITH (lists = 16, pq_m = 3);

	CREATE TABLE f_tiny (id int, v real[]);
	INSERT INTO f_tiny } . $rows->(1, 3000) . qq{;
	CREATE INDEX f_tiny_v ON f_tiny USING gpuivf (v) WITH (lists = 2, pq_m = 1, pq_bits = 4);
	DELETE FROM f_tiny WHERE id % 3 = 0;
	VACUUM f_tiny;

	CREATE TABLE f_empty (id int, v real[]);
	CREATE INDEX f_empty_v ON f_empty USING gpuivf (v);

	CREATE TABLE f_part (id int, v real[]) PARTITION BY RANGE (id);
	CREATE TABLE f_part_1 PARTITION OF f_part FOR VALUES FROM (MINVALUE) TO (700);
	CREATE TABLE f_part_2 PARTITION OF f_part FOR VALUES FROM (700) TO (MAXVALUE);
	INSERT INTO f_part } . $rows->(4, 1400) . qq{;
	CREATE INDEX f_part_v ON f_part USING gpuivf (v) WITH (lists = 3);

	ANALYZE;
	GRANT SELECT, INSERT, UPDATE, DELETE ON f_l2, f_ip, f_cos, f_tiny, f_empty, f_part, f_part_1, f_part_2 TO fuzzer;
	ALTER ROLE fuzzer SET statement_timeout = '2s';
});
$node->safe_psql('postgres', q{
	-- entry points into the index paths: sqlsmith picks user relations often
	-- and user routines rarely, and builds no array operator expressions of
	-- its own, so views hold kNN queries (LATERAL joins for the batched
	-- path, query vectors from rows its DML changes) and functions take its
	-- random arguments (vectors of any table, any k and probes)
	CREATE VIEW f_knn_l2 AS
	  SELECT o.id AS qid, n.id, n.d FROM f_l2 o CROSS JOIN LATERAL
	    (SELECT i.id, i.v <-> o.v AS d FROM f_l2 i ORDER BY i.v <-> o.v LIMIT 4) n;
	CREATE VIEW f_knn_ip AS
	  SELECT o.id AS qid, n.id, n.d FROM f_ip o CROSS JOIN LATERAL
	    (SELECT i.id, i.v <#> o.v AS d FROM f_ip i ORDER BY i.v <#> o.v LIMIT 3) n;
	CREATE VIEW f_knn_cos AS
	  SELECT o.id AS qid, n.id, n.d FROM f_cos o CROSS JOIN LATERAL
	    (SELECT i.id, i.v <=> o.v AS d FROM f_cos i WHERE i.id % 2 = o.id % 2 ORDER BY i.v <=> o.v LIMIT 5) n;
	CREATE VIEW f_knn_tiny AS
	  SELECT o.id AS qid, n.id FROM f_tiny o CROSS JOIN LATERAL
	    (SELECT i.id FROM f_tiny i ORDER BY i.v <-> o.v LIMIT 2) n;
	CREATE VIEW f_knn_part AS
	  SELECT o.id AS qid, n.id, n.d FROM f_part o CROSS JOIN LATERAL
	    (SELECT i.id, i.v <-> o.v AS d FROM f_part i ORDER BY i.v <-> o.v LIMIT 3) n;
	CREATE VIEW f_info AS
	  SELECT c.relname, gpuivf_index_info(c.oid) AS info FROM pg_class c JOIN pg_am a ON a.oid = c.relam
	  WHERE a.amname = 'gpuivf';
	CREATE FUNCTION f_knn(q real[], k int, probes int) RETURNS bigint LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM set_config('gpuivf.probes', greatest(least(probes, 65536), 0)::text, true);
		RETURN (SELECT count(*) FROM (SELECT id FROM f_l2 ORDER BY v <-> q LIMIT greatest(k, 0)) s);
	END $$;
	CREATE FUNCTION f_knn_ip(q real[], k int) RETURNS SETOF int LANGUAGE sql AS
	  $$ SELECT id FROM f_ip ORDER BY v <#> q LIMIT k $$;
	CREATE FUNCTION f_worker(q real[], k int, nprobe int) RETURNS bigint LANGUAGE sql AS
	  $$ SELECT count(*) FROM gpuivf_worker_search('f_l2_default', q, k, nprobe) $$;
	GRANT SELECT ON f_knn_l2, f_knn_ip, f_knn_cos, f_knn_tiny, f_knn_part, f_info TO fuzzer;
});
my @indexes = split /\n/, $node->safe_psql('postgres',
	q{SELECT c.relname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'gpuivf' AND c.relkind = 'i' ORDER BY 1});
cmp_ok(scalar(@indexes), '>=', 10, 'the fuzz database holds ' . scalar(@indexes) . ' gpuivf indexes');

# --------------------------------------------------------------- the rounds
my @rounds = (
	[ 'cpu, sequential scans off', "gpuivf.device = 'cpu'", 'enable_seqscan = off' ],
	[ 'auto, one probe, tiny candidates', "gpuivf.device = 'auto'", 'enable_seqscan = off',
	  'gpuivf.probes = 1', 'gpuivf.rerank_candidates = 1', 'gpuivf.max_probes = 2' ],
	[ 'gpu', "gpuivf.device = '" . ($fake ? 'gpu' : 'auto') . "'", 'enable_seqscan = off',
	  'gpuivf.target_recall = 1', 'enable_sort = off' ],
	[ 'defaults' ]);
my $total = 0;
my $per_round = int($seconds / scalar(@rounds)) || 1;
my $target = sprintf('host=%s port=%d dbname=postgres user=fuzzer', $node->host, $node->port);
for my $i (0 .. $#rounds)
{
	my ($name, @settings) = @{ $rounds[$i] };
	$node->safe_psql('postgres', 'ALTER ROLE fuzzer RESET ALL; ALTER ROLE fuzzer SET statement_timeout = \'2s\';'
		  . join('', map { "ALTER ROLE fuzzer SET $_;" } @settings));
	my ($out, $err) = ('', '');
	my @cmd = ('timeout', '-s', 'INT', "${per_round}s", $sqlsmith, "--target=$target",
		'--exclude-catalog', '--verbose', '--seed=' . ($seed * 100 + $i));
	IPC::Run::run(\@cmd, '>', \$out, '2>', \$err);
	# sqlsmith reports "queries: N" every 800 statements and when it stops
	my @counts = ("$out\n$err" =~ /queries: (\d+)/g);
	my $n = @counts ? $counts[-1] : 0;
	$total += $n;
	note "round '$name': $n statements";
	my $alive = $node->psql('postgres', 'SELECT 1') == 0;
	ok($alive, "round '$name' ($n statements): the server is up") or do
	{
		diag "sqlsmith said: " . substr("$out\n$err", -2000);
		last;
	};
}
diag "sqlsmith ran $total statements in about $seconds s";
cmp_ok($total, '>', 0, 'sqlsmith ran statements');
if ($node->psql('postgres', 'SELECT 1') == 0)
{
	my $scans = $node->safe_psql('postgres', q{SELECT pg_stat_force_next_flush();
		SELECT sum(idx_scan) FROM pg_stat_user_indexes s JOIN pg_class c ON c.oid = s.indexrelid
		JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'gpuivf'});
	$scans =~ s/^\s+//;
	diag "scans of the gpuivf indexes meanwhile: $scans";
	cmp_ok($scans, '>', 0, 'the fuzzing reached the gpuivf indexes');
}

# ------------------------------------------------------------- the verdict
my $log = slurp_file($node->logfile);
my @bad = grep { /terminated by signal|TRAP:|PANIC:|was terminated by exception/ } split /\n/, $log;
is(scalar(@bad), 0, 'no server process crashed and no assertion failed') or do
{
	diag $_ for @bad;
	diag $_ for grep { /Failed process was running/ } split /\n/, $log;
};

if ($node->psql('postgres', 'SELECT 1') == 0)
{
	$node->safe_psql('postgres', 'VACUUM');
	for my $idx (@indexes)
	{
		my ($rc, $out, $err) = $node->psql('postgres', "SELECT gpuivf_verify('$idx', true)");
		is($rc, 0, "$idx verifies after the fuzzing") or diag $err;
	}
	$node->stop;
}
done_testing();
