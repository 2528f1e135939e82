
# CREATE INDEX grows the index file a chunk of pages at a time (src/pg/storage/writer.cpp,
# WriterNewBuffer): pages a writer added but did not use stay all-zero, at most
# an eighth of the index.  They are never WAL-logged, so an immediate shutdown
# right after the build must leave a working index; every reader skips them;
# the build records them in the FSM, so inserts fill them before extending
# the file.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('extension');
my $data = generate_data(rows => 20000, dims => 32, queries => 5, seed => 31);
my @queries = map { vec_literal($_) } @{ read_fvecs($data->{query_fvecs}) };

load_vectors($node, 'items', $data->{base_copy});
$node->safe_psql('postgres', q{
	CREATE EXTENSION pageinspect;
	CREATE INDEX items_v_idx ON items USING gpuivf (v) WITH (lists = 20);
});

# (all-zero pages, pages) of the index
sub zero_pages
{
	my $row = $node->safe_psql('postgres', q{
		SELECT count(*) FILTER (WHERE (page_header(get_raw_page('items_v_idx', b::int))).upper = 0),
		       count(*)
		FROM generate_series(0, pg_relation_size('items_v_idx') / current_setting('block_size')::int - 1) b});
	return split /\|/, $row;
}

sub answers
{
	return join ';', map {
		$node->safe_psql('postgres',
			"SET enable_seqscan = off; SET gpuivf.probes = 4; "
			  . "SELECT string_agg(id::text, ',' ORDER BY d, id) FROM "
			  . "(SELECT id, v <-> $_ AS d FROM items ORDER BY v <-> $_ LIMIT 10) s")
	} @queries;
}

my ($zero, $pages) = zero_pages();
note "after the build: $zero all-zero pages of $pages";
cmp_ok($zero, '>', 0, 'the build left unused pages of its last chunks');
cmp_ok($zero, '<=', $pages / 8, 'at most an eighth of the index');
$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v_idx', true)});
pass('gpuivf_verify(…, true) passes after the build');
my $before = answers();

# the zero pages were never WAL-logged: recovery replays the build's page
# images around them
$node->stop('immediate');
$node->start;
$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v_idx', true)});
pass('gpuivf_verify(…, true) passes after an immediate shutdown and recovery');
is(answers(), $before, 'and the index gives the same answers');

# a fresh build (its FSM not lost to a crash): inserts take the zero pages
$node->safe_psql('postgres', 'REINDEX INDEX items_v_idx');
my ($zero1) = zero_pages();
$node->safe_psql('postgres', q{
	INSERT INTO items SELECT id + 100000, v FROM items WHERE id < 2000;
});
my ($zero2) = zero_pages();
note "all-zero pages: $zero1 after REINDEX, $zero2 after 2,000 inserts";
cmp_ok($zero1, '>', 0, 'REINDEX left zero pages too');
cmp_ok($zero2, '<', $zero1, 'inserts fill the zero pages (the build put them in the FSM)');
$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v_idx', true)});
pass('gpuivf_verify(…, true) passes after the inserts');
is( $node->safe_psql('postgres',
		"SET enable_seqscan = off; SET gpuivf.probes = 20; "
		  . "SELECT string_agg(id::text, ',' ORDER BY id) FROM (SELECT id FROM items "
		  . "ORDER BY v <-> (SELECT v FROM items WHERE id = 100007) LIMIT 2) s"),
	'7,100007',
	'an inserted row is found through the index, with the row it copies');

done_testing();
