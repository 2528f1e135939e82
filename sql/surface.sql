-- The SQL surface: distance functions and operators, their errors (with
-- SQLSTATEs), settings, and the index on a small table.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;

-- runs a statement and shows its SQLSTATE and message, or ok
CREATE FUNCTION pg_temp.sqlstate_of(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- functions and operators
SELECT l2_distance('{0,0}', '{3,4}') AS l2,
       '{0,0}'::real[] <-> '{3,4}' AS l2_op,
       inner_product('{1,2,3}', '{4,5,6}') AS ip,
       negative_inner_product('{1,2,3}', '{4,5,6}') AS neg_ip,
       '{1,2,3}'::real[] <#> '{4,5,6}' AS neg_ip_op,
       cosine_distance('{1,0}', '{0,1}') AS cos_orthogonal,
       '{1,1}'::real[] <=> '{2,2}' AS cos_parallel_op,
       '{1,0}'::real[] <=> '{-1,0}' AS cos_opposite;
-- cosine with a zero vector is NaN
SELECT cosine_distance('{0,0}', '{1,1}');
-- STRICT: NULL in, NULL out
SELECT l2_distance(NULL, '{1}') IS NULL AS l2_null, ('{1}'::real[] <=> NULL) IS NULL AS cos_null;
-- commutators are declared
SELECT oprname, oprcom::regoperator FROM pg_operator
WHERE oprname IN ('<->', '<#>', '<=>') AND oprleft = 'real[]'::regtype ORDER BY oprname;
-- volatility, strictness, parallel safety
SELECT proname, provolatile, proisstrict, proparallel FROM pg_proc
WHERE proname IN ('l2_distance', 'inner_product', 'negative_inner_product', 'cosine_distance')
  AND proargtypes[0] = 'real[]'::regtype ORDER BY proname;

-- input errors
SELECT '{1,2}'::real[] <-> '{1,2,3}';
SELECT inner_product('{1,NULL}', '{1,2}');
SELECT cosine_distance('{{1,2},{3,4}}', '{1,2}');
SELECT l2_distance('{}', '{}');
SELECT l2_distance('{NaN,1}', '{1,1}');
SELECT l2_distance('{1,1}', '{1,Infinity}');
SELECT pg_temp.sqlstate_of($$SELECT '{1,2}'::real[] <-> '{1,2,3}'$$);
SELECT pg_temp.sqlstate_of($$SELECT '{1,NULL}'::real[] <#> '{1,2}'$$);
SELECT pg_temp.sqlstate_of($$SELECT '{{1,2},{3,4}}'::real[] <=> '{1,2}'$$);
SELECT pg_temp.sqlstate_of($$SELECT '{}'::real[] <-> '{}'$$);
SELECT pg_temp.sqlstate_of($$SELECT '{NaN}'::real[] <-> '{1}'$$);
SELECT pg_temp.sqlstate_of($$SELECT '{-Infinity}'::real[] <-> '{1}'$$);

-- settings
SHOW gpuivf.probes;
SHOW gpuivf.rerank_candidates;
SHOW gpuivf.device;
SET gpuivf.device = tpu;
SET gpuivf.probes = -1;
SET gpuivf.rerank_candidates = 1025;

-- an index with defaults on a small table
CREATE TABLE surface_items (id int PRIMARY KEY, v real[]);
SELECT setseed(0.11);
INSERT INTO surface_items
SELECT i, ARRAY(SELECT (random() + (i % 4))::real FROM generate_series(1, 8) WHERE i > 0)
FROM generate_series(1, 300) i;
INSERT INTO surface_items VALUES (301, NULL), (302, NULL);
CREATE INDEX surface_items_v_idx ON surface_items USING gpuivf (v) WITH (lists = 3);
SELECT (gpuivf_index_info('surface_items_v_idx') ->> 'dims')::int AS dims,
       gpuivf_index_info('surface_items_v_idx') ->> 'metric' AS metric,
       (gpuivf_index_info('surface_items_v_idx') ->> 'lists')::int AS lists,
       (gpuivf_index_info('surface_items_v_idx') ->> 'vectors')::int AS vectors;
SELECT gpuivf_verify('surface_items_v_idx', true);

SET enable_seqscan = off;
SET gpuivf.probes = 3;
-- the index scan returns the nearest rows with exact distances
EXPLAIN (COSTS OFF) SELECT id FROM surface_items ORDER BY v <-> '{1,1,1,1,1,1,1,1}' LIMIT 3;
SELECT (SELECT array_agg(id) FROM (
            SELECT id FROM surface_items ORDER BY v <-> '{1,1,1,1,1,1,1,1}' LIMIT 10) s)
     = (SELECT (array_agg(id ORDER BY l2_distance(v, '{1,1,1,1,1,1,1,1}'), id))[1:10]
        FROM surface_items WHERE v IS NOT NULL) AS same_as_brute_force;
-- rows with a NULL vector are not indexed: a full index scan returns 300 rows
SELECT count(*) AS rows, count(DISTINCT id) AS distinct_rows
FROM (SELECT id FROM surface_items ORDER BY v <-> '{1,1,1,1,1,1,1,1}' OFFSET 0) s;
-- ORDER BY v <-> NULL (a parameter: a constant would be folded away) returns nothing
SET plan_cache_mode = force_generic_plan;
PREPARE knn(real[]) AS SELECT id FROM surface_items ORDER BY v <-> $1 LIMIT 3;
EXPLAIN (COSTS OFF) EXECUTE knn(NULL);
EXECUTE knn(NULL);
EXECUTE knn('{0,0,0,0,0,0,0,0}');
DEALLOCATE knn;
RESET plan_cache_mode;
-- query errors against the index
SELECT id FROM surface_items ORDER BY v <-> '{1,2,3}' LIMIT 1;
SELECT id FROM surface_items ORDER BY v <-> '{1,2,3,4,5,6,7,NaN}' LIMIT 1;
SET gpuivf.device = gpu;
SELECT id FROM surface_items ORDER BY v <-> '{1,1,1,1,1,1,1,1}' LIMIT 1;
SELECT pg_temp.sqlstate_of($$SELECT id FROM surface_items ORDER BY v <-> '{1,1,1,1,1,1,1,1}' LIMIT 1$$);
SET gpuivf.device = cpu;
SELECT count(*) FROM (SELECT id FROM surface_items ORDER BY v <-> '{1,1,1,1,1,1,1,1}' LIMIT 5) s;
RESET gpuivf.device;
-- insert errors
INSERT INTO surface_items VALUES (400, '{1,2,3}');
INSERT INTO surface_items VALUES (401, '{1,2,3,4,5,6,7,Infinity}');
INSERT INTO surface_items VALUES (402, '{1,2,3,4,NULL,6,7,8}');
SELECT pg_temp.sqlstate_of($$INSERT INTO surface_items VALUES (400, '{1,2,3}')$$);
-- more than 16000 dimensions (pgvector's limit) cannot be indexed
CREATE TABLE surface_wide (v real[]);
INSERT INTO surface_wide SELECT array_fill(1::real, ARRAY[16001]);
CREATE INDEX ON surface_wide USING gpuivf (v);
SELECT pg_temp.sqlstate_of($$CREATE INDEX ON surface_wide USING gpuivf (v)$$);
-- vectors larger than an index page must be re-ranked from the table
TRUNCATE surface_wide;
INSERT INTO surface_wide SELECT array_fill(1::real, ARRAY[2037]);
CREATE INDEX ON surface_wide USING gpuivf (v) WITH (rerank_from = 'index');
SELECT pg_temp.sqlstate_of($$CREATE INDEX ON surface_wide USING gpuivf (v) WITH (rerank_from = 'index')$$);
CREATE INDEX ON surface_wide USING gpuivf (v) WITH (rerank_from = 'nowhere');
-- the access method only orders: no quals, no bitmap scans, no uniqueness
CREATE UNIQUE INDEX ON surface_items USING gpuivf (v);
CREATE INDEX ON surface_items USING gpuivf (v, v);
SELECT amname, amtype FROM pg_am WHERE amname = 'gpuivf';
SELECT opcname, opcdefault FROM pg_opclass
WHERE opcmethod = (SELECT oid FROM pg_am WHERE amname = 'gpuivf') ORDER BY opcname;

RESET enable_seqscan;
RESET gpuivf.probes;
DROP TABLE surface_items, surface_wide;
