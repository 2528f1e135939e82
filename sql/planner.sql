-- Planner integration: the LIMIT reaches the scan, LATERAL kNN
-- joins run as batched searches with the nested loop's exact results,
-- filtered kNN queries still return k rows, EXPLAIN shows what the engine
-- did.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;
SET max_parallel_workers_per_gather = 0;
SET jit = off;
-- printed rows and EXPLAIN fields are the CPU engine's; section 7 repeats
-- the equality checks on the configured device (the GPU worker when one runs)
SET gpuivf.device = cpu;

-- 20000 rows in 16 dimensions around 50 centres (id % 50); cat, a hash of
-- id in 0..99, gives filters of known selectivity that do not follow the
-- clusters, while id % 100 = 0 picks rows of one cluster only
CREATE TABLE pl_items (id int PRIMARY KEY, v real[], cat int);
SELECT setseed(0.25);
INSERT INTO pl_items
SELECT i, ARRAY(SELECT (((i % 50) * 7 + j * 3) % 17 + random() * 4)::real
                FROM generate_series(1, 16) j WHERE i > 0),
       (hashint4(i) & 2147483647) % 100
FROM generate_series(1, 20000) i;
-- 40 queries with their own k, and one without a vector
CREATE TABLE pl_queries (qid int, q real[], k int);
INSERT INTO pl_queries
SELECT n, ARRAY(SELECT (((n % 50) * 7 + j * 3) % 17 + random() * 4)::real
                FROM generate_series(1, 16) j WHERE n > 0),
       1 + n % 7
FROM generate_series(1, 40) n;
INSERT INTO pl_queries VALUES (41, NULL, 5);
CREATE INDEX pl_l2 ON pl_items USING gpuivf (v float4_l2_ops) WITH (lists = 40, pq_m = 4);
CREATE INDEX pl_ip ON pl_items USING gpuivf (v float4_ip_ops) WITH (lists = 40, pq_m = 4);
CREATE INDEX pl_cos ON pl_items USING gpuivf (v float4_cosine_ops) WITH (lists = 40, pq_m = 4);
ANALYZE pl_items;
ANALYZE pl_queries;
SET gpuivf.probes = 4;

-- EXPLAIN output with the numbers that vary (times) replaced by N
CREATE FUNCTION pg_temp.explain(query text, opts text DEFAULT 'ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF')
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    line text;
BEGIN
    FOR line IN EXECUTE format('EXPLAIN (%s) %s', opts, query) LOOP
        RETURN NEXT regexp_replace(line, '(Time|time)[:=] ?[0-9.]+( ms)?(\.\.[0-9.]+)?', '\1: N', 'g');
    END LOOP;
END $$;

-- 1. plans ----------------------------------------------------------------
-- kNN on the large table: the gpuivf scan under its GpuivfKnn node, which
-- hands the LIMIT to the scan
EXPLAIN (COSTS OFF) SELECT id FROM pl_items ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}' LIMIT 10;
-- a tiny table keeps its sequential scan
CREATE TABLE pl_tiny (id int, v real[]);
INSERT INTO pl_tiny SELECT i, ARRAY[i, i + 1, i + 2]::real[] FROM generate_series(1, 50) i;
CREATE INDEX pl_tiny_idx ON pl_tiny USING gpuivf (v) WITH (lists = 2, pq_m = 1);
ANALYZE pl_tiny;
EXPLAIN (COSTS OFF) SELECT id FROM pl_tiny ORDER BY v <-> '{1,2,3}' LIMIT 5;
-- the LATERAL kNN join: the outer rows go through GpuivfBatchKnn
EXPLAIN (COSTS OFF)
SELECT q.qid, n.id, n.dist
FROM pl_queries q CROSS JOIN LATERAL (
    SELECT i.id, i.v <-> q.q AS dist FROM pl_items i ORDER BY i.v <-> q.q LIMIT 10) n;
-- EXPLAIN VERBOSE resolves every column through the new nodes
EXPLAIN (COSTS OFF, VERBOSE)
SELECT q.qid, n.id, n.dist
FROM pl_queries q CROSS JOIN LATERAL (
    SELECT i.id, i.v <-> q.q AS dist FROM pl_items i ORDER BY i.v <-> q.q LIMIT q.k) n;
-- gpuivf.enable_batch_join = off: the plain nested loop
SET gpuivf.enable_batch_join = off;
EXPLAIN (COSTS OFF)
SELECT q.qid, n.id, n.dist
FROM pl_queries q CROSS JOIN LATERAL (
    SELECT i.id, i.v <-> q.q AS dist FROM pl_items i ORDER BY i.v <-> q.q LIMIT 10) n;
RESET gpuivf.enable_batch_join;
-- one outer row: nothing to batch
EXPLAIN (COSTS OFF)
SELECT q.qid, n.id
FROM (SELECT * FROM pl_queries WHERE qid = 3) q CROSS JOIN LATERAL (
    SELECT i.id FROM pl_items i ORDER BY i.v <-> q.q LIMIT 10) n;
