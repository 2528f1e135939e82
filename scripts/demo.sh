#!/usr/bin/env bash
# scripts/demo.sh — gpuivf end to end on a throwaway PostgreSQL cluster.
#
#   sudo bash scripts/demo.sh [--rows 50000] [--dims 64]
#
# Installs what is missing (Debian packages), builds and installs gpuivf,
# starts a cluster on 127.0.0.1 (a free port, a temporary data directory,
# running as an unprivileged user), loads generated clustered vectors,
# creates a gpuivf index, runs kNN queries with their recall@10 against an
# exact sequential scan, shows gpuivf_index_info, and — when pgvector is
# installed or can be built from ../shared/vendor — the same on pgvector's
# vector and halfvec columns; then stops the cluster and removes everything
# it created.
set -uo pipefail
# shellcheck source=scripts/common.sh
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
say "pgvector"
ensure_vendored pgvector vector PGVECTOR_MISSING
build_and_install "$REPO" || die "build failed"

make_pg_dir DIR
PORT=$(free_port 5500)
say "starting a throwaway cluster on 127.0.0.1:$PORT (data in $DIR, user $(pg_user))"
start_cluster "$DIR" "$PORT" 127.0.0.1 || die "cannot start the cluster"

say "generating $ROWS x $DIMS clustered vectors and $QUERIES queries"
"$REPO/build/test/tools/gpuivf_gen" --rows "$ROWS" --dims "$DIMS" --queries "$QUERIES" \
	--base "$DIR/items.copy" --query "$DIR/queries.copy" || die "gpuivf_gen failed"

psql_demo() {
	psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -P pager=off
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
SELECT jsonb_pretty(jsonb_object_agg(key, value)) AS gpuivf_index_info
FROM jsonb_each(gpuivf_index_info('items_embedding_idx'))
WHERE key IN ('dims', 'metric', 'lists', 'pq_m', 'pq_bits', 'rerank', 'trained', 'vectors', 'pages',
              'list_size', 'format_version');
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
SELECT q.id AS qid, ARRAY(SELECT id FROM items ORDER BY embedding <-> q.embedding LIMIT 10) AS ids
FROM queries q;
RESET enable_indexscan;
RESET enable_bitmapscan;

-- recall@10 of the index over all queries at one gpuivf.probes, and the
-- average time per query
CREATE FUNCTION pg_temp.recall_at_10(probes int, OUT "recall@10" numeric, OUT ms_per_query numeric)
LANGUAGE plpgsql AS \$\$
DECLARE
  t0 timestamptz;
BEGIN
  PERFORM set_config('gpuivf.probes', probes::text, true);
  t0 := clock_timestamp();
  SELECT round(avg(hits) / 10.0, 3) INTO "recall@10" FROM (
    SELECT (SELECT count(*) FROM (SELECT id FROM items ORDER BY embedding <-> q.embedding LIMIT 10) a
            WHERE a.id = ANY (e.ids)) AS hits
    FROM queries q JOIN exact e ON e.qid = q.id) s;
  ms_per_query := round((extract(epoch FROM clock_timestamp() - t0) * 1000
                         / (SELECT count(*) FROM queries))::numeric, 3);
END
\$\$;

\\echo
\\echo '--- recall@10 over $QUERIES queries at several gpuivf.probes (0 = automatic)'
SELECT CASE WHEN p = 0 THEN 'auto' ELSE p::text END AS probes, r.*
FROM unnest(ARRAY[0, 1, 2, 4, 8, 16]) AS p, LATERAL pg_temp.recall_at_10(p) AS r;

\\echo
\\echo '--- cosine distance (and inner product) use their own operator classes'
\\set ECHO queries
CREATE INDEX items_embedding_cos_idx ON items USING gpuivf (embedding float4_cosine_ops) WITH (lists = 50);
SELECT id, round((embedding <=> (SELECT embedding FROM queries WHERE id = 0))::numeric, 4) AS cosine_distance
FROM items ORDER BY embedding <=> (SELECT embedding FROM queries WHERE id = 0) LIMIT 3;
SELECT gpuivf_verify('items_embedding_idx', true);
\\set ECHO none
\\echo 'gpuivf_verify: the index is consistent and holds every row'
EOF

if [ -z "$PGVECTOR_MISSING" ]; then
psql_demo <<EOF || die "demo SQL (pgvector) failed"
\\echo
\\echo '--- pgvector columns: the same rows as vector($DIMS) and halfvec($DIMS), with pgvector''s operators'
\\set ECHO queries
CREATE EXTENSION gpuivf_vector CASCADE;
CREATE TABLE docs AS SELECT id, embedding::vector($DIMS) AS embedding,
                            embedding::halfvec($DIMS) AS embedding_h FROM items;
CREATE INDEX docs_embedding_idx ON docs USING gpuivf (embedding vector_cosine_ops);
CREATE INDEX docs_embedding_h_idx ON docs USING gpuivf (embedding_h halfvec_l2_ops);
EXPLAIN (COSTS OFF)
SELECT id FROM docs ORDER BY embedding <=> (SELECT embedding::vector FROM queries WHERE id = 0) LIMIT 5;
SELECT id, embedding <=> (SELECT embedding::vector FROM queries WHERE id = 0) AS cosine_distance
FROM docs ORDER BY embedding <=> (SELECT embedding::vector FROM queries WHERE id = 0) LIMIT 5;
SELECT id, embedding_h <-> (SELECT embedding::halfvec FROM queries WHERE id = 0) AS l2_distance
FROM docs ORDER BY embedding_h <-> (SELECT embedding::halfvec FROM queries WHERE id = 0) LIMIT 5;
\\set ECHO none
\\echo 'the halfvec index keeps half-precision vectors:'
SELECT indexrelid::regclass AS index, gpuivf_index_info(indexrelid) ->> 'type' AS type,
       gpuivf_index_info(indexrelid) ->> 'storage' AS storage,
       pg_size_pretty(pg_relation_size(indexrelid)) AS size
FROM pg_index WHERE indrelid = 'docs'::regclass ORDER BY 1;
EOF
else
	echo
	echo "--- pgvector columns: skipped ($PGVECTOR_MISSING)"
fi

say "demo done; stopping and removing the cluster"
