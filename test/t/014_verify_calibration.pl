
# gpuivf_verify checks the calibration on the metapage, which scans choose
# their probes and re-rank depth from: probe counts ascending within the
# lists, recalls within 0 and 1, at most two deeper re-rank curves, depths
# ascending.  Each corruption is written while the server is down and
# undone before the next; the intact index verifies before and after.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use GpuivfTest;

my $node = gpuivf_node('verify_calibration');
my $data = generate_data(rows => 4000, dims => 16, queries => 2, seed => 31);
load_vectors($node, 'items', $data->{base_copy});
$node->safe_psql('postgres',
	'CREATE INDEX items_idx ON items USING gpuivf (v) WITH (lists = 40)');
$node->safe_psql('postgres', 'ANALYZE items');
is($node->safe_psql('postgres', q{SELECT gpuivf_verify('items_idx')}), '',
	'the calibrated index verifies');

my $calib = decode_json($node->safe_psql('postgres',
	q{SELECT gpuivf_index_info('items_idx')->'calibration'}));
my @nprobe = map { $_->{nprobe} } @{ $calib->{curve} };
cmp_ok(scalar @nprobe, '>=', 3, 'the curve has at least three points');

my $path = $node->data_dir . '/'
  . $node->safe_psql('postgres', q{SELECT pg_relation_filepath('items_idx')});

# The metapage (block 0): calib_nprobe[64] (uint32), then calib_recall[3][64]
# (recall, recall_se: float4 each), then calib_depth, calib_deep_count and
# calib_deep_depth[2] (uint32; src/pg/gpuivf.h).  calib_nprobe is found by
# its values; the depth read back checks the layout.
$node->stop;
open(my $fh, '+<:raw', $path) or die "open $path: $!";
my $meta;
sysread($fh, $meta, 8192) == 8192 or die "read: $!";
my $pattern = pack('L*', @nprobe);
my @at;
for (my $i = index($meta, $pattern); $i >= 0; $i = index($meta, $pattern, $i + 1))
{
	push @at, $i;
}
is(scalar @at, 1, 'the probe counts appear once on the metapage')
  or BAIL_OUT('calib_nprobe not found');
my $nprobe_off = $at[0];
my $recall_off = $nprobe_off + 4 * 64;
my $depth_off = $recall_off + 8 * 3 * 64;
is(unpack('L', substr($meta, $depth_off, 4)), $calib->{rerank_candidates},
	'calib_depth sits where the layout says');

# write BYTES at OFF of block 0, start, run gpuivf_verify, stop, restore
sub verify_with
{
	my ($off, $bytes) = @_;
	my $old = substr($meta, $off, length $bytes);
	sysseek($fh, $off, 0) or die "seek: $!";
	syswrite($fh, $bytes) == length $bytes or die "write: $!";
	$node->start;
	my ($ret, $stdout, $stderr) =
	  $node->psql('postgres', q{SELECT gpuivf_verify('items_idx')});
	$node->stop;
	sysseek($fh, $off, 0) or die "seek: $!";
	syswrite($fh, $old) == length $old or die "write: $!";
	return $stderr;
}

like(verify_with($nprobe_off + 4, pack('L L', $nprobe[2], $nprobe[1])),
	qr/probe counts are not ascending/, 'swapped probe counts are reported');
like(verify_with($recall_off, pack('f', 1.5)),
	qr/calibration recall .* is outside 0 to 1/, 'a recall of 1.5 is reported');
like(verify_with($depth_off + 4, pack('L', 3)),
	qr/3 deeper re-rank curves; the metapage holds 2 at most/,
	'three deeper curves are reported');
like(verify_with($depth_off + 4, pack('L L', 1, 100)),
	qr/re-rank depth 100 follows depth 200/,
	'a deeper depth below the first is reported');
like(verify_with($depth_off + 4, pack('L L', 1, 400)),
	qr/^$/, 'a deeper depth above the first is not');

close($fh);
$node->start;
is($node->safe_psql('postgres', q{SELECT gpuivf_verify('items_idx')}), '',
	'the restored index verifies');
$node->stop;
done_testing();
