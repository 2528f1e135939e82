-- ANALYZE measures the recall curve of a gpuivf index: it is kept
-- in the metapage, gpuivf_index_info shows it, and gpuivf.target_recall
-- picks the nprobe from it.  Measured values depend on floating point, so
-- this test shows properties of the curve, not its numbers.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;
SET max_parallel_workers_per_gather = 0;

CREATE TABLE an_items (id int PRIMARY KEY, v real[]) WITH (autovacuum_enabled = off);
SELECT setseed(0.5);
INSERT INTO an_items
SELECT i, ARRAY(SELECT ((i % 13) * 0.3 + random())::real FROM generate_series(1, 16) j WHERE i > 0)
FROM generate_series(1, 3000) i;

-- the curve is a property of the index: shown as a list of points
CREATE FUNCTION an_curve(idx regclass)
RETURNS TABLE (nprobe int, recall float8, se float8) LANGUAGE sql AS $$
  SELECT (p ->> 'nprobe')::int, (p ->> 'recall')::float8, (p ->> 'se')::float8
  FROM jsonb_array_elements(gpuivf_index_info(idx) -> 'calibration' -> 'curve') p $$;

-- Is chosen the nprobe the curve gives for target: the smallest point whose
-- recall meets it with 95% confidence (recall - 1.645 se >= target), else the
-- best point?  The curve is shown rounded, so allow 0.001 either way.
CREATE FUNCTION an_choice_ok(idx regclass, target float8, chosen int)
RETURNS bool LANGUAGE sql AS $$
  SELECT CASE
    WHEN lenient IS NULL THEN
      chosen = (SELECT nprobe FROM an_curve(idx) ORDER BY recall DESC, nprobe LIMIT 1)
    ELSE chosen BETWEEN lenient AND coalesce(strict, 2147483647) END
  FROM (SELECT min(nprobe) FILTER (WHERE recall - 1.645 * se >= target - 0.001) AS lenient,
               min(nprobe) FILTER (WHERE recall - 1.645 * se >= target + 0.001) AS strict
        FROM an_curve(idx)) s $$;

-- with gpuivf.analyze_sample = 0 CREATE INDEX measures nothing
SET gpuivf.analyze_sample = 0;
CREATE INDEX an_idx ON an_items USING gpuivf (v) WITH (lists = 20, pq_m = 4);
SELECT gpuivf_index_info('an_idx') -> 'calibration' AS calibration,
       gpuivf_index_info('an_idx') #>> '{probes,source}' AS source,
       gpuivf_index_info('an_idx') #>> '{probes,in_use}' AS in_use;
ANALYZE an_items;
SELECT gpuivf_index_info('an_idx') -> 'calibration' AS still_none;
RESET gpuivf.analyze_sample;

-- ANALYZE stores a curve
ANALYZE an_items;
SELECT c ->> 'k' AS k, c ->> 'sample' AS sample, c ->> 'vectors' AS vectors,
       c ->> 'rerank_candidates' AS rerank_candidates,
       (c ->> 'measured_at')::timestamptz <= now() AS measured_at_is_a_time,
       jsonb_array_length(c -> 'curve') BETWEEN 2 AND 64 AS has_points
FROM (SELECT gpuivf_index_info('an_idx') -> 'calibration' AS c) s;
-- the re-rank depths measured and the one scans use: 16 dimensions, where
-- the default depth covers every target, measure only it
SELECT c -> 'depths' AS depths, jsonb_array_length(c -> 'deeper_curves') AS deeper,
       gpuivf_index_info('an_idx') #>> '{probes,rerank_candidates}' AS in_use,
       gpuivf_index_info('an_idx') #>> '{probes,rerank_source}' AS rerank_source
FROM (SELECT gpuivf_index_info('an_idx') -> 'calibration' AS c) s;

SELECT min(nprobe) AS first_nprobe, max(nprobe) <= 20 AS within_lists,
       bool_and(recall BETWEEN 0 AND 1) AS recalls_in_range,
       bool_and(se >= 0) AS se_non_negative
FROM an_curve('an_idx');
-- ascending nprobe, and recall grows (no drop beyond noise)
SELECT bool_and(nprobe > prev_nprobe) AS nprobe_ascending,
       bool_and(recall >= prev_recall - 0.02) AS recall_monotone_ish,
       max(recall) > min(recall) AS recall_grows
FROM (SELECT nprobe, recall, lag(nprobe) OVER w AS prev_nprobe, lag(recall) OVER w AS prev_recall
      FROM an_curve('an_idx') WINDOW w AS (ORDER BY nprobe)) s
WHERE prev_nprobe IS NOT NULL;

-- the target picks the smallest measured nprobe meeting it, at once
SET gpuivf.target_recall = 0.5;
SELECT gpuivf_index_info('an_idx') #>> '{probes,in_use}' AS low_target_nprobe \gset
SELECT gpuivf_index_info('an_idx') #>> '{probes,source}' AS source,
       an_choice_ok('an_idx', 0.5, :low_target_nprobe) AS smallest_meeting_target;
