
# Concurrent inserts, deletes, VACUUM and kNN queries (pgbench custom scripts,
# 4 clients): no client errors, every query returns its LIMIT of rows, and
# afterwards gpuivf_verify(…, true) passes and the index returns exactly the
# table's rows, also after a final VACUUM that reuses the freed space.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('concurrency', conf => "autovacuum = off\n");
my $data = generate_data(rows => 5000, dims => 32, queries => 1, seed => 5);
my $q = vec_literal(read_fvecs($data->{query_fvecs})->[0]);
load_vectors($node, 'items', $data->{base_copy});
$node->safe_psql('postgres', q{
	CREATE SEQUENCE items_id START 1000000;
	ALTER TABLE items ALTER id SET DEFAULT nextval('items_id');
	CREATE INDEX items_id_idx ON items (id);
	CREATE INDEX items_v_idx ON items USING gpuivf (v) WITH (lists = 20);
});

my %scripts = (
	# ten new rows near existing base rows
	'insert@10' => q{\set r random(0, 4990)
INSERT INTO items (v)
SELECT (SELECT array_agg(x + ((random() - 0.5) * 0.05)::real) FROM unnest(b.v) AS x)
FROM items b WHERE b.id BETWEEN :r AND :r + 9;
},
	# a few base rows and a few inserted rows
	'delete@4' => q{\set r random(0, 4990)
DELETE FROM items WHERE id BETWEEN :r AND :r + 2;
DELETE FROM items WHERE id IN (SELECT id FROM items WHERE id >= 1000000 ORDER BY id DESC LIMIT 3);
},
	# a kNN query near a random row: it must return 10 rows (the table never
	# has fewer); a shortfall fails the client with a cast error
	'query@10' => q{\set r random(0, 4990)
SELECT count(*) AS found FROM (
  SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id >= :r AND v IS NOT NULL ORDER BY id LIMIT 1)
  LIMIT 10) s \gset
\if :found != 10
SELECT 'knn query returned fewer than 10 rows'::int;
\endif
},
	'vacuum@1' => q{VACUUM items;
},
);

my $bench = start_pgbench($node, '-c 4 -j 2 -T 25', \%scripts);
my ($rc, $out, $err) = finish_pgbench($bench);
is($rc, 0, 'pgbench finished without client errors') or diag("stdout:\n$out\nstderr:\n$err");
unlike($err, qr/aborted|ERROR/, 'no statement failed');
my ($tx) = $out =~ /number of transactions actually processed: (\d+)/;
note "pgbench: $tx transactions";
cmp_ok($tx // 0, '>', 100, 'the workload made progress');

sub check_index
{
	my ($when) = @_;
	$node->safe_psql('postgres', q{SELECT gpuivf_verify('items_v_idx', true)});
	pass("$when: gpuivf_verify(items_v_idx, true) passes");
	my $rows = $node->safe_psql('postgres', 'SELECT count(*) FROM items WHERE v IS NOT NULL');
	my $lists = index_lists($node, 'items_v_idx');
	my @exact = count_via_index($node, 'items', 'l2', $q, "SET gpuivf.probes = $lists;");
	is_deeply(\@exact, [ $rows, $rows ], "$when: exact mode returns each of the $rows rows once");
	# distances, not ids: re-inserted copies below make exact ties
	my @ordered = split /\n/, $node->safe_psql('postgres',
		exact_settings() . "SET gpuivf.probes = $lists; SELECT v <-> $q FROM items ORDER BY v <-> $q LIMIT 20");
	my @seq = split /\n/, $node->safe_psql('postgres',
		"SET enable_indexscan = off; SELECT v <-> $q FROM items ORDER BY v <-> $q LIMIT 20");
	is_deeply(\@ordered, \@seq, "$when: exact mode top-20 distances equal a sequential scan's");
	return;
}

check_index('after the concurrent run');

# VACUUM after a large delete frees index space; inserts reuse it.
my $pages_before = index_info($node, 'items_v_idx')->{pages};
$node->safe_psql('postgres', 'DELETE FROM items WHERE id % 2 = 0; VACUUM items;');
check_index('after deleting half and VACUUM');
$node->safe_psql('postgres', q{
	INSERT INTO items (v) SELECT v FROM items WHERE id < 1000000 AND id % 2 = 1 AND id < 2000});
check_index('after inserting into freed space');
my $pages_after = index_info($node, 'items_v_idx')->{pages};
cmp_ok($pages_after, '<=', $pages_before, "reinserting no more rows than were deleted does not grow the index ($pages_before -> $pages_after pages)");

$node->stop;
done_testing();
