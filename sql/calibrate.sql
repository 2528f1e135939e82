-- gpuivf_calibrate: calibrating an index on given queries, what
-- gpuivf_index_info shows of a calibration, and the errors.  (Recording
-- queries needs shared_preload_libraries: the TAP tests 204-206.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;
SET max_parallel_workers_per_gather = 0;

CREATE TABLE cal_items (id int, v real[]) WITH (autovacuum_enabled = off);
SELECT setseed(0.75);
INSERT INTO cal_items
SELECT i, ARRAY(SELECT ((i % 9) * 0.4 + random())::real FROM generate_series(1, 8) j WHERE i > 0)
FROM generate_series(1, 2000) i;
-- queries away from the rows
CREATE TABLE cal_queries (id int, v real[]);
INSERT INTO cal_queries
SELECT i, ARRAY(SELECT ((i % 3) * 0.4 + 0.6 + 1.5 * random())::real FROM generate_series(1, 8) j WHERE i > 0)
FROM generate_series(1, 300) i;
CREATE INDEX cal_idx ON cal_items USING gpuivf (v) WITH (lists = 20, pq_m = 4);

-- calibrated on rows by CREATE INDEX; three curves; nothing recorded here
SELECT c ->> 'source' AS source, c ->> 'stored_queries' AS stored,
       (SELECT array_agg((k ->> 'k')::int) FROM jsonb_array_elements(c -> 'curves') k) AS ks,
       c -> 'curve' = (c -> 'curves' -> 1 -> 'curve') AS curve_is_k10,
       (c #>> '{nearest_centre_distance,mean}')::float8 > 0 AS has_distance
FROM (SELECT gpuivf_index_info('cal_idx') -> 'calibration' AS c) s;
SELECT r ->> 'seen' AS seen, r ->> 'held' AS held, r ->> 'drifted' AS drifted
FROM (SELECT gpuivf_index_info('cal_idx') -> 'recorded_queries' AS r) s;
SELECT jsonb_object_keys(gpuivf_index_info('cal_idx') #> '{probes,by_limit}') AS by_limit;

-- given queries: stored with the curve, the source says so
SELECT c ->> 'source' AS source, c ->> 'sample' AS sample, c ->> 'stored_queries' AS stored
FROM (SELECT gpuivf_calibrate('cal_idx', 'SELECT v FROM cal_queries WHERE id <= 150') -> 'calibration' AS c) s;
SELECT gpuivf_verify('cal_idx', true);
-- ANALYZE measures on them again
ANALYZE cal_items;
SELECT gpuivf_index_info('cal_idx') #>> '{calibration,source}' AS source;
-- more rows than gpuivf.analyze_sample: a sample of them
SET gpuivf.analyze_sample = 50;
SELECT gpuivf_calibrate('cal_idx', 'SELECT v FROM cal_queries') #>> '{calibration,sample}' AS sample;
RESET gpuivf.analyze_sample;
-- any type that casts to the index's: double precision[], numeric[]; NULLs skipped
SELECT gpuivf_calibrate('cal_idx', 'SELECT v::float8[] FROM cal_queries WHERE id <= 100') #>> '{calibration,sample}' AS from_float8;
SELECT gpuivf_calibrate('cal_idx', 'SELECT v::numeric[] FROM cal_queries WHERE id <= 60 UNION ALL SELECT NULL') #>> '{calibration,sample}' AS from_numeric;
-- NULL: back to rows, the stored queries forgotten
SELECT c ->> 'source' AS source, c ->> 'stored_queries' AS stored
FROM (SELECT gpuivf_calibrate('cal_idx', NULL) -> 'calibration' AS c) s;
SELECT gpuivf_verify('cal_idx', true);

-- errors
\set VERBOSITY terse
SELECT gpuivf_calibrate('cal_idx', 'SELECT 1');
SELECT gpuivf_calibrate('cal_idx', 'SELECT ''{1,2,3}''::real[]');
SELECT gpuivf_calibrate('cal_idx', 'SELECT v FROM cal_queries WHERE id = 1');
SELECT gpuivf_calibrate('cal_idx', 'DELETE FROM cal_queries RETURNING v');
SELECT gpuivf_calibrate('cal_idx', 'SELECT v FROM cal_queries; SELECT v FROM cal_queries');
SELECT gpuivf_calibrate('cal_idx', 'SELECT v FROM no_such_table');
SELECT gpuivf_calibrate('cal_items', 'SELECT v FROM cal_queries');
CREATE TABLE cal_empty (v real[]);
CREATE INDEX cal_empty_idx ON cal_empty USING gpuivf (v);
SELECT gpuivf_calibrate('cal_empty_idx', 'SELECT v FROM cal_queries');
CREATE TABLE cal_parted (id int, v real[]) PARTITION BY RANGE (id);
CREATE TABLE cal_part1 PARTITION OF cal_parted FOR VALUES FROM (0) TO (1000);
CREATE INDEX cal_parted_idx ON cal_parted USING gpuivf (v);
SELECT gpuivf_calibrate('cal_parted_idx', 'SELECT v FROM cal_queries');
\set VERBOSITY default
SELECT gpuivf_calibrate(NULL, 'SELECT 1') IS NULL AS null_index;

DROP TABLE cal_items, cal_queries, cal_empty, cal_parted;
