
# Vector values are finite and at most 1e+15 in magnitude (gpuivf::
# kMaxComponent: below it no distance, norm, k-means or PQ sum can overflow
# float32 for up to 16,000 dimensions).  The rule is the same everywhere:
#  - the distance operators and functions (so ORDER BY on a sequential
#    scan), inserts into an index, CREATE INDEX and queries reject larger
#    values with SQLSTATE 22003, naming the element (also with lower bounds
#    other than 1), as NaN and infinities are rejected;
#  - values at the bound are accepted, train finite centroids and codebooks
#    (gpuivf_verify checks them), and every path — sequential scan, index
#    scan on the CPU, the GPU worker (CPU stand-in engine) — returns the
#    same rows with finite distances.
# The case that poisoned an index before: rows of 1e19 made CREATE INDEX
# write NaN codebooks, and the index returned the row at Infinity first.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $fake = fake_gpu_engine();
my $node = $fake ? fake_gpu_node('value_range', $fake) : gpuivf_node('value_range');
if ($fake)
{
	is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
		'ready', 'the worker is ready with the stand-in engine');
}

sub err_of
{
	my ($sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $sql, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return $rc == 0 ? "OK: $out" : $err;
}

# ------------------------------------------------------------ operators
for my $case (
	[ q{SELECT '{1e19}'::real[] <-> '{0}'}, '1e\+19', 1 ],
	[ q{SELECT '{0,0}'::real[] <#> '{1,-3e38}'}, '-3e\+38', 2 ],
	[ q{SELECT cosine_distance('[0:2]={1,2,1.0001e15}', '{0,0,1}')}, '1.0001e\+15', 2 ],
	[ q{SELECT l2_distance('[-5:-4]={-2e15,1}', '{0,0}')}, '-2e\+15', -5 ],
	[ q{SELECT inner_product('{1,1}', '{1,1e16}')}, '1e\+16', 2 ])
{
	my ($sql, $value, $element) = @$case;
	like(err_of($sql), qr/ERROR:  22003: vector value $value is out of range\nDETAIL:  Element $element of the array; vector values must lie between -1e\+15 and 1e\+15/,
		"$sql: 22003 naming value and element");
}
is(err_of(q{SELECT '{1e15,-1e15}'::real[] <-> '{-1e15,1e15}'}) =~ /^OK: 2\.828\d*e\+15$/ ? 1 : 0, 1,
	'values at the bound give a finite distance');
# their squares underflow to 0 in float32: an ordinary result, no error
is(err_of(q{SELECT '{1e-40,-0,1.4e-45}'::real[] <-> '{-0,0,0}'}), 'OK: 0',
	'denormals and -0 are ordinary values');
like(err_of(q{SELECT '{1,NaN}'::real[] <-> '{0,0}'}), qr/22000: vector must not contain NaN/, 'NaN keeps its error');

# ------------------------------------------------- the table from the report
$node->safe_psql('postgres', q{
	CREATE TABLE huge3 (id int, v real[]);
	SELECT setseed(0.3);
	INSERT INTO huge3 SELECT g, (SELECT array_agg((random()*2-1)::real) FROM generate_series(1,16) WHERE g>0)
	  FROM generate_series(1,1000) g;
	INSERT INTO huge3 VALUES (0, array_fill(1e19::real, array[16])), (-1, array_fill(-1e19::real, array[16]));
});
like(err_of(q{CREATE INDEX huge3_idx ON huge3 USING gpuivf (v) WITH (lists = 4)}),
	qr/22003: vector value 1e\+19 is out of range/, 'CREATE INDEX refuses the rows of 1e19');
like(err_of(q{SELECT id FROM huge3 ORDER BY v <-> array_fill(0.1::real, array[16]) LIMIT 3}),
	qr/22003: vector value -?1e\+19 is out of range/, 'ORDER BY on a sequential scan refuses them too');
$node->safe_psql('postgres', q{
	DELETE FROM huge3 WHERE id <= 0;
	CREATE INDEX huge3_idx ON huge3 USING gpuivf (v) WITH (lists = 4);
});
like(err_of(q{INSERT INTO huge3 VALUES (-2, array_fill(3e38::real, array[16]))}),
	qr/22003: vector value 3e\+38 is out of range/, 'an insert into the index refuses them');
like(err_of(q{SET enable_seqscan = off; SELECT id FROM huge3 ORDER BY v <-> array_fill(1e19::real, array[16]) LIMIT 3}),
	qr/22003: vector value 1e\+19 is out of range/, 'a query through the index refuses them');

# ------------------------------------------------- at the bound: finite and right
$node->safe_psql('postgres', q{
	INSERT INTO huge3 VALUES (0, array_fill(1e15::real, array[16])), (-1, array_fill(-1e15::real, array[16])),
	  (-2, array_cat(array_fill(1e15::real, array[8]), array_fill(-1e15::real, array[8])));
	INSERT INTO huge3 SELECT -2 - g, ARRAY(SELECT ((random()*2-1) * 1e15)::real FROM generate_series(1,16) WHERE g>0)
	  FROM generate_series(1, 200) g;
	REINDEX INDEX huge3_idx;
	CREATE INDEX huge3_ip ON huge3 USING gpuivf (v float4_ip_ops) WITH (lists = 4, pq_bits = 4);
	CREATE INDEX huge3_cos ON huge3 USING gpuivf (v float4_cosine_ops) WITH (lists = 4, rerank = false);
});
for my $idx ('huge3_idx', 'huge3_ip', 'huge3_cos')
{
	is(err_of("SELECT gpuivf_verify('$idx', true)"), 'OK: ', "$idx: trained on values at the bound, verifies (finite model)");
}
my %ops = (huge3_idx => '<->', huge3_ip => '<#>', huge3_cos => '<=>');
for my $q ('array_fill(0.1::real, array[16])', 'array_fill(-9e14::real, array[16])')
{
	for my $idx (sort keys %ops)
	{
		my $op = $ops{$idx};
		my $knn = "SELECT string_agg(id || ':' || (v $op $q), ',') FROM (SELECT id, v FROM huge3 ORDER BY v $op $q, id LIMIT 5) s";
		my $seq = err_of("SET enable_indexscan = off; SET enable_bitmapscan = off; $knn");
		unlike($seq, qr/Infinity|NaN/, "$idx, query $q: finite distances on a sequential scan");
		# exact mode (every list) re-ranks, so the index gives the sequential scan's rows
		my $cpu = err_of("SET gpuivf.device = cpu; SET enable_seqscan = off; SET gpuivf.probes = 4; $knn");
		is($cpu, $seq, "$idx, query $q: the index scan (exact mode) returns the sequential scan's rows")
		  if $idx ne 'huge3_cos';
		unlike($cpu, qr/Infinity|NaN/, "$idx, query $q: the index scan's distances are finite");
		next unless $fake;
		my $gpu = err_of("SET gpuivf.device = gpu; SET enable_seqscan = off; SET gpuivf.probes = 3; $knn");
		my $cpu3 = err_of("SET gpuivf.device = cpu; SET enable_seqscan = off; SET gpuivf.probes = 3; $knn");
		is($gpu, $cpu3, "$idx, query $q: the GPU worker answers 5 rows as the CPU does");
	}
}

$node->stop;
done_testing();
