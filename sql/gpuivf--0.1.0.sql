-- gpuivf 0.1.0: IVF-PQ nearest-neighbour index for real[]
\echo Use "CREATE EXTENSION gpuivf" to load this file. \quit

-- distance functions on real[]: the same engine functions the index uses

CREATE FUNCTION l2_distance(real[], real[]) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpuivf_l2_distance'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION inner_product(real[], real[]) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpuivf_inner_product'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION negative_inner_product(real[], real[]) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpuivf_negative_inner_product'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION cosine_distance(real[], real[]) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpuivf_cosine_distance'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION l2_distance(real[], real[]) IS 'Euclidean distance';
COMMENT ON FUNCTION inner_product(real[], real[]) IS 'inner (dot) product';
COMMENT ON FUNCTION negative_inner_product(real[], real[]) IS 'negative inner product (the <#> operator)';
COMMENT ON FUNCTION cosine_distance(real[], real[]) IS 'cosine distance: 1 - cosine similarity';

-- operators

CREATE OPERATOR <-> (
    LEFTARG = real[], RIGHTARG = real[], FUNCTION = l2_distance,
    COMMUTATOR = '<->'
);

CREATE OPERATOR <#> (
    LEFTARG = real[], RIGHTARG = real[], FUNCTION = negative_inner_product,
    COMMUTATOR = '<#>'
);

CREATE OPERATOR <=> (
    LEFTARG = real[], RIGHTARG = real[], FUNCTION = cosine_distance,
    COMMUTATOR = '<=>'
);

-- the access method

CREATE FUNCTION gpuivfhandler(internal) RETURNS index_am_handler
    AS 'MODULE_PATHNAME', 'gpuivfhandler'
    LANGUAGE C;

CREATE ACCESS METHOD gpuivf TYPE INDEX HANDLER gpuivfhandler;

COMMENT ON ACCESS METHOD gpuivf IS 'IVF-PQ index for nearest-neighbour search on real[]';

-- operator classes: operator 1 orders, function 1 tells the index its metric

CREATE OPERATOR CLASS float4_l2_ops
    DEFAULT FOR TYPE real[] USING gpuivf AS
    OPERATOR 1 <-> (real[], real[]) FOR ORDER BY float_ops,
    FUNCTION 1 l2_distance(real[], real[]);

CREATE OPERATOR CLASS float4_ip_ops
    FOR TYPE real[] USING gpuivf AS
    OPERATOR 1 <#> (real[], real[]) FOR ORDER BY float_ops,
    FUNCTION 1 negative_inner_product(real[], real[]);

CREATE OPERATOR CLASS float4_cosine_ops
    FOR TYPE real[] USING gpuivf AS
    OPERATOR 1 <=> (real[], real[]) FOR ORDER BY float_ops,
    FUNCTION 1 cosine_distance(real[], real[]);

-- inspection and verification (the amcheck of gpuivf)

CREATE FUNCTION gpuivf_index_info(regclass) RETURNS jsonb
    AS 'MODULE_PATHNAME', 'gpuivf_index_info'
    LANGUAGE C STRICT;

COMMENT ON FUNCTION gpuivf_index_info(regclass) IS
    'dims, metric, lists, PQ settings, counts and list sizes of a gpuivf index';

CREATE FUNCTION gpuivf_verify(regclass, heapallindexed boolean DEFAULT false) RETURNS void
    AS 'MODULE_PATHNAME', 'gpuivf_verify'
    LANGUAGE C STRICT;

COMMENT ON FUNCTION gpuivf_verify(regclass, boolean) IS
    'checks a gpuivf index for consistency; with heapallindexed, that every row is indexed once';

-- calibration on given queries: the caller must own the table (as for
-- ANALYZE) and be able to read it; the query runs with the caller's rights

CREATE FUNCTION gpuivf_calibrate(index regclass, query text) RETURNS jsonb
    AS 'MODULE_PATHNAME', 'gpuivf_calibrate'
    LANGUAGE C CALLED ON NULL INPUT VOLATILE;

COMMENT ON FUNCTION gpuivf_calibrate(regclass, text) IS
    'calibrates a gpuivf index on the query vectors the first column of query returns (NULL: on its rows again)';

-- The GPU workers: one row per worker, none when
-- gpuivf is not in shared_preload_libraries

CREATE FUNCTION gpuivf_stat(
    OUT worker integer, OUT pid integer, OUT state text, OUT device integer,
    OUT device_name text, OUT requests bigint, OUT queries bigint, OUT batches bigint,
    OUT mean_batch_size double precision, OUT max_batch_size bigint,
    OUT mean_queue_wait_ms double precision, OUT gpu_time_ms double precision,
    OUT indexes_cached integer, OUT bytes_cached bigint, OUT cpu_fallbacks bigint,
    OUT errors bigint, OUT loads bigint, OUT refreshes bigint, OUT evictions bigint,
    OUT builds bigint, OUT exact_knn bigint, OUT message text, OUT started_at timestamptz)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'gpuivf_stat'
    LANGUAGE C STRICT VOLATILE;

CREATE VIEW gpuivf_stat AS SELECT * FROM gpuivf_stat();

-- Like pg_stat_statements' view, gpuivf_stat is readable by every role, as
-- the function behind it is: it shows the workers' state and counters, no
-- table data and no query text.  The functions that take an index
-- (gpuivf_index_info, gpuivf_verify, gpuivf_worker_search) are executable by
-- every role and check SELECT on the index's table themselves.
GRANT SELECT ON gpuivf_stat TO PUBLIC;

COMMENT ON VIEW gpuivf_stat IS
    'gpuivf GPU workers: state, requests, batching, queue wait, GPU time, cache, CPU fallbacks, errors, builds, exact kNN for ANALYZE';

CREATE FUNCTION gpuivf_worker_search(index regclass, query real[], k integer,
    nprobe integer DEFAULT 0, OUT heap_tid tid, OUT distance double precision)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'gpuivf_worker_search'
    LANGUAGE C STRICT VOLATILE;

COMMENT ON FUNCTION gpuivf_worker_search(regclass, real[], integer, integer) IS
    'the k nearest rows as the gpuivf GPU worker answers them (diagnostic; nprobe 0 = the probes a scan of the index uses)';
