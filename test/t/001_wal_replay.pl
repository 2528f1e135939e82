
# WAL replay: a streaming standby replays index build, inserts, deletes and
# VACUUM with wal_consistency_checking = 'all' (every replayed page image is
# compared with the primary's), and answers the same top-k as the primary.

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

my $data = generate_data(rows => 6000, dims => 32, queries => 20, seed => 11);
my $queries = read_fvecs($data->{query_fvecs});

# Part of the rows before CREATE INDEX (build path: log_newpage_range), the
# rest after it (insert path: GenericXLog records).
$primary->safe_psql('postgres', 'CREATE TABLE items (id bigint, v real[])');
load_vectors($primary, 'items', $data->{base_copy}, no_create => 1);
$primary->safe_psql('postgres', q{
	CREATE TABLE more AS SELECT * FROM items WHERE id >= 4000;
	DELETE FROM items WHERE id >= 4000;
	VACUUM items;
	CREATE INDEX items_v_idx ON items USING gpuivf (v) WITH (lists = 20);
});
# An index built on an empty table (untrained: vector pages only), filled by
# inserts afterwards.
$primary->safe_psql('postgres', q{
	CREATE TABLE later (id bigint, v real[]);
	CREATE INDEX later_v_idx ON later USING gpuivf (v float4_cosine_ops);
});
$primary->safe_psql('postgres', q{
	INSERT INTO items SELECT * FROM more;
	INSERT INTO later SELECT * FROM items WHERE id % 3 = 0;
	INSERT INTO items (id, v) VALUES (-1, NULL);
	DELETE FROM items WHERE id % 7 = 0;
	DELETE FROM later WHERE id % 2 = 0;
	VACUUM items;
	VACUUM later;
	INSERT INTO items SELECT id + 100000, v FROM more WHERE id % 5 = 0;
	INSERT INTO later SELECT id + 100000, v FROM more WHERE id % 5 = 1;
});
$primary->wait_for_catchup($standby, 'replay');

# Replay with consistency checking either matched every page image or the
# standby stopped with FATAL "inconsistent page found".
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'standby is alive and in recovery');
is($standby->safe_psql('postgres', 'SHOW wal_consistency_checking'), 'all', 'the standby checked every replayed page image');
ok(!$standby->log_contains('inconsistent page found'), 'no page inconsistency reported during replay');

for my $node ($primary, $standby)
{
	my $who = $node->name;
	$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v_idx', true)});
	$node->safe_psql('postgres', q{SELECT gpuivf_verify('later_v_idx', true)});
	pass("$who: gpuivf_verify(…, true) passes for both indexes");
}

my $lists = index_lists($primary, 'items_v_idx');
for my $case (
	[ 'items', 'l2', '' ],
	[ 'items', 'l2', "SET gpuivf.probes = $lists;" ],
	[ 'later', 'cosine', '' ])
{
	my ($table, $metric, $settings) = @$case;
	my $p = knn_ids($primary, $table, $metric, $queries, 10, settings => $settings);
	my $s = knn_ids($standby, $table, $metric, $queries, 10, settings => $settings);
	is_deeply($s, $p, "standby returns the primary's top-10 ($table, $metric, " . ($settings || 'default probes') . ')');
}

is( $standby->safe_psql('postgres', q{SELECT gpuivf_index_info('items_v_idx')->>'vectors'}),
	$primary->safe_psql('postgres', q{SELECT gpuivf_index_info('items_v_idx')->>'vectors'}),
	'index vector counts agree');

$standby->stop;
$primary->stop;
done_testing();
