
# GpuivfTest.pm — shared helpers for gpuivf's TAP tests (test/t/*.pl).
#
# A test creates a node with the extension, generates clustered data with
# test/tools/gpuivf_gen (or converts ../shared/data files), loads it with COPY,
# asks kNN queries and compares them with exact ground truth from gpuivf_gt.
# Everything runs on the node's Unix socket; nothing talks to the network.
#
# Tables made by load_vectors() have the columns (id bigint, v real[]); ids are
# the 0-based row numbers of the generated/converted file, as in .ivecs ground
# truth files.

package GpuivfTest;

use strict;
use warnings;

use Carp;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Copy ();
use File::Path ();
use File::Spec;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use Exporter 'import';
our @EXPORT = qw(
  gpuivf_node tool_path generate_data convert_data load_vectors ground_truth
  read_fvecs read_ivecs vec_literal knn_ids recall_at index_info index_lists list_sizes
  model_digest
  exact_settings assert_index_scan shared_data_dir start_pgbench finish_pgbench
  metric_operator metric_opclass count_via_index poll_until fake_gpu_engine fake_gpu_node
  fake_gpu_primary_standby worker_stat
  wait_worker_ready worker_syncs
  grouped_items_sql worker_knn_pgbench insert_find_script knn_answer count_same pgvector_missing pgvector_node node_client_dir
);

# The repository root: this file is test/perl/GpuivfTest.pm.
sub repo_root
{
	return abs_path(File::Spec->catdir(dirname(__FILE__), '..', '..'));
}

# Path to one of the test tools (gpuivf_gen, gpuivf_gt); builds them with
# CMake into build/ when they are missing.  GPUIVF_TOOLS_DIR overrides.
sub tool_path
{
	my ($name) = @_;
	my $dir = $ENV{GPUIVF_TOOLS_DIR}
	  // File::Spec->catdir(repo_root(), 'build', 'test', 'tools');
	my $path = File::Spec->catfile($dir, $name);
	return $path if -x $path;

	my $root = repo_root();
	my $build = File::Spec->catdir($root, 'build');
	note "building the test tools in $build";
	system('cmake', '-S', $root, '-B', $build, '-DCMAKE_BUILD_TYPE=Release') == 0
	  && system('cmake', '--build', $build, '--target', 'gpuivf_tools', '-j2') == 0
	  or BAIL_OUT("cannot build the test tools (cmake in $build failed)");
	BAIL_OUT("test tool $path was not built") unless -x $path;
	return $path;
}

# A started node with CREATE EXTENSION gpuivf done in database "postgres".
# Options: allows_streaming => 1, conf => "extra postgresql.conf lines".
sub gpuivf_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(allows_streaming => $opts{allows_streaming} // 0);
	$node->append_conf('postgresql.conf', qq(
shared_buffers = 128MB
maintenance_work_mem = 256MB
max_wal_size = 1GB
fsync = off
log_min_messages = warning
log_line_prefix = '%m [%p] %q%a '
));
	$node->append_conf('postgresql.conf', $opts{conf}) if $opts{conf};
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION gpuivf');
	return $node;
}

sub run_tool
{
	my (@cmd) = @_;
	my ($out, $err);
	IPC::Run::run(\@cmd, '>', \$out, '2>', \$err)
	  or croak "command failed: @cmd\n$err";
	return $out;
}

