-- test/bench/batch_join_device.sql — one device's half of batch_join.sql
-- (included with :dev set to gpu or cpu, and :join, :digest, :k from there):
-- the join with gpuivf.enable_batch_join on, then off, twice each with
-- timing, and whether both gave the same (query, row, distance) sequence.
\echo == device :dev, batching on
SET gpuivf.device = :'dev';
SET gpuivf.enable_batch_join = on;
EXPLAIN (ANALYZE, COSTS OFF) SELECT count(*) :join;
\timing on
SELECT count(*) AS rows_batched :join;
SELECT count(*) AS rows_batched :join;
\timing off
:digest :join \gset on_
\echo == device :dev, batching off
SET gpuivf.enable_batch_join = off;
\timing on
SELECT count(*) AS rows_nested_loop :join;
SELECT count(*) AS rows_nested_loop :join;
\timing off
:digest :join \gset off_
SELECT :'dev' AS device, :'on_digest' = :'off_digest' AS batched_equals_nested_loop;
