
# gpuivf driven by real client libraries, as an application drives pgvector:
# node-postgres (`pg`) with pgvector-node (`pgvector`) creates a vector(32)
# table, inserts with pgvector.toSql and bound parameters, creates a gpuivf
# index and queries ORDER BY embedding <-> $1 LIMIT $2
# (test/client/node_pg.mjs).  Needs Node.js 20+, npm and a reachable npm
# registry (the packages are pinned by test/client/package-lock.json), and
# pgvector; skipped, with the reason, without them.

use strict;
use warnings;

use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $why = pgvector_missing();
plan skip_all => $why if $why;
my ($dir, $no_node) = node_client_dir();
plan skip_all => $no_node if $no_node;

my $node = pgvector_node('client_pg');
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[ 'node', "$dir/node_pg.mjs" ], '>', \$out, '2>', \$err,
	init => sub {
		$ENV{PGHOST} = $node->host;
		$ENV{PGPORT} = $node->port;
		$ENV{PGDATABASE} = 'postgres';
		delete $ENV{PGOPTIONS};
	});
ok($ok, 'the node-postgres + pgvector-node application ran') or diag $err;
my $r = eval { decode_json($out) } // {};

like($r->{plan}, qr/"Index Name":\s*"items_embedding_idx"/,
	'the bound-parameter query ORDER BY embedding <-> $1 LIMIT $2 is planned on the gpuivf index');
like($r->{plan}, qr/"Node Type":\s*"Limit"/, 'with its LIMIT above it');
is($r->{rows_returned}, 25 * 10, 'every query returned its LIMIT of rows');
cmp_ok($r->{recall} // 0, '>=', 0.9, "recall\@10 with the automatic probes ($r->{recall})");
ok($r->{exact_equals_seqscan}, 'exact mode (probes = lists) returns the sequential scan\'s rows in its order');
ok($r->{distances_ascending}, 'rows come in ascending order of pgvector\'s <-> as the client reads it');
ok($r->{embeddings_round_trip}, 'vectors inserted with toSql come back through registerTypes unchanged');
ok($r->{fresh_row_found}, 'a row inserted after CREATE INDEX is found by the next query, at distance 0');
is($r->{index_info}{dims}, 32, 'gpuivf_index_info reports the vector(32) column\'s dimensions');
ok($r->{verified}, 'gpuivf_verify(…, true) passes after the application\'s writes');

$node->stop;
done_testing();
