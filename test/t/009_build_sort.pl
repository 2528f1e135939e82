
# CREATE INDEX orders each list's entries in memory (a counting sort on the
# list) when they fit in half of maintenance_work_mem, and through a
# tuplesort otherwise.  Both give the same index: with the same model (the
# sample fits both budgets, so training sees the same rows), the same list
# sizes and the same answers, ADC distances included.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('build_sort');
# 4 dimensions: the 25,600-row sample (48 bytes a row with the sample's
# bookkeeping: 1.3 MB) fits a 3 MB budget's half, the 80,000 entries (about
# 21 bytes each with the sort's order: 1.7 MB) do not.
my $data = generate_data(rows => 80000, dims => 4, queries => 20, seed => 21);
load_vectors($node, 'items', $data->{base_copy});
my $queries = read_fvecs($data->{query_fvecs});

my $ddl = 'CREATE INDEX %s ON items USING gpuivf (v) WITH (lists = 20, rerank = false)';

# Builds the index with maintenance_work_mem = $mem; returns how the build
# said it sorted its entries, the list sizes and the answers of all queries.
sub build_and_answer
{
	my ($name, $mem) = @_;
	my ($ret, $out, $err) = $node->psql('postgres',
		"SET maintenance_work_mem = '$mem'; SET client_min_messages = debug1; "
		  . sprintf($ddl, $name));
	is($ret, 0, "CREATE INDEX with maintenance_work_mem = $mem");
	my ($how) = $err =~ /entries sorted (in memory|by a tuplesort)/;
	my $sizes = list_sizes($node, $name, 20);
	my @answers;
	for my $q (@$queries)
	{
		my $lit = vec_literal($q);
		push @answers, $node->safe_psql('postgres',
			"SET enable_seqscan = off; SET gpuivf.probes = 20; "
			  . "SELECT string_agg(id || ':' || d, ' ') FROM "
			  . "(SELECT id, v <-> $lit AS d FROM items ORDER BY v <-> $lit LIMIT 10) s");
	}
	$node->safe_psql('postgres', "SELECT gpuivf_verify('$name', true)");
	pass("gpuivf_verify(…, true) passes on $name");
	$node->safe_psql('postgres', "DROP INDEX $name");
	return ($how // 'not reported', $sizes, \@answers);
}

my ($how_mem, $sizes_mem, $ans_mem) = build_and_answer('items_mem', '64MB');
my ($how_sort, $sizes_sort, $ans_sort) = build_and_answer('items_sort', '3MB');

is($how_mem, 'in memory', 'with 64 MB the entries are sorted in memory');
is($how_sort, 'by a tuplesort', 'with 3 MB they go through a tuplesort');
is($sizes_sort, $sizes_mem, 'both builds have the same list sizes');
is_deeply($ans_sort, $ans_mem, 'and give the same answers (ids and ADC distances) to 20 queries');

done_testing();