SET gpuivf.target_recall = 0.99;
SELECT gpuivf_index_info('an_idx') #>> '{probes,in_use}' AS high_target_nprobe \gset
SELECT (:high_target_nprobe)::int > (:low_target_nprobe)::int AS more_probes_for_more_recall,
       an_choice_ok('an_idx', 0.99, :high_target_nprobe) AS smallest_meeting_target;
-- gpuivf.probes overrides the curve
SET gpuivf.probes = 3;
SELECT gpuivf_index_info('an_idx') -> 'probes' -> 'in_use' AS in_use,
       gpuivf_index_info('an_idx') #>> '{probes,source}' AS source;
RESET gpuivf.probes;
RESET gpuivf.target_recall;

-- the calibration changes no row: the index verifies, nothing moved
SELECT gpuivf_verify('an_idx', true);

-- a target no point reaches: the best point, target_reached = false
-- (codes only, 4-bit, few candidates: recall stays below 1)
CREATE INDEX an_codes_idx ON an_items USING gpuivf (v float4_ip_ops)
  WITH (lists = 10, pq_m = 4, pq_bits = 4, rerank = false);
SELECT gpuivf_index_info('an_codes_idx') #>> '{calibration,rerank_candidates}' AS rerank_candidates;
SET gpuivf.target_recall = 1;
SELECT (gpuivf_index_info('an_codes_idx') #>> '{probes,target_reached}') AS target_reached,
       (gpuivf_index_info('an_codes_idx') #>> '{probes,in_use}')::int =
       (SELECT nprobe FROM an_curve('an_codes_idx') ORDER BY recall DESC, nprobe LIMIT 1) AS best_point;
-- a scan says so once per backend and curve (the DETAIL has measured numbers)
\set VERBOSITY terse
SET enable_seqscan = off;
SELECT count(*) FROM (SELECT id FROM an_items ORDER BY v <#> '{1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1}' LIMIT 10) s;
SELECT count(*) FROM (SELECT id FROM an_items ORDER BY v <#> '{2,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1}' LIMIT 10) s;
RESET enable_seqscan;
\set VERBOSITY default
RESET gpuivf.target_recall;
DROP INDEX an_codes_idx;

-- VACUUM re-measures a curve that is stale (rows changed by 10% or more)
INSERT INTO an_items
SELECT i, ARRAY(SELECT ((i % 13) * 0.3 + random())::real FROM generate_series(1, 16) j WHERE i > 0)
FROM generate_series(3001, 3600) i;
VACUUM an_items;
SELECT gpuivf_index_info('an_idx') #>> '{calibration,vectors}' AS measured_vectors;
-- ... but not one that is still fresh
INSERT INTO an_items
SELECT i, ARRAY(SELECT ((i % 13) * 0.3 + random())::real FROM generate_series(1, 16) j WHERE i > 0)
FROM generate_series(3601, 3700) i;
VACUUM an_items;
SELECT gpuivf_index_info('an_idx') #>> '{calibration,vectors}' AS measured_vectors;
-- ANALYZE always measures again
ANALYZE an_items;
SELECT gpuivf_index_info('an_idx') #>> '{calibration,vectors}' AS measured_vectors;

-- REINDEX measures the new index; an untrained index has no curve
REINDEX INDEX an_idx;
SELECT gpuivf_index_info('an_idx') #>> '{calibration,sample}' AS sample;
CREATE TABLE an_empty (v real[]);
CREATE INDEX an_empty_idx ON an_empty USING gpuivf (v);
ANALYZE an_empty;
SELECT gpuivf_index_info('an_empty_idx') -> 'calibration' AS calibration,
       gpuivf_index_info('an_empty_idx') #>> '{probes,source}' AS source;

-- a small sample is honoured; fewer rows than the sample: every row
SET gpuivf.analyze_sample = 50;
ANALYZE an_items;
SELECT gpuivf_index_info('an_idx') #>> '{calibration,sample}' AS sample;
RESET gpuivf.analyze_sample;
CREATE TABLE an_tiny (v real[]);
INSERT INTO an_tiny SELECT ARRAY[i, i * 2, 1]::real[] FROM generate_series(1, 30) i;
CREATE INDEX an_tiny_idx ON an_tiny USING gpuivf (v) WITH (lists = 3, pq_m = 1);
SELECT gpuivf_index_info('an_tiny_idx') #>> '{calibration,sample}' AS sample;

-- settings bounds
SET gpuivf.target_recall = 1.5;
SET gpuivf.analyze_sample = -1;

DROP TABLE an_items, an_empty, an_tiny;
DROP FUNCTION an_choice_ok(regclass, float8, int);
DROP FUNCTION an_curve(regclass);
