
# Privileges of every SQL function and view of gpuivf, run as the table's
# owner, as a role with SELECT on the table only, and as a role with no
# rights on it:
#  - gpuivf_index_info, gpuivf_verify and gpuivf_worker_search (on a plain
#    and on a partitioned index) need SELECT on the index's table; without
#    it they fail with 42501 before locking anything, so a role without
#    rights neither waits for nor blocks the table's lockers (checked with
#    the table locked by another session and lock_timeout set);
#  - gpuivf_stat (view and function) and the distance functions and
#    operators are usable by every role (the pg_stat_statements convention:
#    the view holds worker state and counters, no table data);
#  - gpuivf_worker_search returns TIDs and exact distances, enough to
#    reconstruct vectors: a role without rights gets nothing from it.
# The GPU worker runs the CPU stand-in engine (test/gpu/fake_engine.cpp),
# so that gpuivf_worker_search answers for the roles allowed to call it.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $fake = fake_gpu_engine();
plan skip_all => 'the CPU stand-in of the GPU engine (make fake-gpu-engine) could not be built'
  unless $fake;

my $node = fake_gpu_node('privileges', $fake);
is(poll_until($node, "SELECT state FROM gpuivf_stat WHERE worker = 0", 'ready'),
	'ready', 'the worker is ready with the stand-in engine');

$node->safe_psql('postgres', q{
	CREATE ROLE owner_role LOGIN;
	CREATE ROLE reader LOGIN;
	CREATE ROLE nobody LOGIN;
	GRANT CREATE, USAGE ON SCHEMA public TO owner_role;
	SET ROLE owner_role;
	SELECT setseed(0.5);
}
	. grouped_items_sql(2000, 10, 0.3)
	. q{
	CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = 8);
	CREATE TABLE parts (id int, v real[]) PARTITION BY RANGE (id);
	CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (1000);
	CREATE TABLE parts_2 PARTITION OF parts FOR VALUES FROM (1000) TO (10000);
	INSERT INTO parts SELECT * FROM items;
	CREATE INDEX parts_v ON parts USING gpuivf (v) WITH (lists = 4);
	GRANT SELECT ON items, parts TO reader;
	RESET ROLE;
});

my $q = $node->safe_psql('postgres', 'SELECT v FROM items WHERE id = 7');
my %calls = (
	'gpuivf_index_info(items_v)' => q{SELECT gpuivf_index_info('items_v') IS NOT NULL},
	'gpuivf_verify(items_v)' => q{SELECT true FROM gpuivf_verify('items_v')},
	'gpuivf_verify(items_v, true)' => q{SELECT true FROM gpuivf_verify('items_v', true)},
	'gpuivf_worker_search(items_v)' =>
	  qq{SELECT count(*) = 5 FROM gpuivf_worker_search('items_v', '$q', 5, 3)},
	'gpuivf_index_info(parts_v)' => q{SELECT gpuivf_index_info('parts_v') IS NOT NULL},
	'gpuivf_verify(parts_v, true)' => q{SELECT true FROM gpuivf_verify('parts_v', true)},
	'gpuivf_worker_search(parts_1_v_idx)' =>
	  qq{SELECT count(*) = 5 FROM gpuivf_worker_search('parts_1_v_idx', '$q', 5, 3)},
);
my %public = (
	'gpuivf_stat (view)' => q{SELECT count(*) = 1 FROM gpuivf_stat WHERE state = 'ready'},
	'gpuivf_stat()' => q{SELECT count(*) = 1 FROM gpuivf_stat()},
	'l2_distance' => q{SELECT l2_distance('{3,4}', '{0,0}') = 5},
	'inner_product' => q{SELECT inner_product('{3,4}', '{1,1}') = 7},
	'negative_inner_product' => q{SELECT negative_inner_product('{3,4}', '{1,1}') = -7},
	'cosine_distance' => q{SELECT cosine_distance('{1,0}', '{0,1}') = 1},
	'operators' => q{SELECT '{3,4}'::real[] <-> '{0,0}' = 5 AND '{3,4}'::real[] <#> '{1,1}' = -7
		AND '{1,0}'::real[] <=> '{0,1}' = 1},
);

# runs $sql as $role; returns (ok, output or error)
sub as_role
{
	my ($role, $sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', "SET ROLE $role; $sql",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return ($rc == 0, $rc == 0 ? $out : $err);
}

for my $role ('owner_role', 'reader')
{
	for my $name (sort keys %calls, sort keys %public)
	{
		my ($ok, $out) = as_role($role, $calls{$name} // $public{$name});
		# a partition is read through its partitioned table; its own index,
		# called directly, needs SELECT on the partition (PostgreSQL's rule)
		if ($role eq 'reader' && $name =~ /parts_1_v_idx/)
		{
			ok(!$ok && $out =~ /42501: permission denied for table parts_1\b/,
				"$role: $name needs SELECT on the partition itself") or diag $out;
			next;
		}
		ok($ok && $out eq 't', "$role: $name works") or diag $out;
	}
}
for my $name (sort keys %calls)
{
	my ($ok, $out) = as_role('nobody', $calls{$name});
	ok(!$ok && $out =~ /ERROR:  42501: permission denied for table (items|parts|parts_1)\b/,
		"nobody: $name fails with 42501 permission denied")
	  or diag $out;
}
for my $name (sort keys %public)
{
	my ($ok, $out) = as_role('nobody', $public{$name});
	ok($ok && $out eq 't', "nobody: $name works") or diag $out;
}

# ---------------- the check comes before any lock: a locked table answers at once
my ($in, $out, $err) = ('', '', '');
my $locker = IPC::Run::start(
	[ 'psql', '-XAtq', '-h', $node->host, '-p', $node->port, '-d', 'postgres', '-f', '-' ],
	'<', \$in, '>', \$out, '2>', \$err);
$in .= "BEGIN; LOCK TABLE items, parts IN ACCESS EXCLUSIVE MODE; SELECT 'locked';\n";
$locker->pump until $out =~ /locked/;
for my $name (sort keys %calls)
{
	my ($ok, $res) = as_role('nobody', "SET lock_timeout = '5s'; $calls{$name}");
	ok(!$ok && $res =~ /42501: permission denied/,
		"nobody: $name is refused without waiting for the table's lock")
	  or diag $res;
}
$in .= "ROLLBACK;\n\\q\n";
$locker->finish;

$node->stop;
done_testing();
