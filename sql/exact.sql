-- Exact mode: with gpuivf.probes >= lists (and stored vectors), or on an
-- untrained index, an index scan returns exactly what a sequential scan
-- returns: same ids, same order, same distances, for L2, inner product and
-- cosine.  Below that, scans still reach every row when asked for all.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;
SET max_parallel_workers_per_gather = 0;

-- 3000 rows in 16 dimensions around 20 centres, and 6 queries near them
CREATE TABLE exact_items (id int PRIMARY KEY, v real[]);
SELECT setseed(0.33);
INSERT INTO exact_items
SELECT i, ARRAY(SELECT ((((i % 20) * 7 + j * 3) % 11) - 5 + (random() - 0.5) * 3)::real
                FROM generate_series(1, 16) j)
FROM generate_series(1, 3000) i;
CREATE TABLE exact_queries (qid int, q real[]);
INSERT INTO exact_queries
SELECT k, ARRAY(SELECT ((((k * 3 % 20) * 7 + j * 3) % 11) - 5 + (random() - 0.5) * 4)::real
                FROM generate_series(1, 16) j)
FROM generate_series(1, 6) k;

CREATE INDEX exact_l2 ON exact_items USING gpuivf (v float4_l2_ops) WITH (lists = 8);
CREATE INDEX exact_ip ON exact_items USING gpuivf (v float4_ip_ops) WITH (lists = 8);
CREATE INDEX exact_cos ON exact_items USING gpuivf (v float4_cosine_ops) WITH (lists = 8);
ANALYZE exact_items;

-- The k nearest (k = NULL: all) by the index or by a sequential scan, as
-- "id:distance,..." sorted by (distance, id) so that rows at equal distance
-- compare equal, followed by " UNORDERED" if the scan itself did not return
-- them in non-decreasing distance order.
CREATE FUNCTION pg_temp.knn(tab text, op text, q real[], k int, use_index boolean)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    result text;
    ordered boolean;
