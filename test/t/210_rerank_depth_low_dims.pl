
# Low-dimensional data keeps the default re-rank depth: where 200
# candidates cover every recall target (PQ orders the neighbours well), the
# calibration stores no deeper curves and scans re-rank 200; the sweep goes
# no further for them (each stage stops when the default depth's curves
# are done).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('rerank_depth_low_dims');
my $data = generate_data(rows => 20000, dims => 32, queries => 0, seed => 3);
load_vectors($node, 'items', $data->{base_copy});
my ($rc, $out, $err) = $node->psql('postgres',
	'SET client_min_messages = debug1; CREATE INDEX items_idx ON items USING gpuivf (v) WITH (lists = 100)');
is($rc, 0, 'CREATE INDEX');
my ($points) = $err =~ /calibrated on \d+ queries .* (\d+) points up to nprobe/;
note "calibration: $points points";

my $calib = $node->safe_psql('postgres', q{
	SELECT c->>'depths', jsonb_array_length(c->'deeper_curves'), c->>'rerank_candidates'
	FROM (SELECT gpuivf_index_info('items_idx')->'calibration' AS c) s});
is($calib, '[200]|0|200', 'the calibration measured and kept only the default depth');
is($node->safe_psql('postgres', q{
	SELECT p->>'rerank_candidates' || ' ' || (p->>'rerank_source')
	FROM (SELECT gpuivf_index_info('items_idx')->'probes' AS p) s}),
	'200 default', 'scans re-rank the default 200');
is($node->safe_psql('postgres', q{
	SET gpuivf.target_recall = 0.99;
	SELECT gpuivf_index_info('items_idx')->'probes'->>'target_reached'}),
	'true', 'and at it the curve reaches even target 0.99');

$node->stop;
done_testing();
