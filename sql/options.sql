-- Index options: defaults, good values, bad values.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;

CREATE TABLE opt_items (id int, v real[]);
SELECT setseed(0.22);
INSERT INTO opt_items
SELECT i, ARRAY(SELECT (random() * 2 + (i % 5))::real FROM generate_series(1, 12) WHERE i > 0)
FROM generate_series(1, 600) i;

-- good
CREATE INDEX opt_default ON opt_items USING gpuivf (v);
CREATE INDEX opt_all ON opt_items USING gpuivf (v float4_l2_ops)
    WITH (lists = 6, pq_m = 4, pq_bits = 4, rerank = false);
CREATE INDEX opt_ip ON opt_items USING gpuivf (v float4_ip_ops) WITH (lists = 2, pq_m = 12);
CREATE INDEX opt_cos ON opt_items USING gpuivf (v float4_cosine_ops) WITH (pq_bits = 8, rerank = on);
SELECT c.relname, c.reloptions,
       i ->> 'metric' AS metric, (i ->> 'lists')::int AS lists, (i ->> 'pq_m')::int AS pq_m,
       (i ->> 'pq_bits')::int AS pq_bits, (i ->> 'rerank')::boolean AS rerank,
       (i ->> 'vectors')::int AS vectors
FROM pg_class c, LATERAL gpuivf_index_info(c.oid) i
WHERE c.relname LIKE 'opt\_%' AND c.relkind = 'i' ORDER BY c.relname;
SELECT gpuivf_verify('opt_default', true), gpuivf_verify('opt_all', true),
       gpuivf_verify('opt_ip', true), gpuivf_verify('opt_cos', true);

-- bad
CREATE INDEX ON opt_items USING gpuivf (v) WITH (pq_bits = 5);
CREATE INDEX ON opt_items USING gpuivf (v) WITH (pq_bits = 16);
CREATE INDEX ON opt_items USING gpuivf (v) WITH (pq_bits = 0);
CREATE INDEX ON opt_items USING gpuivf (v) WITH (pq_bits = 'eight');
CREATE INDEX ON opt_items USING gpuivf (v) WITH (lists = -1);
CREATE INDEX ON opt_items USING gpuivf (v) WITH (lists = 65537);
CREATE INDEX ON opt_items USING gpuivf (v) WITH (pq_m = -2);
CREATE INDEX ON opt_items USING gpuivf (v) WITH (pq_m = 5);
CREATE INDEX ON opt_items USING gpuivf (v) WITH (rerank = maybe);
CREATE INDEX ON opt_items USING gpuivf (v) WITH (nlist = 4);
ALTER INDEX opt_default SET (pq_bits = 3);
ALTER INDEX opt_default SET (lists = 70000);

-- ALTER INDEX SET stores a valid option; REINDEX applies it
ALTER INDEX opt_default SET (lists = 3);
REINDEX INDEX opt_default;
SELECT (gpuivf_index_info('opt_default') ->> 'lists')::int AS lists;
ALTER INDEX opt_default RESET (lists);
SELECT reloptions FROM pg_class WHERE relname = 'opt_default';

-- more lists than rows: a notice, and still an index that answers
CREATE TABLE opt_few (v real[]);
INSERT INTO opt_few SELECT ARRAY[i, i * 2]::real[] FROM generate_series(1, 5) i;
CREATE INDEX opt_few_idx ON opt_few USING gpuivf (v) WITH (lists = 10, pq_m = 1);
SET enable_seqscan = off;
SET gpuivf.probes = 10;
SELECT v FROM opt_few ORDER BY v <-> '{2,4}' LIMIT 3;
RESET gpuivf.probes;
RESET enable_seqscan;

DROP TABLE opt_items, opt_few;
