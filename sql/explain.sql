-- Plans: the index serves ORDER BY <distance operator> queries and nothing
-- else; the cost estimate prefers it on a larger table and a sequential scan
-- on a tiny one.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;
SET max_parallel_workers_per_gather = 0;

CREATE TABLE plan_items (id int, v real[], note text);
SELECT setseed(0.66);
INSERT INTO plan_items
SELECT i, ARRAY(SELECT ((i % 25) + random() * 2)::real FROM generate_series(1, 32) j WHERE i > 0),
       'row ' || i
FROM generate_series(1, 5000) i;
CREATE INDEX plan_l2 ON plan_items USING gpuivf (v) WITH (lists = 20);
ANALYZE plan_items;

-- kNN with the index's operator: an index scan
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT id FROM plan_items ORDER BY v <-> (SELECT v FROM plan_items WHERE id = 1) LIMIT 10;
EXPLAIN (COSTS OFF)
SELECT id, v <-> '{1,2,3}' AS distance FROM plan_items ORDER BY v <-> '{1,2,3}' LIMIT 10;
-- the commuted form is not an ordering on the column
EXPLAIN (COSTS OFF)
SELECT id FROM plan_items ORDER BY '{1,2,3}' <-> v LIMIT 10;
-- without ORDER BY, or ordered by another operator, never the gpuivf index
EXPLAIN (COSTS OFF) SELECT count(*) FROM plan_items;
EXPLAIN (COSTS OFF) SELECT id FROM plan_items WHERE note = 'row 7';
EXPLAIN (COSTS OFF) SELECT id FROM plan_items ORDER BY v <#> '{1,2,3}' LIMIT 10;
EXPLAIN (COSTS OFF) SELECT id FROM plan_items ORDER BY v LIMIT 10;
RESET enable_seqscan;

-- with the planner free to choose.  At 5000 rows of 32 dimensions the index
-- is chosen with the default 200 re-rank candidates (an index that fits in
-- effective_cache_size is costed as mostly cached, am/cost.cpp) and with 20
EXPLAIN (COSTS OFF) SELECT id FROM plan_items ORDER BY v <-> '{1,2,3}' LIMIT 10;
SET gpuivf.rerank_candidates = 20;
EXPLAIN (COSTS OFF) SELECT id FROM plan_items ORDER BY v <-> '{1,2,3}' LIMIT 10;
-- but never to sort the whole table
EXPLAIN (COSTS OFF) SELECT id FROM plan_items ORDER BY v <-> '{1,2,3}';
RESET gpuivf.rerank_candidates;

-- a tiny table keeps its sequential scan
CREATE TABLE plan_tiny (id int, v real[]);
INSERT INTO plan_tiny SELECT i, ARRAY[i, i + 1, i + 2]::real[] FROM generate_series(1, 40) i;
CREATE INDEX plan_tiny_idx ON plan_tiny USING gpuivf (v) WITH (lists = 2, pq_m = 1);
ANALYZE plan_tiny;
EXPLAIN (COSTS OFF) SELECT id FROM plan_tiny ORDER BY v <-> '{1,2,3}' LIMIT 10;

-- a 100-row LATERAL kNN join is costed per loop like one cached kNN query,
-- far below jit_above_cost (JIT would cost more than the join itself)
CREATE FUNCTION plan_total_cost(query text) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    plan json;
BEGIN
    EXECUTE 'EXPLAIN (FORMAT JSON) ' || query INTO plan;
    RETURN (plan->0->'Plan'->>'Total Cost')::float8;
END $$;
SELECT plan_total_cost('SELECT q.id, n.id FROM (SELECT * FROM plan_items LIMIT 100) q
    CROSS JOIN LATERAL (SELECT i.id FROM plan_items i ORDER BY i.v <-> q.v LIMIT 10) n')
    < current_setting('jit_above_cost')::float8 AS below_jit_above_cost;
DROP FUNCTION plan_total_cost(text);

-- EXPLAIN ANALYZE runs the scan (timings off for stable output)
SET enable_seqscan = off;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
SELECT id FROM plan_items ORDER BY v <-> (SELECT v FROM plan_items WHERE id = 1) LIMIT 10;
RESET enable_seqscan;

DROP TABLE plan_items, plan_tiny;