# Generates clustered data into a fresh temporary directory.
#   rows, dims, queries, seed, clusters (optional), null_every (optional),
#   query_options => [ '--query-shift', 1.5, ... ] (queries from another
#   distribution than the rows: gpuivf_gen --help)
# Returns { dir, base_copy, base_fvecs, query_fvecs, query_copy, rows, dims,
# queries }.  base_copy and query_copy are text COPY input for
# (id bigint, v real[]); query ids are 0-based query numbers.
sub generate_data
{
	my (%o) = @_;
	my $dir = abs_path(PostgreSQL::Test::Utils::tempdir('gpuivf_data'));
	my $gen = tool_path('gpuivf_gen');
	my %d = (
		dir => $dir,
		rows => $o{rows},
		dims => $o{dims},
		queries => $o{queries} // 0,
		base_copy => "$dir/base.copy",
		base_fvecs => "$dir/base.fvecs",
		query_fvecs => "$dir/query.fvecs",
		query_copy => "$dir/query.copy");
	my @cmd = (
		$gen, '--rows', $o{rows}, '--dims', $o{dims},
		'--queries', $d{queries}, '--seed', $o{seed} // 42,
		'--base', $d{base_copy}, '--query', $d{query_fvecs}, '--query', $d{query_copy});
	push @cmd, '--clusters', $o{clusters} if $o{clusters};
	push @cmd, @{ $o{query_options} } if $o{query_options};
	# fvecs cannot hold NULL rows: with null_every only the COPY file is
	# written and ground truth is not available for it.
	if ($o{null_every})
	{
		push @cmd, '--null-every', $o{null_every};
		delete $d{base_fvecs};
	}
	else
	{
		push @cmd, '--base', $d{base_fvecs};
	}
	run_tool(@cmd);
	return \%d;
}

# Converts an .fvecs/.bvecs file to text COPY input in a temporary directory.
sub convert_data
{
	my ($input, %o) = @_;
	my $dir = abs_path(PostgreSQL::Test::Utils::tempdir('gpuivf_data'));
	my $out = "$dir/base.copy";
	my @cmd = (tool_path('gpuivf_gen'), '--input', $input, '--base', $out);
	push @cmd, '--limit', $o{limit} if $o{limit};
	run_tool(@cmd);
	return $out;
}

# CREATE TABLE (unless it exists) and COPY a file made by generate_data or
# convert_data into it (server-side COPY: the node runs as this user).
sub load_vectors
{
	my ($node, $table, $copy_file, %o) = @_;
	my $db = $o{dbname} // 'postgres';
	my $unlogged = $o{unlogged} ? 'UNLOGGED' : '';
	$node->safe_psql($db,
		"CREATE $unlogged TABLE IF NOT EXISTS $table (id bigint, v real[])")
	  unless $o{no_create};
	my $format = $copy_file =~ /\.(bin|pgcopy)$/ ? 'binary' : 'text';
	$node->safe_psql($db,
		"COPY $table (id, v) FROM '$copy_file' WITH (FORMAT $format)");
	return;
}

