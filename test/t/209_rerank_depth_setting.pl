
# An explicit gpuivf.rerank_candidates is taken as it is, as gpuivf.probes
# is: on an index whose calibration chose a deeper re-rank, a set depth is
# what scans re-rank (gpuivf_index_info, EXPLAIN, the candidates counted),
# the curves it reads are those of the deepest measured depth at or below
# it, a target they cannot reach says so with a hint that helps, and 0
# (or RESET) goes back to the automatic depth.  ANALYZE under a set depth
# measures from that depth up.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('rerank_depth_setting');
my $data = generate_data(rows => 10000, dims => 256, queries => 1, seed => 5);
my $q0 = vec_literal(read_fvecs($data->{query_fvecs})->[0]);
load_vectors($node, 'items', $data->{base_copy});
$node->safe_psql('postgres',
	'CREATE INDEX items_idx ON items USING gpuivf (v) WITH (lists = 50, pq_m = 8, target_recall = 0.99)');

sub probes
{
	my ($settings) = @_;
	return $node->safe_psql('postgres', ($settings // '') . q{
		SELECT p->>'rerank_candidates', p->>'rerank_source'
		FROM (SELECT gpuivf_index_info('items_idx')->'probes' AS p) s});
}

sub explain
{
	my ($settings, $limit) = @_;
	return $node->safe_psql('postgres', ($settings // '') . qq{
		SET enable_seqscan = off;
		EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
		SELECT id FROM items ORDER BY v <-> $q0 LIMIT $limit});
}

my ($auto, $auto_src) = split /\|/, probes();
cmp_ok($auto, '>', 200, "automatic: the calibration's depth $auto");
is($auto_src, 'curve', 'automatic: from the curves');

my $set = 'SET gpuivf.rerank_candidates = 300;';
is(probes($set), '300|setting', 'a set depth is the depth in use, from the setting');
like(explain($set, 10), qr/Re-rank Depth: 300\n\s*Re-rank Depth From: gpuivf.rerank_candidates\n\s*Re-ranked: 300\n/,
	'LIMIT 10: EXPLAIN shows the set depth, and 300 candidates are re-ranked');
like(explain($set, 20), qr/Re-rank Depth: 300\n.*\n\s*Re-ranked: 600\n/,
	'LIMIT 20: twice as many (the count per row applies on top of the set depth)');

# the set depth reads the curves of the deepest measured depth at or below
# it: 200's, which cannot reach the index's target 0.99; the hint is to
# reset
my ($rc, $out, $err) = $node->psql('postgres', qq{
	$set SET enable_seqscan = off;
	SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> $q0 LIMIT 10) s});
is($rc, 0, 'a set depth below what the target needs: the query runs');
like($err, qr/NOTICE:  recall target 0.990 .* is above the best recall ANALYZE measured.*re-ranking 200 candidates.*HINT:  Reset gpuivf.rerank_candidates/s,
	'and a NOTICE says the curve it read and hints at resetting the setting')
  or diag($err);
# the DETAIL's best recall is the best point of the curve it read (200's,
# k 10, as gpuivf_index_info shows it, to its four decimals)
my ($best, $at) = $err =~ /best measured recall\@10 is ([0-9.]+) at (\d+) of 50 lists/;
my %curve = map { split /\|/ } split /\n/, $node->safe_psql('postgres', q{
	SELECT pt->>'nprobe', pt->>'recall'
	FROM jsonb_array_elements((gpuivf_index_info('items_idx')->'calibration'->'curves')::jsonb) c,
	     jsonb_array_elements(c->'curve') pt
	WHERE (c->>'k')::int = 10});
my ($max) = sort { $b <=> $a } values %curve;
ok(defined $best && abs($best - $max) < 0.0006 && defined $curve{$at} && $curve{$at} > $max - 0.0001,
	"the NOTICE's best recall $best at $at probes is the curve's best ($max)")
  or diag(join ' ', map { "$_:$curve{$_}" } sort { $a <=> $b } keys %curve);
is(probes('SET gpuivf.rerank_candidates = 0;'), "$auto|curve", '0 is the automatic depth again');

# ANALYZE under a set depth measures from it up
$node->safe_psql('postgres', 'SET gpuivf.rerank_candidates = 100; ANALYZE items');
is($node->safe_psql('postgres', "SELECT gpuivf_index_info('items_idx')->'calibration'->>'depths'"),
	'[100, 200, 400]', 'ANALYZE with the setting at 100 measures 100, 200 and 400');

$node->stop;
done_testing();
