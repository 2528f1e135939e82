-- test/bench/batch_join.sql — the batched LATERAL kNN join: the
-- same join with gpuivf.enable_batch_join on and off, on the devices asked,
-- with a check that both return the same rows.  A benchmark, not a test:
-- read the "Time:" lines and the EXPLAIN ANALYZE of the batched join.
--
--   psql -X -v rows=100000 -v queries=1000 -f test/bench/batch_join.sql
--   psql -X -v rows=1000000 -v queries=10000 -v gpu=on \
--        -v gen=$PWD/build/test/tools/gpuivf_gen -f test/bench/batch_join.sql
--
-- Variables (defaults): rows (100000), dims (128), queries (1000), k (10),
-- cpu (on) and gpu (off: needs the GPU worker) — the gpuivf.device values
-- measured — reuse (off: on keeps bj_items/bj_queries and the index of an
-- earlier run with the same sizes) and gen: the path of test/tools/gpuivf_gen
-- on the database server's machine; data then comes from it through COPY
-- FROM PROGRAM (superuser; seconds for 1M rows) instead of from SQL (minutes).
\set ON_ERROR_STOP on
\if :{?rows}
\else
\set rows 100000
\endif
\if :{?dims}
\else
\set dims 128
\endif
\if :{?queries}
\else
\set queries 1000
\endif
\if :{?k}
\else
\set k 10
\endif
\if :{?cpu}
\else
\set cpu on
\endif
\if :{?gpu}
\else
\set gpu off
\endif
\if :{?reuse}
\else
\set reuse off
\endif

SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;

-- Clustered vectors: rows/100 centres with component scales (j+1)^-0.5,
-- Gaussian-ish spread (sum of uniforms) per cluster; queries from the same
-- mixture: from gpuivf_gen when -v gen=... is given, else generated in SQL
-- (slower, but the script then needs nothing but psql).
SELECT (:'reuse')::boolean AND to_regclass('bj_items') IS NOT NULL
       AND to_regclass('bj_queries') IS NOT NULL AS have_data \gset
\if :have_data
SELECT (SELECT count(*) FROM bj_items) = :rows
       AND (SELECT count(*) FROM bj_queries) = :queries AS have_data \gset
\endif
\if :have_data
\echo reusing bj_items and bj_queries
\else
DROP TABLE IF EXISTS bj_items, bj_queries, bj_centres;
CREATE TABLE bj_items (id bigint, v real[]);
CREATE TABLE bj_queries (qid bigint, v real[]);
\if :{?gen}
SELECT format('%s --rows %s --dims %s --seed 42 --base - --format binary', :'gen', :rows, :dims) AS gen_base,
       format('%s --rows %s --dims %s --seed 42 --queries %s --query - --format binary',
              :'gen', :rows, :dims, :queries) AS gen_queries \gset
COPY bj_items FROM PROGRAM :'gen_base' WITH (FORMAT binary);
COPY bj_queries FROM PROGRAM :'gen_queries' WITH (FORMAT binary);
\else
SELECT setseed(0.42);
CREATE TABLE bj_centres AS
SELECT c, ARRAY(SELECT ((random() * 2 - 1) * 1.5 * (j + 1) ^ -0.5)::real
                FROM generate_series(0, :dims - 1) j WHERE c >= 0) AS x,
       0.5 + random() AS spread
FROM generate_series(0, greatest(:rows / 100, 1) - 1) c;
CREATE UNIQUE INDEX ON bj_centres (c);
ANALYZE bj_centres;
INSERT INTO bj_items
SELECT i, ARRAY(SELECT (c.x[j + 1] + c.spread * (random() + random() + random() - 1.5)
                        * 0.3 * (j + 1) ^ -0.5)::real
                FROM generate_series(0, :dims - 1) j WHERE i > 0)
FROM generate_series(1, :rows) i
JOIN bj_centres c ON c.c = (hashint4(i) & 2147483647) % greatest(:rows / 100, 1);
INSERT INTO bj_queries
SELECT q, ARRAY(SELECT (c.x[j + 1] + c.spread * (random() + random() + random() - 1.5)
                        * 0.3 * (j + 1) ^ -0.5)::real
                FROM generate_series(0, :dims - 1) j WHERE q > 0)
FROM generate_series(1, :queries) q
JOIN bj_centres c ON c.c = (hashint4(q + 7919) & 2147483647) % greatest(:rows / 100, 1);
\endif
\timing on
CREATE INDEX bj_items_v ON bj_items USING gpuivf (v);
\timing off
ANALYZE bj_items;
ANALYZE bj_queries;
\endif
SELECT gpuivf_index_info('bj_items_v') - 'calibration' AS index_info;

-- the join, as a user writes it; count(*) keeps the client out of the
-- timing, md5 of every (query, row, distance) in join order checks that
-- batching changes nothing
\set join 'FROM bj_queries q CROSS JOIN LATERAL (SELECT i.id, i.v <-> q.v AS dist FROM bj_items i ORDER BY i.v <-> q.v LIMIT ' :k ') n'
\set digest 'SELECT md5(string_agg(q.qid || \':\' || n.id || \':\' || n.dist, \',\')) AS digest, count(*) AS rows '

\if :gpu
\set dev gpu
\ir batch_join_device.sql
\endif
\if :cpu
\set dev cpu
\ir batch_join_device.sql
\endif
RESET gpuivf.device;
RESET gpuivf.enable_batch_join;
