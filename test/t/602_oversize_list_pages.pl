
# An index written before gpuivf kept list pages within MaxIndexTuplesPerPage
# (408 line pointers) can have list pages with up to 680 small entries.
# Such an index must not crash VACUUM; scans read it; gpuivf_verify reports
# the page (with a REINDEX hint), inserts never add to it, and REINDEX
# rewrites it within the bound.
#
# The old layout is made from a current index, with the server stopped: the
# first two pages of the one list's chain are rewritten so that the first
# holds 680 entries and the second the rest (counts and links unchanged),
# exactly what the old build wrote.  Data checksums are off (initdb default).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $BLCKSZ = 8192;
my $node = gpuivf_node('oversize_list_pages', conf => "autovacuum = off\n");

$node->safe_psql('postgres', q{
	CREATE TABLE items (id int, v real[]);
	SELECT setseed(0.25);
	INSERT INTO items SELECT g,
	  (SELECT array_agg((random() * 2 - 1)::real) FROM generate_series(1, 8) WHERE g > 0)
	  FROM generate_series(1, 1000) g;
	SET gpuivf.analyze_sample = 0;
	CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 1, pq_m = 2);
	CHECKPOINT;
});
my $file = $node->data_dir . '/' . $node->safe_psql('postgres', q{SELECT pg_relation_filepath('items_v')});
$node->stop;

open(my $fh, '+<:raw', $file) or die "open $file: $!";
sub read_page
{
	my ($blk) = @_;
	my $page;
	sysseek($fh, $blk * $BLCKSZ, 0) or die;
	sysread($fh, $page, $BLCKSZ) == $BLCKSZ or die "short read of block $blk";
	return $page;
}
sub write_page
{
	my ($blk, $page) = @_;
	sysseek($fh, $blk * $BLCKSZ, 0) or die;
	syswrite($fh, $page) == $BLCKSZ or die "short write of block $blk";
}
# the items of a page (bytes, in line pointer order)
sub page_items
{
	my ($page) = @_;
	my $lower = unpack('v', substr($page, 12, 2));
	my @items;
	for (my $p = 24; $p < $lower; $p += 4)
	{
		my $lp = unpack('V', substr($page, $p, 4));
		my ($off, $len) = ($lp & 0x7fff, $lp >> 17);
		push @items, substr($page, $off, $len);
	}
	return @items;
}
# the page with its items replaced (line pointers normal, packed at the end)
sub with_items
{
	my ($page, @items) = @_;
	my $special = unpack('v', substr($page, 16, 2));
	my $upper = $special;
	my $lps = '';
	my $body = '';
	for my $it (@items)
	{
		$upper -= length($it);
		$body = $it . $body;
		$lps .= pack('V', $upper | (1 << 15) | (length($it) << 17));
	}
	my $lower = 24 + length($lps);
	die "items do not fit" if $lower > $upper;
	my $new = substr($page, 0, 12) . pack('vv', $lower, $upper) . substr($page, 16, 8)
	  . $lps . ("\0" x ($upper - $lower)) . $body . substr($page, $special);
	return $new;
}

# metapage: directory_start at 24 + 72; the directory's entry of list 0: head
my $meta = read_page(0);
my $dir_start = unpack('V', substr($meta, 24 + 72, 4));
my $head = unpack('V', substr(read_page($dir_start), 24, 4));
my $first = read_page($head);
my $second_blk = unpack('V', substr($first, $BLCKSZ - 8, 4));
my $second = read_page($second_blk);
my @a = page_items($first);
my @b = page_items($second);
is(scalar(@a), 408, 'the current build fills a list page up to 408 entries');
my $move = 680 - scalar(@a);
cmp_ok(scalar(@b), '>=', $move, "the second page has the $move entries to move");
write_page($head, with_items($first, @a, @b[ 0 .. $move - 1 ]));
write_page($second_blk, with_items($second, @b[ $move .. $#b ]));
close($fh);
is(scalar(page_items(read_page_file($file, $head))), 680, 'the first list page now holds 680 entries');

sub read_page_file
{
	my ($f, $blk) = @_;
	open(my $h, '<:raw', $f) or die;
	my $page;
	sysseek($h, $blk * $BLCKSZ, 0);
	sysread($h, $page, $BLCKSZ);
	close($h);
	return $page;
}

$node->start;

my ($rc, $out, $err) = $node->psql('postgres', q{SELECT gpuivf_verify('items_v', true)});
isnt($rc, 0, 'gpuivf_verify reports the old page');
like($err, qr/is corrupted/, '... as corruption');
like($err, qr/List page $head has 680 line pointers, more than the 408 an index page may have/,
	'... naming the page and the bound');
like($err, qr/HINT:  Rebuild the index with REINDEX/, '... with a REINDEX hint');

my $count_sql = q{SET enable_seqscan = off; SET gpuivf.probes = 1;
	SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> '{0,0,0,0,0,0,0,0}' LIMIT 100000) s};
is($node->safe_psql('postgres', $count_sql), '1000', 'an index scan reads all 1000 entries');

# inserts do not add to the full page; VACUUM removes entries from it
$node->safe_psql('postgres', q{
	INSERT INTO items SELECT g,
	  (SELECT array_agg((random() * 2 - 1)::real) FROM generate_series(1, 8) WHERE g > 0)
	  FROM generate_series(1001, 1100) g;
	DELETE FROM items WHERE id % 7 = 0 OR id BETWEEN 1 AND 30;
});
($rc, $out, $err) = $node->psql('postgres', 'VACUUM items');
is($rc, 0, 'VACUUM of the index with a 680-entry page succeeds') or diag $err;
is($node->safe_psql('postgres', $count_sql), $node->safe_psql('postgres', 'SELECT count(*) FROM items'),
	'after VACUUM the index scan returns every live row');
$node->restart;    # a crash would have restarted the cluster; this one must be clean
ok(!$node->log_contains('terminated by signal'), 'no server process was terminated by a signal');

# about 120 of the page's 680 entries were deleted: still above the bound
($rc, $out, $err) = $node->psql('postgres', q{SELECT gpuivf_verify('items_v', true)});
like($err, qr/List page $head has 5\d\d line pointers/,
	'the page VACUUM compacted is reported while it is above the bound');

$node->safe_psql('postgres', q{REINDEX INDEX items_v});
($rc, $out, $err) = $node->psql('postgres', q{SELECT gpuivf_verify('items_v', true)});
is($rc, 0, 'after REINDEX gpuivf_verify(items_v, true) passes') or diag $err;

$node->stop;
done_testing();