-- the inner side is not a kNN search of the loop's row: no batching
EXPLAIN (COSTS OFF)
SELECT q.qid, n.id
FROM pl_queries q CROSS JOIN LATERAL (
    SELECT i.id FROM pl_items i WHERE i.cat = q.k
    ORDER BY i.v <-> '{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}' LIMIT 3) n;

-- 2. the batched join returns what the nested loop returns -------------------
-- every (query, id, distance) in join order, batched and not, for each
-- metric and for a constant, a correlated and a large LIMIT
CREATE FUNCTION pg_temp.knn_join(op text, lim text, batch boolean, join_kind text DEFAULT 'JOIN')
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    result text[];
BEGIN
    PERFORM set_config('gpuivf.enable_batch_join', batch::text, true);
    EXECUTE format('SELECT array_agg(qid || '':'' || coalesce(id::text, ''-'') || '':'' || coalesce(dist::text, ''-'')) '
                   'FROM (SELECT q.qid, n.id, n.dist FROM pl_queries q %s LATERAL ('
                   'SELECT i.id, i.v %s q.q AS dist FROM pl_items i ORDER BY i.v %s q.q LIMIT %s) n ON true) s',
                   join_kind, op, op, lim) INTO result;
    RETURN result;
END $$;
SELECT op, lim,
       pg_temp.knn_join(op, lim, true) = pg_temp.knn_join(op, lim, false) AS same,
       cardinality(pg_temp.knn_join(op, lim, true)) AS rows
FROM (VALUES ('<->'), ('<#>'), ('<=>')) o(op), (VALUES ('10'), ('q.k'), ('250')) l(lim)
ORDER BY 1, 2;
-- LEFT JOIN: the query without a vector keeps its row, with NULLs
SELECT pg_temp.knn_join('<->', '3', true, 'LEFT JOIN') = pg_temp.knn_join('<->', '3', false, 'LEFT JOIN') AS same,
       (pg_temp.knn_join('<->', '3', true, 'LEFT JOIN'))[121:] AS last_rows;
-- and the batched plan really ran batched
SELECT line FROM pg_temp.explain(
  'SELECT q.qid, n.id, n.dist FROM pl_queries q CROSS JOIN LATERAL (
     SELECT i.id, i.v <-> q.q AS dist FROM pl_items i ORDER BY i.v <-> q.q LIMIT q.k) n') line;

-- 3. prepared statements: $1 vector, $2 limit, custom and generic plans ------
PREPARE pl_knn(real[], int) AS
    SELECT id, v <-> $1 AS dist FROM pl_items ORDER BY v <-> $1 LIMIT $2;
EXECUTE pl_knn('{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}', 4);
EXECUTE pl_knn('{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}', 4);
EXECUTE pl_knn('{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}', 4);
EXECUTE pl_knn('{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}', 4);
EXECUTE pl_knn('{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}', 4);
EXECUTE pl_knn('{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}', 4);
EXECUTE pl_knn('{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}', 4);
-- the generic plan asks the scan for $2 rows
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE pl_knn('{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}', 4);
SELECT line FROM pg_temp.explain('EXECUTE pl_knn(''{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}'', 6)') line;
EXECUTE pl_knn('{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}', 4);
-- generic and custom plans return the same rows
CREATE FUNCTION pg_temp.prepared_ids(mode text, lim int) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
    ids int[];
BEGIN
    PERFORM set_config('plan_cache_mode', mode, true);
    SELECT array_agg(id) INTO ids FROM (
        SELECT id FROM pl_items ORDER BY v <-> (SELECT q FROM pl_queries WHERE qid = 9) LIMIT lim) s;
    RETURN ids;
END $$;
SELECT pg_temp.prepared_ids('force_generic_plan', 25) = pg_temp.prepared_ids('force_custom_plan', 25) AS same;
-- a prepared batched join with its limit as a parameter
PREPARE pl_join(int) AS
    SELECT q.qid, n.id, n.dist FROM pl_queries q CROSS JOIN LATERAL (
        SELECT i.id, i.v <-> q.q AS dist FROM pl_items i ORDER BY i.v <-> q.q LIMIT $1) n;
EXPLAIN (COSTS OFF) EXECUTE pl_join(3);
CREATE TABLE pl_join_batched AS EXECUTE pl_join(3);
SET gpuivf.enable_batch_join = off;
DEALLOCATE pl_join;
PREPARE pl_join(int) AS
    SELECT q.qid, n.id, n.dist FROM pl_queries q CROSS JOIN LATERAL (
        SELECT i.id, i.v <-> q.q AS dist FROM pl_items i ORDER BY i.v <-> q.q LIMIT $1) n;
CREATE TABLE pl_join_plain AS EXECUTE pl_join(3);
RESET gpuivf.enable_batch_join;
SELECT count(*) AS rows,
       (SELECT count(*) FROM (TABLE pl_join_batched EXCEPT ALL TABLE pl_join_plain) d) AS differ
FROM pl_join_batched;
RESET plan_cache_mode;
DEALLOCATE pl_knn;
DEALLOCATE pl_join;

