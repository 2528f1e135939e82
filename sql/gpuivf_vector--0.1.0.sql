-- gpuivf_vector 0.1.0: gpuivf operator classes for pgvector's vector and halfvec
\echo Use "CREATE EXTENSION gpuivf_vector CASCADE" to load this file. \quit

-- The operators are pgvector's own (<->, <#>, <=>): queries written for
-- pgvector's indexes use a gpuivf index unchanged.  Support function 1 of
-- each operator class is gpuivf's computation of the same distance (the
-- metric and the element type of the index are read from it): the one the
-- index re-ranks with, on the CPU and on the GPU alike.  It is the same
-- formula as pgvector's (float32 sums, the square root and the cosine in
-- float8, <#> the negative inner product), summed in gpuivf's fixed order,
-- so it may differ from pgvector's operator in the last bits; exact scans
-- (gpuivf.probes >= lists) order by pgvector's operator itself.

CREATE FUNCTION gpuivf_l2_distance(vector, vector) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpuivf_vector_l2_distance'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION gpuivf_negative_inner_product(vector, vector) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpuivf_vector_negative_inner_product'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION gpuivf_cosine_distance(vector, vector) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpuivf_vector_cosine_distance'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION gpuivf_l2_distance(halfvec, halfvec) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpuivf_halfvec_l2_distance'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION gpuivf_negative_inner_product(halfvec, halfvec) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpuivf_halfvec_negative_inner_product'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION gpuivf_cosine_distance(halfvec, halfvec) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpuivf_halfvec_cosine_distance'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION gpuivf_l2_distance(vector, vector) IS
    'Euclidean distance as a gpuivf index computes it (the <-> operator is pgvector''s)';
COMMENT ON FUNCTION gpuivf_negative_inner_product(vector, vector) IS
    'negative inner product as a gpuivf index computes it (the <#> operator is pgvector''s)';
COMMENT ON FUNCTION gpuivf_cosine_distance(vector, vector) IS
    'cosine distance as a gpuivf index computes it (the <=> operator is pgvector''s)';
COMMENT ON FUNCTION gpuivf_l2_distance(halfvec, halfvec) IS
    'Euclidean distance as a gpuivf index computes it (the <-> operator is pgvector''s)';
COMMENT ON FUNCTION gpuivf_negative_inner_product(halfvec, halfvec) IS
    'negative inner product as a gpuivf index computes it (the <#> operator is pgvector''s)';
COMMENT ON FUNCTION gpuivf_cosine_distance(halfvec, halfvec) IS
    'cosine distance as a gpuivf index computes it (the <=> operator is pgvector''s)';

-- operator classes: operator 1 orders, function 1 tells the index its metric
-- and element type

CREATE OPERATOR CLASS vector_l2_ops
    DEFAULT FOR TYPE vector USING gpuivf AS
    OPERATOR 1 <-> (vector, vector) FOR ORDER BY float_ops,
    FUNCTION 1 gpuivf_l2_distance(vector, vector);

CREATE OPERATOR CLASS vector_ip_ops
    FOR TYPE vector USING gpuivf AS
    OPERATOR 1 <#> (vector, vector) FOR ORDER BY float_ops,
    FUNCTION 1 gpuivf_negative_inner_product(vector, vector);

CREATE OPERATOR CLASS vector_cosine_ops
    FOR TYPE vector USING gpuivf AS
    OPERATOR 1 <=> (vector, vector) FOR ORDER BY float_ops,
    FUNCTION 1 gpuivf_cosine_distance(vector, vector);

CREATE OPERATOR CLASS halfvec_l2_ops
    DEFAULT FOR TYPE halfvec USING gpuivf AS
    OPERATOR 1 <-> (halfvec, halfvec) FOR ORDER BY float_ops,
    FUNCTION 1 gpuivf_l2_distance(halfvec, halfvec);

CREATE OPERATOR CLASS halfvec_ip_ops
    FOR TYPE halfvec USING gpuivf AS
    OPERATOR 1 <#> (halfvec, halfvec) FOR ORDER BY float_ops,
    FUNCTION 1 gpuivf_negative_inner_product(halfvec, halfvec);

CREATE OPERATOR CLASS halfvec_cosine_ops
    FOR TYPE halfvec USING gpuivf AS
    OPERATOR 1 <=> (halfvec, halfvec) FOR ORDER BY float_ops,
    FUNCTION 1 gpuivf_cosine_distance(halfvec, halfvec);
