-- What a dump and restore does to a table with a gpuivf index, emulated
-- inside one database (pg_regress cannot run pg_dump; a TAP test runs the
-- real pg_dump/pg_restore): the index definition survives as DDL, the rows
-- are copied into a new table, the index is built again there, and both
-- answer the same.  Then REINDEX and REINDEX CONCURRENTLY.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;
SET max_parallel_workers_per_gather = 0;

CREATE TABLE dump_items (id int PRIMARY KEY, v real[]);
SELECT setseed(0.55);
INSERT INTO dump_items
SELECT i, ARRAY(SELECT ((i % 9) * 0.5 + random())::real FROM generate_series(1, 24) j WHERE i > 0)
FROM generate_series(1, 1500) i;
CREATE INDEX dump_idx ON dump_items USING gpuivf (v float4_cosine_ops)
    WITH (lists = 4, pq_m = 6, pq_bits = 4);

-- the definition as pg_dump would write it
SELECT pg_get_indexdef('dump_idx'::regclass);

-- "restore": data first, then the index from its definition
CREATE TABLE dump_restored (LIKE dump_items INCLUDING ALL EXCLUDING INDEXES);
INSERT INTO dump_restored SELECT * FROM dump_items ORDER BY id;
SELECT replace(replace(pg_get_indexdef('dump_idx'::regclass), 'dump_idx', 'dump_restored_idx'),
               'dump_items', 'dump_restored') AS ddl \gset
:ddl;
SELECT pg_get_indexdef('dump_restored_idx'::regclass);
SELECT gpuivf_verify('dump_restored_idx', true);

-- same answers, approximate and exact
CREATE FUNCTION pg_temp.knn_ids(tab text, q real[], k int) RETURNS int[]
LANGUAGE plpgsql AS $$
DECLARE
    ids int[];
BEGIN
    EXECUTE format('SELECT array_agg(id) FROM (SELECT id FROM %I ORDER BY v <=> $1 LIMIT %s) s', tab, k)
        INTO ids USING q;
    RETURN ids;
END $$;
SET enable_seqscan = off;
SELECT count(*) FILTER (WHERE pg_temp.knn_ids('dump_items', v, 10) = pg_temp.knn_ids('dump_restored', v, 10))
       AS same, count(*) AS queries
FROM dump_items WHERE id % 150 = 0;
SET gpuivf.probes = 4;
SELECT count(*) FILTER (WHERE pg_temp.knn_ids('dump_items', v, 50) = pg_temp.knn_ids('dump_restored', v, 50))
       AS same, count(*) AS queries
FROM dump_items WHERE id % 150 = 0;
RESET gpuivf.probes;

-- REINDEX builds the same index again
SELECT array_agg(pg_temp.knn_ids('dump_items', v, 10) ORDER BY id) AS before FROM dump_items
WHERE id % 300 = 0 \gset
REINDEX INDEX dump_idx;
SELECT array_agg(pg_temp.knn_ids('dump_items', v, 10) ORDER BY id) = :'before' AS same_after_reindex
FROM dump_items WHERE id % 300 = 0;
REINDEX INDEX CONCURRENTLY dump_idx;
SELECT array_agg(pg_temp.knn_ids('dump_items', v, 10) ORDER BY id) = :'before' AS same_after_reindex_concurrently
FROM dump_items WHERE id % 300 = 0;
SELECT gpuivf_verify('dump_idx', true);
RESET enable_seqscan;

-- the extension's objects belong to it (pg_dump writes CREATE EXTENSION only)
SELECT count(*) AS extension_members FROM pg_depend
WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'gpuivf') AND deptype = 'e';

DROP TABLE dump_items, dump_restored;
