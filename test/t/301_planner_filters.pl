
# Filtered kNN: WHERE <predicate> ORDER BY v <-> q LIMIT k returns k
# rows whenever k rows pass the filter, for filters keeping 1%, 10% and 50% of
# the rows, through plain index scans and through the batched LATERAL join.
# Recall@k against the exact filtered answer (a sequential scan of the same
# query) is printed and held to floors below the measured values.  The
# batched join must return exactly what the nested loop returns.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $k = 10;
my $nq = 100;
my $node = gpuivf_node('planner_filters');
my $data = generate_data(rows => 20000, dims => 32, queries => $nq, seed => 301);
my $queries = read_fvecs($data->{query_fvecs});
load_vectors($node, 'items', $data->{base_copy});

# cat: 0..99 from a hash of id, independent of where a row lies
$node->safe_psql('postgres', q{
	ALTER TABLE items ADD COLUMN cat int;
	UPDATE items SET cat = (hashint8(id) & 2147483647) % 100;
	CREATE TABLE queries (qid int, v real[]);
});
my $values = join(",\n", map { "($_, " . vec_literal($queries->[$_]) . ")" } 0 .. $#$queries);
$node->safe_psql('postgres', "INSERT INTO queries VALUES $values");
$node->safe_psql('postgres', q{
	CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 100);
	VACUUM ANALYZE items;
	ANALYZE queries;
});

# qid => [ids in returned order] of a LATERAL kNN join under settings
sub join_ids
{
	my ($filter, $settings) = @_;
	my $out = $node->safe_psql('postgres', qq{
		SET max_parallel_workers_per_gather = 0;
		SET jit = off;
		$settings
		SELECT q.qid, n.id
		FROM queries q CROSS JOIN LATERAL (
			SELECT i.id FROM items i WHERE $filter ORDER BY i.v <-> q.v LIMIT $k) n});
	my %ids;
	for my $line (split /\n/, $out)
	{
		my ($qid, $id) = split /\|/, $line;
		push @{ $ids{$qid} }, $id;
	}
	return \%ids;
}

sub recall
{
	my ($got, $truth) = @_;
	my ($hit, $total) = (0, 0);
	for my $qid (keys %$truth)
	{
		my %want = map { $_ => 1 } @{ $truth->{$qid} };
		$hit += scalar grep { $want{$_} } @{ $got->{$qid} // [] };
		$total += scalar @{ $truth->{$qid} };
	}
	return $total ? $hit / $total : 1;
}

# every query got k rows
sub full_k
{
	my ($got) = @_;
	my $short = grep { scalar(@{ $got->{$_} // [] }) != $k } 0 .. $nq - 1;
	return $short == 0;
}

my $index_only = 'SET enable_seqscan = off; SET enable_bitmapscan = off;';
my %floor = (1 => 0.85, 10 => 0.88, 50 => 0.93);
for my $pct (1, 10, 50)
{
	my $filter = "i.cat < $pct";
	my $truth = join_ids($filter, 'SET enable_indexscan = off; SET enable_bitmapscan = off;');
	ok(full_k($truth), "$pct%: the exact answer has $k rows for every query");

	# plain index scans, one query after another
	my $plain = join_ids($filter, "$index_only SET gpuivf.enable_batch_join = off;");
	ok(full_k($plain), "$pct%: index scans return $k rows for every query");
	my $r = recall($plain, $truth);
	cmp_ok($r, '>=', $floor{$pct},
		sprintf('%d%% filter: recall@%d against the exact filtered answer = %.3f (floor %.2f)',
			$pct, $k, $r, $floor{$pct}));

	# the batched join: the same rows in the same order
	my $plan = $node->safe_psql('postgres', qq{
		$index_only
		EXPLAIN (COSTS OFF) SELECT q.qid, n.id FROM queries q CROSS JOIN LATERAL (
			SELECT i.id FROM items i WHERE $filter ORDER BY i.v <-> q.v LIMIT $k) n});
	like($plan, qr/GpuivfBatchKnn/, "$pct%: the join is batched");
	my $batched = join_ids($filter, $index_only);
	is_deeply($batched, $plain, "$pct%: the batched join returns what the nested loop returns");
}

# deeper than every list with a filter nothing passes: no rows, no error; a
# bound on the lists visited gives fewer rows, never wrong ones
my $none = join_ids('i.cat < 0', $index_only);
is(scalar(keys %$none), 0, 'a filter no row passes returns no rows');
my $bounded = join_ids('i.cat < 1', "$index_only SET gpuivf.max_probes = 2; SET gpuivf.probes = 1;");
my $truth1 = join_ids('i.cat < 1', 'SET enable_indexscan = off; SET enable_bitmapscan = off;');
my %passes = map { $_ => 1 } split /\n/, $node->safe_psql('postgres', 'SELECT id FROM items WHERE cat < 1');
my ($too_many, $wrong) = (0, 0);
for my $qid (keys %$bounded)
{
	$too_many++ if scalar(@{ $bounded->{$qid} }) > $k;
	$wrong += grep { !$passes{$_} } @{ $bounded->{$qid} };
}
is($too_many, 0, 'gpuivf.max_probes = 2: never more than k rows');
is($wrong, 0, 'gpuivf.max_probes = 2: every row passes the filter');
note(sprintf('gpuivf.max_probes = 2, probes = 1, 1%% filter: %d of %d queries got %d rows, recall %.3f',
		scalar(grep { scalar(@{ $bounded->{$_} }) == $k } keys %$bounded), $nq, $k,
		recall($bounded, $truth1)));

$node->stop;
done_testing();
