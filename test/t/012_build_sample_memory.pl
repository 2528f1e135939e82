
# The training sample takes at most half of maintenance_work_mem.  When that
# keeps it below what the lists want (50 rows a list, at least 25,600),
# CREATE INDEX says so with a NOTICE whose HINT names the setting that gives
# the full sample, and that setting indeed gives it (no NOTICE).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use GpuivfTest;

my $node = gpuivf_node('build_sample_memory');
my $data = generate_data(rows => 40000, dims => 16, queries => 1, seed => 5);
load_vectors($node, 'items', $data->{base_copy});

my ($ret, $out, $err) = $node->psql('postgres',
	"SET maintenance_work_mem = '1MB'; SET client_min_messages = debug1; "
	  . 'CREATE INDEX items_small ON items USING gpuivf (v) WITH (lists = 600)');
is($ret, 0, 'CREATE INDEX with maintenance_work_mem = 1MB');
like($err, qr/NOTICE:  gpuivf index "items_small" is trained on a sample of \d+ rows, fewer than the 30000 its 600 lists want/,
	'a NOTICE says the sample is smaller than the lists want');
like($err, qr/DETAIL:  The training sample may take half of maintenance_work_mem \(1024 kB\)/,
	'its DETAIL says why');
my ($kb) = $err =~ /HINT:  Set maintenance_work_mem to at least (\d+) kB/;
ok(defined $kb, 'its HINT names a maintenance_work_mem');
my ($sampled) = $err =~ /sample scan [\d.]+ s \((\d+) rows sampled\)/;
cmp_ok($sampled, '<', 30000, "the build sampled $sampled rows");
$node->safe_psql('postgres', "SELECT gpuivf_verify('items_small', true); DROP INDEX items_small");

($ret, $out, $err) = $node->psql('postgres',
	"SET maintenance_work_mem = '${kb}kB'; SET client_min_messages = debug1; "
	  . 'CREATE INDEX items_full ON items USING gpuivf (v) WITH (lists = 600)');
is($ret, 0, "CREATE INDEX with the hinted maintenance_work_mem = ${kb}kB");
unlike($err, qr/is trained on a sample of/, 'no NOTICE: the hint was enough');
($sampled) = $err =~ /sample scan [\d.]+ s \((\d+) rows sampled\)/;
is($sampled, 30000, 'the build sampled the 30000 rows the lists want');

done_testing();
