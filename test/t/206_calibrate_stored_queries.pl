
# The queries a calibration measured on are stored in the index's pages,
# WAL-logged: a streaming standby (replaying with wal_consistency_checking)
# has them and the same curves, a crash of the primary keeps them, and the
# next ANALYZE measures on them again.  Calibrations reuse their pages (the
# index does not grow with every ANALYZE), gpuivf_verify checks them.
# Recorded queries survive REINDEX of the same index (its build calibrates
# on them).  Privileges: gpuivf_calibrate checks SELECT on the table before
# taking any lock, wants the table's owner, and runs the query with the
# caller's rights; no function shows a recorded or stored vector.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;
use GpuivfTest;

my $primary = gpuivf_node('primary', allows_streaming => 1, conf => qq(
shared_preload_libraries = 'gpuivf'
wal_consistency_checking = 'all'
gpuivf.analyze_sample = 100
autovacuum_naptime = 1
));
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->append_conf('postgresql.conf', "wal_consistency_checking = 'all'\n");
$standby->start;

my $data = generate_data(rows => 6000, dims => 24, queries => 300, seed => 11,
	query_options => [ '--query-clusters', 10, '--query-shift', 1.5 ]);
load_vectors($primary, 'items', $data->{base_copy});
load_vectors($primary, 'qs', $data->{query_copy});
# autovacuum only where the test asks for it
$primary->safe_psql('postgres', 'ALTER TABLE items SET (autovacuum_enabled = off)');
$primary->safe_psql('postgres', 'CREATE INDEX items_idx ON items USING gpuivf (v) WITH (lists = 60)');

sub info
{
	my ($node, $path) = @_;
	return $node->safe_psql('postgres', "SELECT gpuivf_index_info('items_idx') #>> '{$path}'");
}
my $calib = q{SELECT gpuivf_index_info('items_idx') -> 'calibration'};

# ------------------------------------------------------ stored and replicated
$primary->safe_psql('postgres', q{SELECT gpuivf_calibrate('items_idx', 'SELECT v FROM qs WHERE id < 150')});
is(info($primary, 'calibration,source'), 'given', 'calibrated on given queries');
is(info($primary, 'calibration,stored_queries'), 100, 'gpuivf.analyze_sample of them stored');
# the second calibration writes its set beside the first, which then becomes
# the free pages the third one writes into
$primary->safe_psql('postgres', 'ANALYZE items');
my $pages = info($primary, 'pages');
for (1 .. 3)
{
	$primary->safe_psql('postgres', q{SELECT gpuivf_calibrate('items_idx', 'SELECT v FROM qs WHERE id < 150')});
	$primary->safe_psql('postgres', 'ANALYZE items');
}
is(info($primary, 'pages'), $pages, "six more calibrations reuse the pages ($pages)");
$primary->safe_psql('postgres', q{SELECT gpuivf_verify('items_idx', true)});
pass('the index verifies with its calibration pages');

my $on_primary = $primary->safe_psql('postgres', $calib);
my $curves_sql = q{SELECT c->>'k', c->'curve' FROM jsonb_array_elements(gpuivf_index_info('items_idx')->'calibration'->'curves') c};
my $curves_before = $primary->safe_psql('postgres', $curves_sql);
$primary->wait_for_catchup($standby, 'replay');
is($standby->safe_psql('postgres', $calib), $on_primary, 'the standby has the same calibration');
$standby->safe_psql('postgres', q{SELECT gpuivf_verify('items_idx', true)});
pass('and its copy of the pages verifies');
ok(!$standby->log_contains('inconsistent page found'), 'no page inconsistency during replay');

# ---------------------------------------------------------------- a crash
$primary->stop('immediate');
$primary->start;
is($primary->safe_psql('postgres', $calib), $on_primary, 'a crash of the primary keeps the calibration');
$primary->safe_psql('postgres', 'ANALYZE items');
is(info($primary, 'calibration,source'), 'given', 'ANALYZE after the crash measures on the stored queries');
is(info($primary, 'calibration,sample'), 100, 'all of them, read back from the pages');
is($primary->safe_psql('postgres', $curves_sql), $curves_before,
	'and measures the same curves as before the crash');

# --------------------------------------------------- recorded, then REINDEX
$primary->safe_psql('postgres', q{SELECT gpuivf_calibrate('items_idx', NULL)});
my $q = $primary->safe_psql('postgres', q{
	SELECT string_agg(format('SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> %L LIMIT 5) s;', v), E'\n')
	FROM qs WHERE id >= 150});
