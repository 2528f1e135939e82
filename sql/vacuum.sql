-- VACUUM removes the entries of deleted rows, keeps the index consistent,
-- and its space is reused by later inserts.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;
SET max_parallel_workers_per_gather = 0;

CREATE TABLE vac_items (id int PRIMARY KEY, v real[]) WITH (autovacuum_enabled = off);
SELECT setseed(0.44);
INSERT INTO vac_items
SELECT i, ARRAY(SELECT ((i % 7) + random())::real FROM generate_series(1, 10) j WHERE i > 0)
FROM generate_series(1, 2000) i;
CREATE INDEX vac_idx ON vac_items USING gpuivf (v) WITH (lists = 5, pq_m = 5);
CREATE INDEX vac_pq_idx ON vac_items USING gpuivf (v float4_ip_ops) WITH (lists = 5, pq_m = 5, rerank = false);
SELECT (gpuivf_index_info('vac_idx') ->> 'vectors')::int AS vectors;

DELETE FROM vac_items WHERE id % 3 <> 0;
VACUUM vac_items;
SELECT (gpuivf_index_info('vac_idx') ->> 'vectors')::int AS vectors,
       (gpuivf_index_info('vac_pq_idx') ->> 'vectors')::int AS pq_vectors;
SELECT gpuivf_verify('vac_idx', true), gpuivf_verify('vac_pq_idx', true);

-- exact scans see exactly the live rows
SET enable_seqscan = off;
SET gpuivf.probes = 5;
SELECT count(*) AS rows, count(*) FILTER (WHERE id % 3 = 0) AS live
FROM (SELECT id FROM vac_items ORDER BY v <-> '{3,3,3,3,3,3,3,3,3,3}' OFFSET 0) s;
SELECT count(*) AS rows, count(DISTINCT id) AS distinct_rows
FROM (SELECT id FROM vac_items ORDER BY v <#> '{3,3,3,3,3,3,3,3,3,3}' OFFSET 0) s;
SELECT (SELECT array_agg(id) FROM (SELECT id FROM vac_items ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,10}' LIMIT 20) s)
     = (SELECT (array_agg(id ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,10}', id))[1:20] FROM vac_items)
       AS same_as_brute_force;
RESET enable_seqscan;

-- inserts after VACUUM reuse the freed space: the index barely grows
SELECT pg_relation_size('vac_idx') AS size_before \gset
INSERT INTO vac_items
SELECT i, ARRAY(SELECT ((i % 7) + random())::real FROM generate_series(1, 10) j WHERE i > 0)
FROM generate_series(2001, 3000) i;
SELECT pg_relation_size('vac_idx') <= :size_before * 1.1 AS space_reused;
SELECT (gpuivf_index_info('vac_idx') ->> 'vectors')::int AS vectors;
SELECT gpuivf_verify('vac_idx', true), gpuivf_verify('vac_pq_idx', true);

-- deleting everything leaves an empty but valid index
DELETE FROM vac_items;
VACUUM vac_items;
SELECT (gpuivf_index_info('vac_idx') ->> 'vectors')::int AS vectors;
SELECT gpuivf_verify('vac_idx', true);
SET enable_seqscan = off;
SELECT id FROM vac_items ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,10}' LIMIT 5;
RESET enable_seqscan;

RESET gpuivf.probes;
DROP TABLE vac_items;
