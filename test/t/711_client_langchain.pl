
# gpuivf under LangChain.js: PGVectorStore (@langchain/community) creates its
# table with a vector(64) column, adds 2,000 documents and runs its own
# similarity-search SQL (cosine, bound parameters); with a gpuivf index on
# the column that SQL is answered by the index (EXPLAIN of the store's exact
# statement) and equals a sequential scan in exact mode
# (test/client/langchain_pgvector.mjs, deterministic embeddings, no network
# at run time).  Needs Node.js 20+, npm, a reachable npm registry for the
# pinned packages, and pgvector; skipped, with the reason, without them.

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

my $node = pgvector_node('client_langchain');
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[ 'node', "$dir/langchain_pgvector.mjs" ], '>', \$out, '2>', \$err,
	init => sub {
		$ENV{PGHOST} = $node->host;
		$ENV{PGPORT} = $node->port;
		$ENV{PGDATABASE} = 'postgres';
		delete $ENV{PGOPTIONS};
	});
ok($ok, 'the LangChain.js PGVectorStore program ran') or diag $err;
my $r = eval { decode_json($out) } // {};

like($r->{sql}, qr/<=>\s*\$1.*ORDER BY.*LIMIT \$2/s, 'the store searched with its own SQL (<=> $1 … LIMIT $2)');
like($r->{plan}, qr/"Index Name":\s*"documents_embedding_idx"/,
	'EXPLAIN of the store\'s statement, with its parameters, uses the gpuivf index');
is_deeply($r->{results}, [ (5) x 6 ], 'every similarity search returned 5 documents');
ok(!grep({ $_ < 3 } @{ $r->{topic_matches} // [0] }),
	'most documents found share the question\'s topic (' . join(',', @{ $r->{topic_matches} // [] }) . ' of 5)');
ok($r->{exact_equals_seqscan}, 'in exact mode the store gets the sequential scan\'s documents and scores');
ok($r->{verified}, 'gpuivf_verify(…, true) passes after the store\'s inserts');

$node->stop;
done_testing();