# Exact top-k ids (0-based rows) of every query: arrayref of arrayrefs.
sub ground_truth
{
	my ($base_fvecs, $query_fvecs, $k, $metric) = @_;
	my $dir = abs_path(PostgreSQL::Test::Utils::tempdir('gpuivf_gt'));
	my $out = "$dir/gt.ivecs";
	run_tool(
		tool_path('gpuivf_gt'), '--base', $base_fvecs, '--query', $query_fvecs,
		'--k', $k, '--metric', $metric // 'l2', '--out', $out);
	return read_ivecs($out);
}

sub slurp_raw
{
	my ($path) = @_;
	open my $fh, '<:raw', $path or croak "cannot open $path: $!";
	local $/;
	my $s = <$fh>;
	close $fh;
	return $s;
}

# .fvecs (or .bvecs) file as an arrayref of arrayrefs of numbers.
sub read_fvecs
{
	my ($path, $limit) = @_;
	my $s = slurp_raw($path);
	my $bytes = $path =~ /\.bvecs$/;
	my ($pos, @rows) = (0);
	while ($pos < length $s)
	{
		my $d = unpack('l<', substr($s, $pos, 4));
		my $w = $bytes ? $d : 4 * $d;
		my @x = unpack($bytes ? "C$d" : "f<$d", substr($s, $pos + 4, $w));
		push @rows, \@x;
		$pos += 4 + $w;
		last if $limit && @rows >= $limit;
	}
	return \@rows;
}

# .ivecs file as an arrayref of arrayrefs of ids.
sub read_ivecs
{
	my ($path) = @_;
	my $s = slurp_raw($path);
	my ($pos, @rows) = (0);
	while ($pos < length $s)
	{
		my $k = unpack('l<', substr($s, $pos, 4));
		push @rows, [ unpack("l<$k", substr($s, $pos + 4, 4 * $k)) ];
		$pos += 4 + 4 * $k;
	}
	return \@rows;
}

# SQL literal of a float4 vector; 9 significant digits read back to the
# same float4.  $type: real[] (default), or pgvector's vector or halfvec
# (a halfvec literal rounds each value to half precision).
sub vec_literal
{
	my ($x, $type) = @_;
	my $values = join(',', map { sprintf('%.9g', $_) } @$x);
	return "'{$values}'::real[]" if !$type || $type eq 'real[]';
	return "'[$values]'::$type";
}

sub metric_operator
{
	my ($metric) = @_;
	return { l2 => '<->', ip => '<#>', cosine => '<=>' }->{$metric}
	  // croak "unknown metric $metric";
}

sub metric_opclass
{
	my ($metric) = @_;
	return { l2 => 'float4_l2_ops', ip => 'float4_ip_ops',
		cosine => 'float4_cosine_ops' }->{$metric}
	  // croak "unknown metric $metric";
}

# Settings that make the planner take the index for ORDER BY without LIMIT.
sub exact_settings
{
	return 'SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off;';
}

# The k nearest ids of each query by the index, in one psql session.
#   settings => "SET ...;"  (e.g. gpuivf.probes), column => 'v', dbname,
#   type => 'vector' | 'halfvec' (the queries' type; default real[]),
#   seqscan => 1 (no index: a sequential scan and sort)
# Returns an arrayref (one arrayref of ids per query).
sub knn_ids
{
	my ($node, $table, $metric, $queries, $k, %o) = @_;
	my $op = metric_operator($metric);
	my $col = $o{column} // 'v';
	my $sql = ($o{seqscan} ? 'SET enable_indexscan = off; SET enable_bitmapscan = off;'
		: exact_settings()) . ($o{settings} // '') . "\n";
	for my $q (@$queries)
	{
		$sql .=
		  "SELECT ARRAY(SELECT id FROM $table ORDER BY $col $op "
		  . vec_literal($q, $o{type})
		  . " LIMIT $k);\n";
	}
	my $out = $node->safe_psql($o{dbname} // 'postgres', $sql);
	my @rows;
	for my $line (split /\n/, $out)
	{
		next unless $line =~ /^\{(.*)\}$/;
		push @rows, [ length($1) ? split(/,/, $1) : () ];
	}
	croak "expected " . scalar(@$queries) . " result rows, got " . scalar(@rows)
	  unless @rows == @$queries;
	return \@rows;
}

# Mean recall@k of result id lists against ground truth id lists.
sub recall_at
{
	my ($results, $truth, $k) = @_;
	my ($hits, $n) = (0, 0);
	for my $i (0 .. $#$results)
	{
		my %want = map { $_ => 1 } @{ $truth->[$i] }[ 0 .. $k - 1 ];
		$hits += grep { $want{$_} } @{ $results->[$i] }[ 0 .. $k - 1 ];
		$n += $k;
	}
	return $n ? $hits / $n : 0;
}

# gpuivf_index_info as a hash (flat keys; list_size as list_size_min etc.).
sub index_info
{
	my ($node, $index, $db) = @_;
	my $out = $node->safe_psql($db // 'postgres',
		"SELECT key, value FROM jsonb_each_text(gpuivf_index_info('$index'))");
	my %info;
	for my $line (split /\n/, $out)
	{
		my ($key, $value) = split /\|/, $line, 2;
		$info{$key} = $value;
	}
	if (defined $info{list_size} && $info{list_size} =~ /^\{/)
	{
		while ($info{list_size} =~ /"(\w+)":\s*([-\d.e+]+)/g)
		{
			$info{"list_size_$1"} = $2;
		}
	}
	return \%info;
}

# The $k nearest rows of $table to the vector literal $q as
# "id:distance,..." (nearest first, ties by id), for comparing answers
# between tables, servers and engines:
#   settings => "SET ...;", where => "tenant_id = 2", dbname
sub knn_answer
{
	my ($node, $table, $q, $k, %o) = @_;
	my $where = $o{where} ? "WHERE $o{where}" : '';
	return $node->safe_psql($o{dbname} // 'postgres', ($o{settings} // '') . qq{
		SELECT string_agg(id || ':' || d, ',' ORDER BY d, id) FROM (
			SELECT id, v <-> $q AS d FROM $table $where ORDER BY v <-> $q LIMIT $k) s});
}

# For i in 0 .. $n - 1, compares $fa->(i) with $fb->(i): (how many were
# equal, the first difference) — e.g. two knn_answer()s per query.
sub count_same
{
	my ($n, $fa, $fb) = @_;
	my ($same, $diff) = (0, '');
	for my $i (0 .. $n - 1)
	{
		my ($a, $b) = ($fa->($i), $fb->($i));
		if ($a eq $b) { $same++ }
		elsif ($diff eq '') { $diff = "query $i: $a vs $b" }
	}
	return ($same, $diff);
}

# Number of lists of an index (what gpuivf.probes must be for exact mode).
sub index_lists
{
	my ($node, $index, $db) = @_;
	return $node->safe_psql($db // 'postgres',
		"SELECT (gpuivf_index_info('$index')->>'lists')::int");
}

# The sizes of lists 0 .. $lists - 1 of an index, as "n0,n1,...": two builds
# of the same data compare equal when they filled their lists alike.
sub list_sizes
{
	my ($node, $index, $lists) = @_;
	my $info = index_info($node, $index);
	return join ',', map { $info->{"list_size_$_"} // 'none' } 0 .. $lists - 1;
}

# md5 of the model pages of an index (centroids, then codebooks: their
# contents past the page header, located by the metapage's centroid_start/
# pages and codebook_start/pages at offsets 56..71 of GpuivfMetaPageData):
# two builds compare equal when they trained the same model bit for bit.
# Needs the pageinspect extension in the database.
sub model_digest
{
	my ($node, $index, $db) = @_;
	return $node->safe_psql($db // 'postgres', qq{
		WITH m AS (SELECT get_raw_page('$index', 0) AS p),
		     f AS (SELECT (SELECT sum(get_byte(p, o + i) * (256::bigint ^ i)) FROM generate_series(0, 3) i)::bigint AS v, o
		           FROM m, unnest(ARRAY[24 + 56, 24 + 60, 24 + 64, 24 + 68]) o),
		     r AS (SELECT max(v) FILTER (WHERE o = 80) AS cs, max(v) FILTER (WHERE o = 84) AS cp,
		                  max(v) FILTER (WHERE o = 88) AS bs, max(v) FILTER (WHERE o = 92) AS bp FROM f)
		SELECT cp || ' + ' || bp || ' pages, md5 ' || md5(string_agg(substring(get_raw_page('$index', b::int) FROM 25), ''::bytea ORDER BY b))
		FROM r, LATERAL (SELECT generate_series(cs, cs + cp - 1) UNION ALL SELECT generate_series(bs, bs + bp - 1)) g(b)
		GROUP BY cp, bp});
}

# Asserts that a query is answered by an index scan on $index.
sub assert_index_scan
{
	my ($node, $index, $query, $settings, $name, $db) = @_;
	my $plan = $node->safe_psql($db // 'postgres',
		exact_settings() . ($settings // '') . " EXPLAIN (COSTS OFF) $query");
	like($plan, qr/Index Scan using $index\b/, $name)
	  or diag($plan);
	return;
}

# How many rows an index scan without LIMIT returns (and how many distinct
# ids), ordering by $op against the vector $qlit: every indexed row must be
# reachable through the index.
sub count_via_index
{
	my ($node, $table, $metric, $qlit, $settings, $db) = @_;
	my $op = metric_operator($metric);
	my $out = $node->safe_psql($db // 'postgres',
		exact_settings() . ($settings // '')
		  . " SELECT count(*), count(DISTINCT id) FROM (SELECT id FROM $table ORDER BY v $op $qlit) s");
	my @r = split /\|/, $out;
	return @r;
}

# Where ../shared/data is (GPUIVF_DATA_DIR overrides); undef when absent.
sub shared_data_dir
{
	my $dir = $ENV{GPUIVF_DATA_DIR}
	  // File::Spec->catdir(repo_root(), '..', 'shared', 'data');
	return -d $dir ? abs_path($dir) : undef;
}

# Polls $sql on $node every 0.1 s until it returns $expected (at most 30 s);
# returns the last value seen, so the caller's is() shows what it was.
sub poll_until
{
	my ($node, $sql, $expected) = @_;
	my $got = '';
	for (1 .. 300)
	{
		$got = $node->safe_psql('postgres', $sql);
		return $got if $got eq $expected;
		usleep(100_000);
	}
	return $got;
}

# SQL creating table items (id int, v real[]) of $rows rows of 16 dimensions
# whose row i lies near (i % $groups) * $step (+ $shift) with uniform noise:
# small clustered data for the worker tests (run after setseed, in the same
# statement list, for the same rows every time).
sub grouped_items_sql
{
	my ($rows, $groups, $step, $shift) = @_;
	my $offset = defined $shift ? " - $shift" : '';
	return "CREATE TABLE items (id int, v real[]);\n"
	  . "INSERT INTO items\n"
	  . "SELECT i, ARRAY(SELECT ((i % $groups) * $step + random()$offset)::real "
	  . "FROM generate_series(1, 16) WHERE i > 0)\n"
	  . "FROM generate_series(1, $rows) i;\n";
}

# The CPU stand-in of the GPU engine (test/gpu/fake_engine.cpp) that lets the
# worker tests run without a GPU: its path, built on demand, or undef.
sub fake_gpu_engine
{
	my $root = repo_root();
	my $fake = "$root/build/gpuivf_fake_gpu.so";
	system("make -s -C '$root' fake-gpu-engine >/dev/null 2>&1") unless -f $fake;
	return -f $fake ? $fake : undef;
}

# A started node whose GPU workers run the CPU stand-in engine $fake;
# $extra_conf adds settings (gpuivf.devices, max_connections, ...);
# allows_streaming => 1 makes it a primary a standby can stream from.
sub fake_gpu_node
{
	my ($name, $fake, $extra_conf, %opts) = @_;
	return gpuivf_node($name, allows_streaming => $opts{allows_streaming}, conf => qq(
shared_preload_libraries = 'gpuivf'
gpuivf.engine_library = '$fake'
log_min_messages = log
restart_after_crash = on
jit = off
autovacuum = off
) . ($extra_conf // ''));
}

# A primary ($primary_conf added) and its streaming hot standby (logging at
# DEBUG1, for worker_syncs), both with GPU workers running the CPU stand-in
# engine $fake, started; one test each that its worker is ready.
sub fake_gpu_primary_standby
{
	my ($fake, $primary_conf) = @_;
	my $primary = fake_gpu_node('primary', $fake, $primary_conf, allows_streaming => 1);
	$primary->backup('base');
	my $standby = PostgreSQL::Test::Cluster->new('standby');
	$standby->init_from_backup($primary, 'base', has_streaming => 1);
	$standby->append_conf('postgresql.conf', "log_min_messages = debug1\n");
	$standby->start;
	for my $node ($primary, $standby)
	{
		Test::More::is(poll_until($node, 'SELECT state FROM gpuivf_stat WHERE worker = 0', 'ready'),
			'ready', $node->name . ': the GPU worker is ready');
	}
	return ($primary, $standby);
}

# One column of gpuivf_stat for GPU worker $worker (default 0).
sub worker_stat
{
	my ($node, $col, $worker) = @_;
	$worker //= 0;
	return $node->safe_psql('postgres', "SELECT $col FROM gpuivf_stat WHERE worker = $worker");
}

# The loads and catch-ups of GPU copies that the workers of $node logged
# (DEBUG1, log_min_messages = debug1) after byte $from of its log: an
# arrayref of hashes (kind "loaded" or "caught up", entries, pages, walked and
# lists: lists walked of the copy's lists, from_start_page: of those, the
# lists read from their start page on, removed: entries removed first,
# inserts_only: "yes", "no" or "-" for a load; by_generation: whether the
# metapage generation alone says only inserts happened, "-" for a load).
sub worker_syncs
{
	my ($node, $from) = @_;
	my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile, $from // 0);
	my @s;
	while ($log =~
		/GPU worker (loaded|caught up) index \d+: (\d+) entries of (\d+) list pages .*?; walked (\d+) of (\d+) lists \((\d+) from their start page\), (\d+) entries removed first \(only inserts: ([-a-z]+); by the generation: ([-a-z]+)/g
	  )
	{
		push @s,
		  {
			kind => $1, entries => $2, pages => $3, walked => $4, lists => $5,
			from_start_page => $6, removed => $7, inserts_only => $8, by_generation => $9
		  };
	}
	return \@s;
}

# Polls until GPU worker 0 (one other than pid $old_pid, when given) is
# ready, at most 60 s; tolerates connection failures while the cluster
# restarts.  Returns the last state seen ('ready' on success).
sub wait_worker_ready
{
	my ($node, $old_pid) = @_;
	my $cond = defined $old_pid ? "AND pid <> $old_pid" : '';
	my $got = '';
	for (1 .. 600)
	{
		my $out = '';
		$got = $node->psql('postgres', "SELECT state FROM gpuivf_stat WHERE worker = 0 $cond",
			stdout => \$out) == 0 ? $out : '';
		return $got if $got eq 'ready';
		usleep(100_000);
	}
	return $got;
}

# Starts pgbench in the background against a node; returns a handle for
# finish_pgbench.  $scripts: { name => sql text, ... } (with @weight suffix
# in the name, as "insert@5").
sub start_pgbench
{
	my ($node, $opts, $scripts, $db) = @_;
	my $dir = abs_path(PostgreSQL::Test::Utils::tempdir('gpuivf_pgbench'));
	my @files;
	for my $name (sort keys %$scripts)
	{
		my ($base, $weight) = split /@/, $name;
		my $file = "$dir/$base.sql";
		PostgreSQL::Test::Utils::append_to_file($file, $scripts->{$name});
		push @files, '-f', $file . (defined $weight ? "\@$weight" : '');
	}
	my %h = (out => '', err => '');
	my @cmd = (
		'pgbench', '-n', '-h', $node->host, '-p', $node->port,
		split(/\s+/, $opts), @files, $db // 'postgres');
	note "starting: @cmd";
	$h{run} = IPC::Run::start(\@cmd, '>', \$h{out}, '2>', \$h{err});
	return \%h;
}

# Waits for a background pgbench; returns (exit status, stdout, stderr).
sub finish_pgbench
{
	my ($h) = @_;
	$h->{run}->finish;
	return ($h->{run}->result(0), $h->{out}, $h->{err});
}

# A pgbench script (for start_pgbench) that inserts a row into table items
# near the row whose id the SQL expression $base gives (of :k, the new row's
# id from sequence $seq), commits, and asks for the row nearest its own
# vector: the client fails unless that is the new row.
sub insert_find_script
{
	my ($seq, $base) = @_;
	return qq{SELECT nextval('$seq') AS k \\gset
INSERT INTO items SELECT :k, ARRAY(SELECT (x + 0.0001 * (:k % 997 + 1))::real FROM unnest(v) x) FROM items WHERE id = $base;
SELECT id AS got FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = :k) LIMIT 1 \\gset
\\if :got != :k
SELECT 'the committed row was not the next GPU query''s answer'::int;
\\endif
};
}

# Eight pgbench clients for 3 s through the GPU worker, each statement the
# 5 nearest rows of table items to a random row (ids 1 .. $rows) at $probes
# probes; returns pgbench's exit status and stderr, and the queries and
# batches gpuivf_stat counted meanwhile.
sub worker_knn_pgbench
{
	my ($node, $rows, $probes) = @_;
	my $counts = sub {
		return split /\|/, $node->safe_psql('postgres', 'SELECT queries, batches FROM gpuivf_stat');
	};
	my ($q0, $b0) = $counts->();
	my $bench = start_pgbench(
		$node, '-c 8 -j 4 -T 3',
		{ knn => qq{\\set id random(1, $rows)
SET gpuivf.device = gpu;
SET gpuivf.probes = $probes;
SET enable_seqscan = off;
SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = :id LIMIT 1) LIMIT 5;
} });
	my ($rc, $out, $err) = finish_pgbench($bench);
	my ($q1, $b1) = $counts->();
	return ($rc, $err, $q1 - $q0, $b1 - $b0);
}

# Why pgvector (the `vector` extension) cannot be used by this PostgreSQL,
# or undef when it can: the tests on pgvector's types skip themselves with
# this reason.  scripts/test.sh builds pgvector from ../shared/vendor when it
# can and passes its reason for not doing so in PGVECTOR_MISSING.
sub pgvector_missing
{
	my ($sharedir) = run_tool('pg_config', '--sharedir') =~ /^(.*?)\s*$/;
	return undef if -f "$sharedir/extension/vector.control";
	return $ENV{PGVECTOR_MISSING}
	  // "pgvector (the vector extension) is not installed in $sharedir: install "
	  . 'postgresql-15-pgvector, or run scripts/test.sh, which builds it from ../shared/vendor';
}

# gpuivf_node with CREATE EXTENSION gpuivf_vector CASCADE (pgvector's vector
# and the operator classes) done too; the caller checked pgvector_missing.
sub pgvector_node
{
	my ($name, %opts) = @_;
	my $node = gpuivf_node($name, %opts);
	$node->safe_psql('postgres', 'CREATE EXTENSION gpuivf_vector CASCADE');
	return $node;
}

# The client programs of test/client with their npm packages installed
# (`npm ci`, versions pinned by test/client/package-lock.json) into a
# directory outside the source tree's tracked files: $GPUIVF_NODE_CLIENT_DIR,
# else tmp_check/node_client.  Reused while the lock file is unchanged.
# Returns (dir, undef), or (undef, why) when node/npm are absent or the
# packages cannot be installed (no network to the npm registry).
sub node_client_dir
{
	for my $tool ('node', 'npm')
	{
		return (undef, "$tool is not installed (the client tests need Node.js 20 or later and npm)")
		  unless grep { -x "$_/$tool" } split /:/, $ENV{PATH};
	}
	my ($version) = run_tool('node', '--version') =~ /^v(\d+)/;
	return (undef, "node $version is too old (the client tests need Node.js 20 or later)")
	  if $version < 20;
	my $src = File::Spec->catdir(repo_root(), 'test', 'client');
	my $dir = $ENV{GPUIVF_NODE_CLIENT_DIR}
	  // File::Spec->catdir(repo_root(), 'tmp_check', 'node_client');
	my $lock = slurp_raw("$src/package-lock.json");
	my $stamp = "$dir/.installed-lock";
	if (!-f $stamp || slurp_raw($stamp) ne $lock)
	{
		File::Path::make_path($dir);
		unlink $stamp;
		for my $f (glob("$src/*"))
		{
			File::Copy::copy($f, $dir) or croak "cannot copy $f to $dir: $!";
		}
		note "installing the client packages into $dir (npm ci)";
		my ($out, $err) = ('', '');
		my $ok = IPC::Run::run([ 'npm', 'ci', '--no-audit', '--no-fund', '--loglevel=error' ],
			'>', \$out, '2>', \$err, init => sub { chdir $dir or die "chdir $dir: $!" });
		if (!$ok)
		{
			note $err;
			return (undef, 'npm ci of test/client/package-lock.json failed (is the npm registry reachable?)');
		}
		PostgreSQL::Test::Utils::append_to_file($stamp, $lock);
	}
	else
	{
		# the programs may have changed without the lock file
		File::Copy::copy($_, $dir) for glob("$src/*.mjs");
	}
	return ($dir, undef);
}

1;
