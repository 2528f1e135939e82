#!/usr/bin/env bash
# scripts/demo.sh — gpuivf end to end on a throwaway PostgreSQL cluster.
#
#   sudo bash scripts/demo.sh [--rows 50000] [--dims 64]
#
# Installs what is missing (Debian packages), builds and installs gpuivf,
# starts a cluster on 127.0.0.1 (a free port, a temporary data directory,
# running as an unprivileged user), loads generated clustered vectors,
# creates a gpuivf index, runs kNN queries with their recall@10 against an
# exact sequential scan, shows gpuivf_index_info, then stops the cluster and
# removes everything it created.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
trap cleanup_all EXIT

ROWS=50000
DIMS=64
QUERIES=100
while [ $# -gt 0 ]; do
	case $1 in
		--rows) ROWS=$2; shift 2 ;;
		--dims) DIMS=$2; shift 2 ;;
		--queries) QUERIES=$2; shift 2 ;;
		*) die "usage: scripts/demo.sh [--rows N] [--dims D] [--queries Q]" ;;
	esac
done

say "Debian packages"
ensure_packages
build_and_install || die "build failed"

DIR=$(make_pg_dir)
PORT=$(free_port 5500)
say "starting a throwaway cluster on 127.0.0.1:$PORT (data in $DIR, user $(pg_user))"
start_cluster "$DIR" "$PORT" 127.0.0.1 || die "cannot start the cluster"

say "generating $ROWS x $DIMS clustered vectors and $QUERIES queries"
"$REPO/build/test/tools/gpuivf_gen" --rows "$ROWS" --dims "$DIMS" --queries "$QUERIES" \
	--base "$DIR/items.copy" --query "$DIR/queries.copy" || die "gpuivf_gen failed"

psql_demo() {
	psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -P pager=off "$@"
}

psql_demo <<EOF || die "demo SQL failed"
\\echo
\\echo '--- the extension and a table of real[] vectors'
\\set ECHO queries
CREATE EXTENSION gpuivf;
CREATE TABLE items (id bigint PRIMARY KEY, embedding real[]);
CREATE TABLE queries (id bigint PRIMARY KEY, embedding real[]);
\\copy items FROM '$DIR/items.copy'
\\copy queries FROM '$DIR/queries.copy'
\\set ECHO none
SELECT count(*) AS rows, max(cardinality(embedding)) AS dims FROM items;

\\echo
\\echo '--- build the index (defaults: lists and pq_m chosen from the data)'
\\timing on
\\set ECHO queries
CREATE INDEX items_embedding_idx ON items USING gpuivf (embedding);
\\set ECHO none
\\timing off
SELECT jsonb_pretty(gpuivf_index_info('items_embedding_idx'));
SELECT pg_size_pretty(pg_relation_size('items_embedding_idx')) AS index_size,
       pg_size_pretty(pg_relation_size('items')) AS table_size;

\\echo
\\echo '--- the 5 nearest neighbours of query 0 (L2), by the index'
\\set ECHO queries
EXPLAIN (COSTS OFF)
SELECT id FROM items ORDER BY embedding <-> (SELECT embedding FROM queries WHERE id = 0) LIMIT 5;
SELECT id, embedding <-> (SELECT embedding FROM queries WHERE id = 0) AS distance
FROM items ORDER BY embedding <-> (SELECT embedding FROM queries WHERE id = 0) LIMIT 5;
\\set ECHO none

\\echo
\\echo '--- exact answers (sequential scan) for all $QUERIES queries, to measure recall'
SET enable_indexscan = off;
SET enable_bitmapscan = off;
CREATE TEMP TABLE exact AS
SELECT q.id AS qid, e.id
FROM queries q, LATERAL (SELECT id FROM items ORDER BY embedding <-> q.embedding LIMIT 10) e;
RESET enable_indexscan;
RESET enable_bitmapscan;

CREATE FUNCTION pg_temp.recall_at_10() RETURNS numeric LANGUAGE sql AS \$\$
  SELECT round(avg(hits) / 10.0, 3) FROM (
    SELECT (SELECT count(*) FROM (SELECT id FROM items ORDER BY embedding <-> q.embedding LIMIT 10) a
            WHERE a.id IN (SELECT id FROM exact WHERE qid = q.id)) AS hits
    FROM queries q) s
\$\$;

\\echo
\\echo '--- recall@10 over $QUERIES queries at several gpuivf.probes (0 = automatic)'
\\timing on
SET gpuivf.probes = 0;  SELECT 'auto' AS probes, pg_temp.recall_at_10() AS "recall@10";
SET gpuivf.probes = 1;  SELECT 1 AS probes, pg_temp.recall_at_10() AS "recall@10";
SET gpuivf.probes = 4;  SELECT 4 AS probes, pg_temp.recall_at_10() AS "recall@10";
SET gpuivf.probes = 16; SELECT 16 AS probes, pg_temp.recall_at_10() AS "recall@10";
\\timing off

\\echo
\\echo '--- inner product and cosine use their own operator classes'
\\set ECHO queries
CREATE INDEX items_embedding_cos_idx ON items USING gpuivf (embedding float4_cosine_ops) WITH (lists = 50);
SELECT id, round((embedding <=> (SELECT embedding FROM queries WHERE id = 0))::numeric, 4) AS cosine_distance
FROM items ORDER BY embedding <=> (SELECT embedding FROM queries WHERE id = 0) LIMIT 3;
SELECT gpuivf_verify('items_embedding_idx', true);
\\set ECHO none
\\echo 'gpuivf_verify: the index is consistent and holds every row'
EOF

say "demo done; stopping and removing the cluster"
