-- amvalidate accepts gpuivf's operator classes and reports what is wrong
-- with broken ones; an index cannot be built on an opclass whose support
-- function is not a gpuivf distance function.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpuivf;
RESET client_min_messages;

SELECT opcname, amvalidate(oid) FROM pg_opclass
WHERE opcmethod = (SELECT oid FROM pg_am WHERE amname = 'gpuivf') ORDER BY opcname;

-- a support function that is not one of gpuivf's distance functions
CREATE FUNCTION my_distance(real[], real[]) RETURNS float8
    LANGUAGE sql IMMUTABLE STRICT AS 'SELECT 0::float8';
CREATE OPERATOR CLASS bad_function_ops FOR TYPE real[] USING gpuivf AS
    OPERATOR 1 <-> (real[], real[]) FOR ORDER BY float_ops,
    FUNCTION 1 my_distance(real[], real[]);
SELECT amvalidate(oid) FROM pg_opclass WHERE opcname = 'bad_function_ops';
CREATE TABLE val_items (v real[]);
INSERT INTO val_items VALUES ('{1,2}'), ('{3,4}');
CREATE INDEX ON val_items USING gpuivf (v bad_function_ops);

-- inner_product (positive) is not a distance the index orders by
CREATE OPERATOR CLASS bad_ip_ops FOR TYPE real[] USING gpuivf AS
    OPERATOR 1 <#> (real[], real[]) FOR ORDER BY float_ops,
    FUNCTION 1 inner_product(real[], real[]);
SELECT amvalidate(oid) FROM pg_opclass WHERE opcname = 'bad_ip_ops';

-- the operator and the support function disagree on the metric
CREATE OPERATOR CLASS bad_pair_ops FOR TYPE real[] USING gpuivf AS
    OPERATOR 1 <=> (real[], real[]) FOR ORDER BY float_ops,
    FUNCTION 1 l2_distance(real[], real[]);
SELECT amvalidate(oid) FROM pg_opclass WHERE opcname = 'bad_pair_ops';

-- members missing
CREATE OPERATOR CLASS bad_no_function_ops FOR TYPE real[] USING gpuivf AS
    OPERATOR 1 <-> (real[], real[]) FOR ORDER BY float_ops;
SELECT amvalidate(oid) FROM pg_opclass WHERE opcname = 'bad_no_function_ops';
CREATE OPERATOR CLASS bad_no_operator_ops FOR TYPE real[] USING gpuivf AS
    FUNCTION 1 l2_distance(real[], real[]);
SELECT amvalidate(oid) FROM pg_opclass WHERE opcname = 'bad_no_operator_ops';

-- an ordering operator sorted by a family that cannot sort float8
CREATE OPERATOR CLASS bad_sort_ops FOR TYPE real[] USING gpuivf AS
    OPERATOR 1 <-> (real[], real[]) FOR ORDER BY integer_ops,
    FUNCTION 1 l2_distance(real[], real[]);
SELECT amvalidate(oid) FROM pg_opclass WHERE opcname = 'bad_sort_ops';

-- numbers outside what the access method declares are refused at once
CREATE OPERATOR CLASS bad_number_ops FOR TYPE real[] USING gpuivf AS
    OPERATOR 2 <-> (real[], real[]) FOR ORDER BY float_ops;
CREATE OPERATOR CLASS bad_number_ops FOR TYPE real[] USING gpuivf AS
    FUNCTION 2 l2_distance(real[], real[]);

-- the built-in classes are still fine
SELECT bool_and(amvalidate(oid)) AS all_valid FROM pg_opclass
WHERE opcmethod = (SELECT oid FROM pg_am WHERE amname = 'gpuivf')
  AND opcname IN ('float4_l2_ops', 'float4_ip_ops', 'float4_cosine_ops');

DROP TABLE val_items;
DROP OPERATOR CLASS bad_function_ops USING gpuivf;
DROP OPERATOR CLASS bad_ip_ops USING gpuivf;
DROP OPERATOR CLASS bad_pair_ops USING gpuivf;
DROP OPERATOR CLASS bad_no_function_ops USING gpuivf;
DROP OPERATOR CLASS bad_no_operator_ops USING gpuivf;
DROP OPERATOR CLASS bad_sort_ops USING gpuivf;
DROP OPERATOR FAMILY bad_function_ops USING gpuivf;
DROP OPERATOR FAMILY bad_ip_ops USING gpuivf;
DROP OPERATOR FAMILY bad_pair_ops USING gpuivf;
DROP OPERATOR FAMILY bad_no_function_ops USING gpuivf;
DROP OPERATOR FAMILY bad_no_operator_ops USING gpuivf;
DROP OPERATOR FAMILY bad_sort_ops USING gpuivf;
DROP FUNCTION my_distance(real[], real[]);
