
# The GPU worker on a machine without a GPU (CI): with gpuivf preloaded the
# worker starts, says once that it has no usable GPU and stays up (no crash
# loop), gpuivf_stat shows it, gpuivf.device = auto answers on the CPU with
# the same rows as cpu (each query counted in gpuivf_stat.cpu_fallbacks:
# a worker exists but cannot serve it), gpuivf.device = gpu fails with a
# clear error, CREATE INDEX runs on the CPU, and a terminated worker is
# started again.
#
# CUDA_VISIBLE_DEVICES is emptied for the server so that the worker has no
# GPU even on a machine that has one.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

local $ENV{CUDA_VISIBLE_DEVICES} = '';
my $node = gpuivf_node('worker_nogpu',
	conf => "shared_preload_libraries = 'gpuivf'\nlog_min_messages = log\n");


sub count_in_log
{
	my ($pattern) = @_;
	my $log = slurp_file($node->logfile);
	my @hits = ($log =~ /$pattern/g);
	return scalar @hits;
}

# ------------------------------------------------------------- worker up
is( poll_until($node, 
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'gpuivf gpu worker'",
		'1'),
	'1',
	'one gpuivf gpu worker is in pg_stat_activity');

is(poll_until($node, 'SELECT state FROM gpuivf_stat WHERE worker = 0', 'no gpu'),
	'no gpu', 'gpuivf_stat shows the worker without a GPU');
my $stat = $node->safe_psql('postgres',
	"SELECT count(*), bool_and(pid > 0), bool_and(message <> ''), bool_and(requests = 0) FROM gpuivf_stat"
);
is($stat, '1|t|t|t', 'gpuivf_stat: one row, a pid, the reason, no requests');
note 'reason: '
  . $node->safe_psql('postgres', 'SELECT message FROM gpuivf_stat');

my $pid = $node->safe_psql('postgres', 'SELECT pid FROM gpuivf_stat');
sleep 2;
is($node->safe_psql('postgres', 'SELECT pid FROM gpuivf_stat'),
	$pid, 'the worker stays up (same pid after 2 s)');
is(count_in_log('has no usable GPU'), 1, 'the worker says once that it has no GPU');

# --------------------------------------------------------- CPU answers
$node->safe_psql('postgres', q{
	SELECT setseed(0.25);
}
	. grouped_items_sql(3000, 17, 0.2)
	. q{
	CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 16);
});
$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v', true)});
pass('CREATE INDEX with the worker up but no GPU builds a valid index');

my @queries = map { "(SELECT v FROM items WHERE id = $_)" } (5, 77, 1234, 2999);
sub answers
{
	my ($device) = @_;
	my $sql = "SET gpuivf.device = $device; SET gpuivf.probes = 4; SET enable_seqscan = off;\n";
	$sql .= "SELECT string_agg(id || ':' || d, ',') FROM (SELECT id, v <-> $_ AS d FROM items ORDER BY v <-> $_ LIMIT 10) s;\n"
	  for @queries;
	return $node->safe_psql('postgres', $sql);
}
sub fallbacks
{
	return $node->safe_psql('postgres', 'SELECT cpu_fallbacks FROM gpuivf_stat WHERE worker = 0');
}
my $fb0 = fallbacks();
my $auto = answers('auto');
my $fb1 = fallbacks();
my $cpu = answers('cpu');
is($auto, $cpu, 'gpuivf.device = auto answers like cpu (ids and distances)');
is($fb1 - $fb0, scalar(@queries),
	'under auto each query answered on the CPU is a CPU fallback (the worker has no GPU)');
is(fallbacks(), $fb1, 'under cpu none is counted');
is(scalar(split /,/, (split /\n/, $auto)[0]), 10, 'and returns 10 rows');

my ($ret, $out, $err) = $node->psql('postgres',
	"SET gpuivf.device = gpu; SET enable_seqscan = off; SELECT id FROM items ORDER BY v <-> $queries[0] LIMIT 3"
);
isnt($ret, 0, 'gpuivf.device = gpu fails without a GPU');
like(
	$err,
	qr/gpuivf\.device is set to "gpu" but no gpuivf GPU worker is running/,
	'with a clear message');
($ret, $out, $err) = $node->psql('postgres',
	"SET gpuivf.device = gpu; SET enable_seqscan = off; DO \$\$ BEGIN"
	  . " PERFORM id FROM items ORDER BY v <-> $queries[0] LIMIT 1;"
	  . " EXCEPTION WHEN object_not_in_prerequisite_state THEN RAISE NOTICE 'sqlstate 55000'; END \$\$;");
like($err, qr/sqlstate 55000/, 'with SQLSTATE 55000 (object_not_in_prerequisite_state)');

# ---------------------------------------------------- restart, no loop
$node->safe_psql('postgres', 'SELECT pg_terminate_backend(pid) FROM gpuivf_stat');
is( poll_until($node,
		"SELECT count(*) FROM gpuivf_stat WHERE state = 'no gpu' AND pid <> $pid", '1'),
	'1', 'a terminated worker is started again');
sleep 1;
is(count_in_log('has no usable GPU'), 2, 'and says once more that it has no GPU');
is($node->safe_psql('postgres', 'SELECT count(*) FROM items ORDER BY 1'),
	'3000', 'the cluster keeps answering');

$node->stop;
done_testing();
