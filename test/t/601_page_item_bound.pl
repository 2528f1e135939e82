
# No gpuivf page holds more line pointers than MaxIndexTuplesPerPage (408),
# the bound PostgreSQL's page routines size their arrays by.  Small entries
# would pass it: a list entry with a 1- or 2-byte code takes 8 bytes, and 680
# of those fit a page; PageIndexMultiDelete then overwrote VACUUM's stack
# (signal 11).  Every option combination that gives the smallest entries —
# dimensions 1 to 16, pq_m 1 to 4 (dividing the dimensions), pq_bits 4 and 8,
# rerank on and off — goes through a build, inserts, deletes, VACUUM and
# gpuivf_verify(index, true), which checks the line-pointer bound of every
# list and vector page.  One list per index, so its chain has full pages.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('page_item_bound', conf => "autovacuum = off\n");
my $rows = 1200;      # built: 1200 entries in one list (3 pages at 408)
my $more = 300;       # inserted afterwards

my @combos;
for my $dims (1 .. 16)
{
	my $table = "t$dims";
	$node->safe_psql('postgres', qq{
		CREATE TABLE $table (id int, v real[]);
		SELECT setseed(0.$dims);
		INSERT INTO $table SELECT g,
		  (SELECT array_agg((random() * 2 - 1)::real) FROM generate_series(1, $dims) WHERE g > 0)
		  FROM generate_series(1, $rows) g;
	});
	my @indexes;
	for my $pq_m (1 .. 4)
	{
		next if $dims % $pq_m;
		for my $bits (4, 8)
		{
			for my $rerank ('on', 'off')
			{
				my $name = "i${dims}_m${pq_m}_b${bits}_" . ($rerank eq 'on' ? 'r' : 'n');
				push @indexes, $name;
				push @combos, [ $table, $name ];
				$node->safe_psql('postgres', qq{
					SET gpuivf.analyze_sample = 0;
					CREATE INDEX $name ON $table USING gpuivf (v)
					  WITH (lists = 1, pq_m = $pq_m, pq_bits = $bits, rerank = $rerank);
				});
			}
		}
	}
	# inserts through every index of the table, then a third of the rows go
	$node->safe_psql('postgres', qq{
		INSERT INTO $table SELECT g,
		  (SELECT array_agg((random() * 2 - 1)::real) FROM generate_series(1, $dims) WHERE g > 0)
		  FROM generate_series($rows + 1, $rows + $more) g;
		INSERT INTO $table VALUES (0, NULL);
		DELETE FROM $table WHERE id % 3 = 0;
	});
	my ($rc, $out, $err) = $node->psql('postgres', "VACUUM $table");
	is($rc, 0, "VACUUM of the table with $dims dimensions (" . scalar(@indexes) . ' indexes) succeeds')
	  or diag $err;
}

my $failed = 0;
for my $c (@combos)
{
	my ($table, $name) = @$c;
	my ($rc, $out, $err) = $node->psql('postgres', "SELECT gpuivf_verify('$name', true)");
	if ($rc != 0)
	{
		$failed++;
		diag "gpuivf_verify($name): $err";
	}
}
is($failed, 0, 'gpuivf_verify(index, true) passes for all ' . scalar(@combos) . ' indexes');

# the indexes answer: the table's first index returns every live row
my $bad = 0;
for my $dims (1 .. 16)
{
	my $q = '{' . join(',', (0.1) x $dims) . '}';
	my $got = $node->safe_psql('postgres', qq{
		SET enable_seqscan = off; SET gpuivf.probes = 1;
		SELECT count(*) FROM (SELECT id FROM t$dims ORDER BY v <-> '$q' LIMIT 100000) s;
	});
	my $want = $node->safe_psql('postgres', "SELECT count(v) FROM t$dims");
	if ($got ne $want)
	{
		$bad++;
		diag "t$dims: $got rows through an index, $want in the table";
	}
}
is($bad, 0, 'an index scan of every table returns every live row');

$node->stop;
done_testing();