-- 4. filters: WHERE ... ORDER BY ... LIMIT k returns k rows ------------------
-- (the planner would rightly sort the few matching rows of a 1% filter
-- itself; the index scan is what is tested here)
SET enable_seqscan = off;
-- cat < 1, < 10, < 50: 1%, 10%, 50% of the rows
SELECT pct, count(*) AS rows
FROM unnest(ARRAY[1, 10, 50]) pct,
     LATERAL (SELECT id FROM pl_items WHERE cat < pct
              ORDER BY v <-> (SELECT q FROM pl_queries WHERE qid = 11) LIMIT 10) s
GROUP BY pct ORDER BY pct;
-- a 10% filter: round 1 asks for about (LIMIT + 3 sqrt(LIMIT)) / 0.1 rows,
-- enough without deepening
SELECT line FROM pg_temp.explain(
  'SELECT id FROM pl_items WHERE cat < 10
   ORDER BY v <-> (SELECT q FROM pl_queries WHERE qid = 11) LIMIT 10') line
WHERE line ~ 'Rows|Deepened';
-- also when the matching rows are far from the query (all in one
-- cluster), and for every query of a batched join
SELECT count(*) AS rows, count(DISTINCT q.qid) AS queries
FROM pl_queries q CROSS JOIN LATERAL (
    SELECT i.id FROM pl_items i WHERE i.id % 100 = 0 ORDER BY i.v <-> q.q LIMIT 10) n;
-- rows that all lie far from the query: the scan deepened
SELECT line FROM pg_temp.explain(
  'SELECT id FROM pl_items WHERE id % 100 = 0
   ORDER BY v <-> (SELECT q FROM pl_queries WHERE qid = 11) LIMIT 10') line;
-- gpuivf.max_probes bounds the deepening: fewer rows, never more lists
SET gpuivf.max_probes = 5;
SELECT count(*) AS rows FROM (
    SELECT id FROM pl_items WHERE id % 100 = 0
    ORDER BY v <-> (SELECT q FROM pl_queries WHERE qid = 11) LIMIT 100) s;
SELECT line FROM pg_temp.explain(
  'SELECT id FROM pl_items WHERE id % 100 = 0
   ORDER BY v <-> (SELECT q FROM pl_queries WHERE qid = 11) LIMIT 100') line
WHERE line ~ 'Lists|Deepened|rows=';
RESET gpuivf.max_probes;
RESET enable_seqscan;
-- without LIMIT every row still comes, once
SELECT count(*), count(DISTINCT id) FROM (
    SELECT id FROM pl_items ORDER BY v <-> (SELECT q FROM pl_queries WHERE qid = 11)) s;

-- 5. EXPLAIN ANALYZE fields ------------------------------------------------
SELECT line FROM pg_temp.explain(
  'SELECT id FROM pl_items ORDER BY v <-> (SELECT q FROM pl_queries WHERE qid = 2) LIMIT 5') line;
-- with timing: GPU time (0 on the CPU) and the batch's search time
SELECT line FROM pg_temp.explain(
  'SELECT q.qid, n.id FROM pl_queries q CROSS JOIN LATERAL (
     SELECT i.id FROM pl_items i ORDER BY i.v <=> q.q LIMIT 2) n',
  'ANALYZE, COSTS OFF, SUMMARY OFF') line
WHERE line ~ 'Time|Device|Batch';
-- probes from the tuned curve or the automatic rule when gpuivf.probes = 0
SET gpuivf.probes = 0;
SELECT count(*) AS from_curve_or_auto FROM pg_temp.explain(
  'SELECT id FROM pl_items ORDER BY v <-> (SELECT q FROM pl_queries WHERE qid = 2) LIMIT 5') line
WHERE line ~ 'Probes From: (tuned curve|automatic)';
SET gpuivf.probes = 4;
-- the same fields in JSON
SELECT line::jsonb -> 0 -> 'Plan' -> 'Plans' -> 0 ?& ARRAY['Probes', 'Rows Asked', 'Re-ranked', 'Device', 'Batch Size', 'GPU Time'] AS fields
FROM pg_temp.explain('SELECT id FROM pl_items ORDER BY v <-> ''{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}'' LIMIT 5',
                     'ANALYZE, COSTS OFF, FORMAT JSON') line;

-- 6. parallel query: the nodes travel to parallel workers -------------------
SET force_parallel_mode = regress;
SELECT pg_temp.knn_join('<->', 'q.k', true) = pg_temp.knn_join('<->', 'q.k', false) AS same_in_worker;
SELECT count(*) FROM (SELECT id FROM pl_items ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16}' LIMIT 10) s;
RESET force_parallel_mode;

-- 7. on the configured device: batched join = nested loop ------------------
RESET gpuivf.device;
SELECT op, pg_temp.knn_join(op, 'q.k', true) = pg_temp.knn_join(op, 'q.k', false) AS same
FROM (VALUES ('<->'), ('<#>'), ('<=>')) o(op) ORDER BY 1;

DROP TABLE pl_items, pl_queries, pl_tiny, pl_join_batched, pl_join_plain;
