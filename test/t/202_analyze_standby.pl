
# The recall curve ANALYZE stores is WAL-logged with the metapage:
# it survives a restart of the primary, and a streaming standby (replaying
# with wal_consistency_checking) has the same curve and chooses the same
# nprobe for each target, also after its own restart.  A curve measured
# again replaces the old one on the standby too.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $primary = gpuivf_node('primary',
	allows_streaming => 1,
	conf => "wal_consistency_checking = 'all'\n");
$primary->backup('base');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->append_conf('postgresql.conf', "wal_consistency_checking = 'all'\n");
$standby->start;

my $data = generate_data(rows => 8000, dims => 32, queries => 0, seed => 5);
load_vectors($primary, 'items', $data->{base_copy});
# built without a curve, so that ANALYZE's record is the one that brings it
$primary->safe_psql('postgres', q{
	SET gpuivf.analyze_sample = 0;
	CREATE INDEX items_idx ON items USING gpuivf (v) WITH (lists = 40);
	CREATE INDEX items_ip_idx ON items USING gpuivf (v float4_ip_ops) WITH (lists = 20, rerank = false);
});
is($primary->safe_psql('postgres', q{SELECT gpuivf_index_info('items_idx')->'calibration'}),
	'null', 'no curve before ANALYZE');
$primary->safe_psql('postgres', 'ANALYZE items');

my $calib = q{SELECT gpuivf_index_info('items_idx')->'calibration', gpuivf_index_info('items_ip_idx')->'calibration'};
# gpuivf_index_info reads the target of its own session: one SET per target
sub choices
{
	my ($node) = @_;
	my @c;
	for my $t (qw(0.8 0.9 0.95 0.99))
	{
		push @c, "$t:" . $node->safe_psql('postgres',
			"SET gpuivf.target_recall = $t; SELECT gpuivf_index_info('items_idx')->'probes'->>'in_use'");
	}
	return join(' ', @c);
}

my $on_primary = $primary->safe_psql('postgres', $calib);
like($on_primary, qr/"curve": \[\{/, 'ANALYZE stored curves on the primary');
my $primary_choices = choices($primary);
note "nprobe per target: $primary_choices";

$primary->wait_for_catchup($standby, 'replay');
is($standby->safe_psql('postgres', $calib), $on_primary, 'the standby has the same curves');
is(choices($standby), $primary_choices, 'the standby chooses the same nprobe for every target');
ok(!$standby->log_contains('inconsistent page found'), 'no page inconsistency during replay');

$primary->restart;
is($primary->safe_psql('postgres', $calib), $on_primary, 'the curves survive a restart of the primary');
is(choices($primary), $primary_choices, 'and give the same choices');

$standby->restart;
is($standby->safe_psql('postgres', $calib), $on_primary, 'the curves survive a restart of the standby');

# measuring again replaces the curve everywhere
$primary->safe_psql('postgres', q{
	INSERT INTO items SELECT id + 100000, ARRAY(SELECT x * 1.1 FROM unnest(v) x) FROM items WHERE id % 2 = 0;
	SET gpuivf.analyze_sample = 100;
	ANALYZE items});
my $again = $primary->safe_psql('postgres', $calib);
isnt($again, $on_primary, 'ANALYZE after inserts measured new curves');
like($again, qr/"sample": 100/, 'with the sample size of its session');
# a crash right after it (no checkpoint since): crash recovery replays the
# record.  The standby first replays everything up to here, so that what it
# streamed ends at a record boundary, not wherever the crash cut the stream
# (in one clean-clone CI run it then did not catch up within 180 s).
$primary->wait_for_catchup($standby, 'replay');
$primary->stop('immediate');
$primary->start;
is($primary->safe_psql('postgres', $calib), $again, 'the new curves survive a crash of the primary');
$primary->wait_for_catchup($standby, 'replay');
is($standby->safe_psql('postgres', $calib), $again, 'the standby has the new curves');
is($standby->safe_psql('postgres', "SELECT gpuivf_verify('items_idx')"), '', 'the index verifies on the standby');
ok(!$standby->log_contains('inconsistent page found'), 'still no page inconsistency');

$standby->stop;
$primary->stop;
done_testing();