$primary->safe_psql('postgres', "SET enable_seqscan = off;\n$q");
is(info($primary, 'recorded_queries,seen'), 150, '150 queries recorded');
$primary->safe_psql('postgres', 'REINDEX INDEX items_idx');
is(info($primary, 'calibration,source'), 'workload', 'REINDEX calibrates on the queries recorded before it');
$primary->safe_psql('postgres', q{SET gpuivf.query_sample = 0; SELECT gpuivf_calibrate('items_idx', NULL)});

# autovacuum's ANALYZE calibrates on recorded queries as ANALYZE does
$primary->safe_psql('postgres', "SET enable_seqscan = off;\n$q");
$primary->safe_psql('postgres', q{
	ALTER TABLE items SET (autovacuum_enabled = on, autovacuum_analyze_threshold = 10,
		autovacuum_analyze_scale_factor = 0);
	INSERT INTO items SELECT id + 100000, v FROM items WHERE id < 50});
is(poll_until($primary, q{SELECT gpuivf_index_info('items_idx') #>> '{calibration,source}'}, 'workload'),
	'workload', "autovacuum's ANALYZE calibrates on the recorded queries");
$primary->safe_psql('postgres', q{
	ALTER TABLE items SET (autovacuum_enabled = off);
	SET gpuivf.query_sample = 0; SELECT gpuivf_calibrate('items_idx', NULL)});

# ---------------------------------------------------------------- privileges
$primary->safe_psql('postgres', q{
	CREATE ROLE reader LOGIN; GRANT SELECT ON items, qs TO reader;
	CREATE ROLE stranger LOGIN;
	CREATE ROLE owner_r LOGIN; CREATE TABLE owned (id bigint, v real[]);
	INSERT INTO owned SELECT id, v FROM items WHERE id < 2000;
	CREATE INDEX owned_idx ON owned USING gpuivf (v) WITH (lists = 10);
	ALTER TABLE owned OWNER TO owner_r;
});
my ($ret, $out, $err) = $primary->psql('postgres',
	q{SELECT gpuivf_calibrate('items_idx', 'SELECT v FROM qs')}, extra_params => [ '-U', 'stranger' ]);
like($err, qr/permission denied for table items/, 'no SELECT on the table: permission denied');
($ret, $out, $err) = $primary->psql('postgres',
	q{SELECT gpuivf_index_info('items_idx')}, extra_params => [ '-U', 'stranger' ]);
like($err, qr/permission denied for table items/, 'gpuivf_index_info too');
($ret, $out, $err) = $primary->psql('postgres',
	q{SELECT gpuivf_calibrate('items_idx', 'SELECT v FROM qs')}, extra_params => [ '-U', 'reader' ]);
like($err, qr/must be owner of table items to calibrate its index/, 'SELECT alone: must be the owner, as for ANALYZE');
($ret, $out, $err) = $primary->psql('postgres',
	q{SELECT gpuivf_calibrate('owned_idx', 'SELECT v FROM qs')}, extra_params => [ '-U', 'owner_r' ]);
like($err, qr/permission denied for table qs/, "the query runs with the caller's rights");

# the privilege check comes before any lock: it does not wait for a lock
# another session holds on the table
my ($lin, $lout, $lerr) = ('', '', '');
my $locker = IPC::Run::start([ 'psql', '-X', '-q', '-A', '-t', '-d', $primary->connstr('postgres') ],
	'<', \$lin, '>', \$lout, '2>', \$lerr);
$lin .= "BEGIN; LOCK TABLE items IN ACCESS EXCLUSIVE MODE; SELECT 'locked';\n";
$locker->pump until $lout =~ /locked/;
($ret, $out, $err) = $primary->psql('postgres',
	q{SET lock_timeout = '5s'; SELECT gpuivf_calibrate('items_idx', 'SELECT v FROM qs')},
	extra_params => [ '-U', 'stranger' ]);
like($err, qr/permission denied for table items/, 'refused without waiting for the table lock');
$lin .= "ROLLBACK;\n\\q\n";
$locker->finish;

# what gpuivf_index_info shows of queries: counts and distances, no vector
# (its arrays are the curves and the re-rank depths)
my $shown = $primary->safe_psql('postgres',
	q{SELECT (gpuivf_index_info('items_idx') -> 'recorded_queries') || ((gpuivf_index_info('items_idx') -> 'calibration') - 'curves' - 'curve' - 'deeper_curves' - 'depths')});
unlike($shown, qr/\[/, 'gpuivf_index_info shows no array of recorded or stored queries');

$standby->stop;
$primary->stop;
done_testing();
