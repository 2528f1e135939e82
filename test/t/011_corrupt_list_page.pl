
# A list page that is not one (here: its page type overwritten while the
# server was down) is reported as index corruption by every reader of list
# pages — a scan, ANALYZE's calibration and gpuivf_verify — never skipped:
# a calibration that skipped it would store a curve measured on part of the
# index.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('corrupt');
my $data = generate_data(rows => 3000, dims => 16, queries => 2, seed => 29);
my $q = vec_literal(read_fvecs($data->{query_fvecs})->[0]);

load_vectors($node, 'items', $data->{base_copy});
$node->safe_psql('postgres', 'CREATE INDEX items_v_idx ON items USING gpuivf (v) WITH (lists = 4, rerank = false)');
$node->safe_psql('postgres', 'ANALYZE items');
pass('ANALYZE calibrates the intact index');

my $path = $node->data_dir . '/'
  . $node->safe_psql('postgres', q{SELECT pg_relation_filepath('items_v_idx')});
$node->stop;

# The special space of a gpuivf page ends with page_type (uint16) and
# page_id (uint16, 0xFF91); list pages have type 5.  Turn the first list
# page into a "vector" page (type 6).
open(my $fh, '+<:raw', $path) or die "open $path: $!";
my $blcksz = 8192;
my $size = -s $path;
my $changed;
for (my $blk = 1; $blk * $blcksz < $size; $blk++)
{
	my $tail;
	sysseek($fh, ($blk + 1) * $blcksz - 4, 0) or die "seek: $!";
	sysread($fh, $tail, 4) == 4 or die "read: $!";
	my ($type, $id) = unpack('S S', $tail);
	next unless $id == 0xFF91 && $type == 5;
	sysseek($fh, ($blk + 1) * $blcksz - 4, 0) or die "seek: $!";
	syswrite($fh, pack('S', 6)) == 2 or die "write: $!";
	$changed = $blk;
	last;
}
close($fh);
ok(defined $changed, 'a list page was found and its type changed') or BAIL_OUT('no list page');
note "changed block $changed";
$node->start;

my ($ret, $stdout, $stderr) = $node->psql('postgres', 'ANALYZE items');
isnt($ret, 0, 'ANALYZE fails on the index with a bad list page');
like($stderr, qr/index "items_v_idx" contains an unexpected page at block $changed/,
	'and reports the page as corruption');

($ret, $stdout, $stderr) = $node->psql('postgres',
	"SET gpuivf.probes = 4; SET enable_seqscan = off; SELECT id FROM items ORDER BY v <-> $q LIMIT 10");
like($stderr, qr/contains an unexpected page at block $changed/,
	'a scan that probes every list reports the same page');

($ret, $stdout, $stderr) = $node->psql('postgres', q{SELECT gpuivf_verify('items_v_idx')});
like($stderr, qr/corrupted|not a list page/, 'gpuivf_verify reports it too');

$node->stop;
done_testing();
