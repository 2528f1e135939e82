-- The index option target_recall: the recall target of one index, which
-- overrides gpuivf.target_recall (a setting that connection pools and
-- shards do not carry), shown by gpuivf_index_info and EXPLAIN.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;
SET max_parallel_workers_per_gather = 0;

CREATE TABLE tr_items (id int PRIMARY KEY, v real[]) WITH (autovacuum_enabled = off);
SELECT setseed(0.25);
INSERT INTO tr_items
SELECT i, ARRAY(SELECT ((i % 11) * 0.3 + random())::real FROM generate_series(1, 16) j WHERE i > 0)
FROM generate_series(1, 3000) i;

CREATE FUNCTION tr_probes(idx regclass)
RETURNS TABLE (in_use int, target float8, target_source text) LANGUAGE sql AS $$
  SELECT (p ->> 'in_use')::int, (p ->> 'target_recall')::float8, p ->> 'target_source'
  FROM (SELECT gpuivf_index_info(idx) -> 'probes' AS p) s $$;

-- the EXPLAIN ANALYZE lines saying where the probes came from
CREATE FUNCTION tr_explain(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  l text;
BEGIN
  FOR l IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || q LOOP
    IF l ~ 'Probes From|Target' THEN
      RETURN NEXT btrim(l);
    END IF;
  END LOOP;
END $$;

-- the option is stored with the index and chooses its probes
CREATE INDEX tr_idx ON tr_items USING gpuivf (v) WITH (lists = 20, pq_m = 4, target_recall = 0.99);
SELECT reloptions FROM pg_class WHERE relname = 'tr_idx';
SELECT target, target_source FROM tr_probes('tr_idx');
SELECT in_use AS high_nprobe FROM tr_probes('tr_idx') \gset
ALTER INDEX tr_idx SET (target_recall = 0.5);
SELECT target, target_source, in_use < :high_nprobe AS fewer_probes FROM tr_probes('tr_idx');

-- it wins over gpuivf.target_recall, whatever set that
SET gpuivf.target_recall = 0.99;
SELECT target, target_source, in_use < :high_nprobe AS fewer_probes FROM tr_probes('tr_idx');
RESET gpuivf.target_recall;

-- RESET gives the setting back its say
ALTER INDEX tr_idx RESET (target_recall);
SELECT reloptions FROM pg_class WHERE relname = 'tr_idx';
SELECT target, target_source FROM tr_probes('tr_idx');
SET gpuivf.target_recall = 0.99;
SELECT target, target_source, in_use = :high_nprobe AS same_as_option FROM tr_probes('tr_idx');
RESET gpuivf.target_recall;

-- gpuivf.probes still overrides both
ALTER INDEX tr_idx SET (target_recall = 0.9);
SET gpuivf.probes = 7;
SELECT in_use, gpuivf_index_info('tr_idx') #>> '{probes,source}' AS source FROM tr_probes('tr_idx');
RESET gpuivf.probes;

-- EXPLAIN: VERBOSE names the target; ANALYZE does when the curve chose
SET enable_seqscan = off;
EXPLAIN (VERBOSE, COSTS OFF)
SELECT id FROM tr_items ORDER BY v <-> (SELECT v FROM tr_items WHERE id = 1) LIMIT 10;
SELECT tr_explain('SELECT id FROM tr_items ORDER BY v <-> (SELECT v FROM tr_items WHERE id = 1) LIMIT 10');
SET gpuivf.probes = 3;
SELECT tr_explain('SELECT id FROM tr_items ORDER BY v <-> (SELECT v FROM tr_items WHERE id = 1) LIMIT 10');
RESET gpuivf.probes;
RESET enable_seqscan;

-- a target the curve cannot reach: a notice naming where it comes from
CREATE INDEX tr_codes_idx ON tr_items USING gpuivf (v)
  WITH (lists = 10, pq_m = 4, pq_bits = 4, rerank = false, target_recall = 1);
\set VERBOSITY terse
SET enable_seqscan = off;
SELECT count(*) FROM (SELECT id FROM tr_items ORDER BY v <-> '{1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1}' LIMIT 10) s;
RESET enable_seqscan;
\set VERBOSITY default
DROP INDEX tr_codes_idx;

-- bounds, and an option that does not exist
ALTER INDEX tr_idx SET (target_recall = 1.5);
ALTER INDEX tr_idx SET (target_recall = -0.1);
CREATE INDEX ON tr_items USING gpuivf (v) WITH (target_recall = 'high');

DROP TABLE tr_items;
DROP FUNCTION tr_probes(regclass);
DROP FUNCTION tr_explain(text);
