#!/bin/bash
# Concurrent inserts into a trained gpuivf index, and single-client kNN, for
# one or more builds of gpuivf side by side (each an installation's
# pg_config): a cluster per build, the same data, and rounds that interleave
# the builds, so that every build runs in the same window of a shared
# machine; the best of ROUNDS is reported for each.
#
#   PG_CONFIGS="/old/bin/pg_config /new/bin/pg_config" bash test/bench/insert_clients.sh
#
# Each round and build: one client runs kNN queries (LIMIT 10, automatic
# probes) for BENCH_S on a copy of the rows that does not grow, then CLIENTS
# pgbench clients insert for BENCH_S a query vector perturbed a little (so
# rows land in every list); every cluster checkpoints before each run.  Settings:
# ROWS (100000), DIMS (128), LISTS (100), CLIENTS (16), BENCH_S (20),
# ROUNDS (3), PORT (first port; one per build), DEVICE (cpu), ENGINE (a GPU
# engine library for the GPU worker, e.g. the CPU stand-in
# build/gpuivf_fake_gpu.so, with DEVICE=gpu: the kNN queries then go through
# the worker).  Run as root (clusters run as postgres) or as a user that may
# run PostgreSQL.
set -euo pipefail

: "${PG_CONFIGS:?set PG_CONFIGS to one or more pg_config paths}"
ROWS=${ROWS:-100000}
DIMS=${DIMS:-128}
LISTS=${LISTS:-100}
CLIENTS=${CLIENTS:-16}
SECONDS_EACH=${BENCH_S:-20}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-55440}
DEVICE=${DEVICE:-cpu}
ENGINE=${ENGINE:-}
W=$(mktemp -d /tmp/gpuivf-insert-bench.XXXXXX)
chmod 755 "$W"; [ "$(id -u)" != 0 ] || chown postgres "$W"

as_pg() {
	if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else bash -c "$*"; fi
}

read -r -a CONFIGS <<< "$PG_CONFIGS"
BINS=()
i=0
for cfg in "${CONFIGS[@]}"; do
	bin=$("$cfg" --bindir)
	BINS+=("$bin")
	d=$W/data$i
	p=$((PORT + i))
	as_pg "$bin/initdb -D $d -A trust >/dev/null"
	cat >> "$d/postgresql.conf" <<EOF
port = $p
unix_socket_directories = '$W'
listen_addresses = ''
shared_buffers = 256MB
max_connections = 64
synchronous_commit = off
autovacuum = off
gpuivf.device = '$DEVICE'
EOF
	[ -z "$ENGINE" ] || printf "shared_preload_libraries = 'gpuivf'\ngpuivf.engine_library = '%s'\n" \
		"$ENGINE" >> "$d/postgresql.conf"
	as_pg "$bin/pg_ctl -D $d -l $W/log$i -w start >/dev/null"
	i=$((i + 1))
done
cleanup() {
	local n=0
	for bin in "${BINS[@]}"; do
		as_pg "$bin/pg_ctl -D $W/data$n -m fast stop >/dev/null 2>&1" || true
		n=$((n + 1))
	done
	rm -rf "$W"
}
trap cleanup EXIT

sql() {   # sql INDEX STATEMENT
	as_pg "${BINS[$1]}/psql -X -q -At -h $W -p $((PORT + $1)) -d postgres -c \"$2\""
}

# The same rows for every build: clustered vectors from a fixed seed.
for n in "${!BINS[@]}"; do
	sql "$n" "CREATE EXTENSION gpuivf"
	sql "$n" "SELECT setseed(0.42);
	  CREATE TABLE centres AS SELECT c AS id, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, $DIMS) WHERE c > 0)::real[] AS v FROM generate_series(1, 200) c;
	  CREATE TABLE items (id bigserial PRIMARY KEY, v real[]);
	  INSERT INTO items (v) SELECT ARRAY(SELECT x + (random() - 0.5)::real FROM unnest(c.v) x WHERE g > 0)::real[]
	    FROM generate_series(1, $ROWS) g, LATERAL (SELECT v FROM centres WHERE id = 1 + (g % 200)) c;
	  CREATE TABLE queries AS SELECT g AS id, ARRAY(SELECT x + (random() - 0.5)::real FROM unnest(c.v) x WHERE g >= 0)::real[] AS v
	    FROM generate_series(0, 999) g, LATERAL (SELECT v FROM centres WHERE id = 1 + (g % 200)) c;
	  CREATE INDEX items_v ON items USING gpuivf (v) WITH (lists = $LISTS);
	  CREATE TABLE fixed AS SELECT * FROM items;
	  CREATE INDEX fixed_v ON fixed USING gpuivf (v) WITH (lists = $LISTS)"
	sql "$n" "VACUUM ANALYZE items"
	sql "$n" "VACUUM ANALYZE fixed"
done

cat > "$W/insert.sql" <<'EOF'
\set q random(0, 999)
INSERT INTO items (v) SELECT ARRAY(SELECT x + (random() * 0.02 - 0.01)::real FROM unnest(v) x)::real[] FROM queries WHERE id = :q;
EOF
cat > "$W/knn.sql" <<'EOF'
\set q random(0, 999)
SELECT id FROM fixed ORDER BY v <-> (SELECT v FROM queries WHERE id = :q) LIMIT 10;
EOF
chmod 644 "$W"/*.sql

pgb() {   # pgb INDEX CLIENTS SCRIPT -> tps
	local j=$(( $2 < 2 ? 1 : 2 ))
	as_pg "${BINS[$1]}/pgbench -n -M prepared -h $W -p $((PORT + $1)) -c $2 -j $j -T $SECONDS_EACH -f $3 postgres" \
		| awk '/^tps/ { printf "%.0f", $3; exit }'
}

checkpoint_all() {   # no build's writes of a run spill into the next run
	local c
	for c in "${!BINS[@]}"; do sql "$c" "CHECKPOINT"; done
}

declare -A BEST_INS BEST_KNN
for r in $(seq 1 "$ROUNDS"); do
	for n in "${!BINS[@]}"; do
		checkpoint_all
		knn=$(pgb "$n" 1 "$W/knn.sql")
		checkpoint_all
		ins=$(pgb "$n" "$CLIENTS" "$W/insert.sql")
		echo "round $r, ${CONFIGS[$n]}: inserts $ins rows/s ($CLIENTS clients), kNN $knn QPS (1 client)"
		[ "${BEST_INS[$n]:-0}" -ge "$ins" ] || BEST_INS[$n]=$ins
		[ "${BEST_KNN[$n]:-0}" -ge "$knn" ] || BEST_KNN[$n]=$knn
	done
done

echo
echo "| build | inserts, rows/s ($CLIENTS clients) | kNN QPS (1 client) |"
echo "|---|---|---|"
for n in "${!BINS[@]}"; do
	rows=$(sql "$n" "SELECT count(*) FROM items")
	echo "| ${CONFIGS[$n]} | ${BEST_INS[$n]} | ${BEST_KNN[$n]} |"
	sql "$n" "SELECT gpuivf_verify('items_v')" >/dev/null
	info=$(sql "$n" "SELECT gpuivf_index_info('items_v')->>'vectors'")
	[ "$info" = "$rows" ] || { echo "build $n: the index counts $info rows, the table has $rows" >&2; exit 1; }
done
echo "(best of $ROUNDS interleaved rounds of ${SECONDS_EACH} s; $ROWS x $DIMS rows, $LISTS lists, gpuivf.device = $DEVICE${ENGINE:+, engine $ENGINE}; every index verified and its row count equal to the table's)"