BEGIN
    PERFORM set_config('enable_seqscan', CASE WHEN use_index THEN 'off' ELSE 'on' END, true);
    PERFORM set_config('enable_indexscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
    PERFORM set_config('enable_bitmapscan', 'off', true);
    EXECUTE format('SELECT string_agg(id || '':'' || d, '','' ORDER BY d, id), bool_and(ok) FROM ('
                   '  SELECT id, d, d >= coalesce(lag(d) OVER (ORDER BY n), d) AS ok FROM ('
                   '    SELECT id, d, row_number() OVER () AS n FROM ('
                   '      SELECT id, v %s $1 AS d FROM %I ORDER BY v %s $1 LIMIT %s) s0) s1) s2',
                   op, tab, op, coalesce(k::text, 'ALL'))
        INTO result, ordered USING q;
    RETURN result || CASE WHEN ordered THEN '' ELSE ' UNORDERED' END;
END $$;

-- the index is used for each operator
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM exact_items ORDER BY v <-> '{1,2}' LIMIT 5;
EXPLAIN (COSTS OFF) SELECT id FROM exact_items ORDER BY v <#> '{1,2}' LIMIT 5;
EXPLAIN (COSTS OFF) SELECT id FROM exact_items ORDER BY v <=> '{1,2}' LIMIT 5;
RESET enable_seqscan;

SET gpuivf.probes = 8;
SELECT op, k,
       count(*) FILTER (WHERE pg_temp.knn('exact_items', op, q, k, true)
                            = pg_temp.knn('exact_items', op, q, k, false)) AS equal,
       count(*) AS queries
FROM exact_queries, (VALUES ('<->'), ('<#>'), ('<=>')) o(op), (VALUES (1), (10), (100), (NULL)) l(k)
GROUP BY op, k ORDER BY op, k NULLS LAST;
-- also with a query that is a stored row (distance 0 to itself)
SELECT op, pg_temp.knn('exact_items', op, v, 25, true) = pg_temp.knn('exact_items', op, v, 25, false) AS equal
FROM exact_items, (VALUES ('<->'), ('<#>'), ('<=>')) o(op) WHERE id = 1234 ORDER BY op;
SELECT split_part(pg_temp.knn('exact_items', '<->', v, 1, true), ':', 1) AS nearest_to_1234
FROM exact_items WHERE id = 1234;

-- a LIMIT behind a filter the planner overestimates (id + 0 > 2980: 20 rows,
-- estimated a third): round 1 is the exact top k the raised limit asked for,
-- the rest comes after it, sorted lazily; together in seq-scan order
CREATE FUNCTION pg_temp.knn_filtered(q real[], use_index boolean)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    result text;
BEGIN
    PERFORM set_config('enable_seqscan', CASE WHEN use_index THEN 'off' ELSE 'on' END, true);
    PERFORM set_config('enable_indexscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
    PERFORM set_config('enable_bitmapscan', 'off', true);
    SELECT string_agg(id || ':' || d, ',' ORDER BY n) INTO result FROM (
        SELECT id, d, row_number() OVER () AS n FROM (
            SELECT id, v <-> q AS d FROM exact_items WHERE id + 0 > 2980
            ORDER BY v <-> q LIMIT 12) s0) s1;
    RETURN result;
END $$;
SELECT count(*) FILTER (WHERE pg_temp.knn_filtered(q, true) = pg_temp.knn_filtered(q, false)) AS equal,
       count(*) AS queries
FROM exact_queries;

-- fewer probes: approximate, but a scan without LIMIT still returns every row once
SET gpuivf.probes = 1;
SET gpuivf.rerank_candidates = 50;
SET enable_seqscan = off;
SELECT op, count(*) AS rows, count(DISTINCT id) AS distinct_rows
FROM exact_queries, (VALUES ('<->'), ('<#>'), ('<=>')) o(op),
     LATERAL (SELECT unnest(string_to_array(pg_temp.knn('exact_items', op, q, NULL, true), ','))) s(x),
     LATERAL (SELECT split_part(x, ':', 1)::int AS id) t
GROUP BY op ORDER BY op;
-- and k rows for LIMIT k
SELECT array_length(string_to_array(pg_temp.knn('exact_items', '<->', q, 75, true), ','), 1) AS rows
FROM exact_queries WHERE qid = 1;
RESET enable_seqscan;

-- without stored vectors (rerank = false) rows come in PQ order, all of them
CREATE INDEX exact_l2_pq ON exact_items USING gpuivf (v) WITH (lists = 8, rerank = false);
DROP INDEX exact_l2;
SET gpuivf.probes = 8;
SET enable_seqscan = off;
SELECT count(*) AS rows, count(DISTINCT id) AS distinct_rows
FROM (SELECT id FROM exact_items ORDER BY v <-> '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}' OFFSET 0) s;
SET gpuivf.probes = 2;
SELECT count(*) AS rows, count(DISTINCT id) AS distinct_rows
FROM (SELECT id FROM exact_items ORDER BY v <-> '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}' OFFSET 0) s;
RESET enable_seqscan;

-- an untrained index (built on an empty table) is exact whatever the probes
CREATE TABLE exact_later (id int, v real[]);
CREATE INDEX exact_later_idx ON exact_later USING gpuivf (v float4_cosine_ops);
INSERT INTO exact_later SELECT id, v FROM exact_items WHERE id <= 1000;
SELECT (gpuivf_index_info('exact_later_idx') ->> 'trained')::boolean AS trained,
       (gpuivf_index_info('exact_later_idx') ->> 'dims')::int AS dims;
SET gpuivf.probes = 1;
SELECT count(*) FILTER (WHERE pg_temp.knn('exact_later', '<=>', q, 30, true)
                            = pg_temp.knn('exact_later', '<=>', q, 30, false)) AS equal,
       count(*) AS queries
FROM exact_queries;
SELECT gpuivf_verify('exact_later_idx', true);

RESET gpuivf.probes;
RESET gpuivf.rerank_candidates;
DROP TABLE exact_items, exact_queries, exact_later;
