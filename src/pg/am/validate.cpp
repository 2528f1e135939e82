/*
 * am/validate.cpp — amvalidate: checks that an operator class (and its
 * family) is something a gpuivf index can work with.  Every problem is
 * reported as an INFO message, as the built-in access methods do, and the
 * result says whether there was none.
 *
 * What gpuivf needs of an operator class for type T (real[], or pgvector's
 * vector or halfvec with gpuivf_vector):
 *  - operator 1, FOR ORDER BY a btree family that sorts float8, (T, T) ->
 *    float8; for real[] implemented by support function 1 itself (for
 *    pgvector's types it is pgvector's operator, computing the same
 *    distance in pgvector's summation order);
 *  - support function 1, (T, T) -> float8, one of gpuivf's own distance
 *    functions for T (the index derives its metric and the layout of T's
 *    values from it);
 *  - nothing else: no search operators, no other support numbers.
 */
#include "gpuivf.h"
#include "am/am.h"

#include "access/amvalidate.h"
#include "access/htup_details.h"
#include "catalog/pg_amop.h"
#include "catalog/pg_amproc.h"
#include "catalog/pg_opclass.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_opfamily.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

/*
 * Is this function one of gpuivf's distance functions, for this type?  A
 * real[] one for real[]; a pgvector one (gpuivf_vector) for another type,
 * whose name the signature check binds (pgvector's types have no fixed
 * OIDs; gpuivf_vector declares each function on its type).
 */
static bool
GpuivfIsDistanceFunction(Oid procoid, Oid type)
{
    FmgrInfo    finfo;
    GpuivfOpclassInfo info;

    fmgr_info(procoid, &finfo);
    if (!GpuivfDistanceFunctionInfo(finfo.fn_addr, &info))
        return false;
    return (info.type == GPUIVF_TYPE_REAL_ARRAY) == (type == FLOAT4ARRAYOID);
}

/* Validates one operator class of gpuivf (and the family it belongs to). */
bool
gpuivfvalidate(Oid opclassoid)
{
    bool        result = true;
    HeapTuple   classtup;
    HeapTuple   familytup;
    Form_pg_opclass classform;
    Form_pg_opfamily familyform;
    Oid         opfamilyoid;
    Oid         opcintype;
    char       *opclassname;
    char       *opfamilyname;
    CatCList   *oprlist;
    CatCList   *proclist;
    List       *groups;
    ListCell   *lc;
    Oid         distance_proc = InvalidOid;
    bool        class_has_operator = false;
    bool        class_has_function = false;

    classtup = SearchSysCache1(CLAOID, ObjectIdGetDatum(opclassoid));
    if (!HeapTupleIsValid(classtup))
        elog(ERROR, "cache lookup failed for operator class %u", opclassoid);
    classform = (Form_pg_opclass) GETSTRUCT(classtup);
    opfamilyoid = classform->opcfamily;
    opcintype = classform->opcintype;
    opclassname = NameStr(classform->opcname);

    familytup = SearchSysCache1(OPFAMILYOID, ObjectIdGetDatum(opfamilyoid));
    if (!HeapTupleIsValid(familytup))
        elog(ERROR, "cache lookup failed for operator family %u", opfamilyoid);
    familyform = (Form_pg_opfamily) GETSTRUCT(familytup);
    opfamilyname = NameStr(familyform->opfname);

    oprlist = SearchSysCacheList1(AMOPSTRATEGY, ObjectIdGetDatum(opfamilyoid));
    proclist = SearchSysCacheList1(AMPROCNUM, ObjectIdGetDatum(opfamilyoid));

    /* support functions */
    for (int i = 0; i < proclist->n_members; i++)
    {
        HeapTuple   proctup = &proclist->members[i]->tuple;
        Form_pg_amproc procform = (Form_pg_amproc) GETSTRUCT(proctup);

        if (procform->amprocnum != GPUIVF_DISTANCE_PROC)
        {
            ereport(INFO,
                    (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                     errmsg("operator family \"%s\" of access method %s contains function %s with invalid support number %d",
                            opfamilyname, "gpuivf", format_procedure(procform->amproc),
                            procform->amprocnum)));
            result = false;
            continue;
        }
        if (procform->amproclefttype != procform->amprocrighttype ||
            !check_amproc_signature(procform->amproc, FLOAT8OID, true, 2, 2,
                                    procform->amproclefttype, procform->amprocrighttype))
        {
            ereport(INFO,
                    (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                     errmsg("operator family \"%s\" of access method %s contains function %s with wrong signature for support number %d",
                            opfamilyname, "gpuivf", format_procedure(procform->amproc),
                            procform->amprocnum)));
            result = false;
            continue;
        }
        if (!GpuivfIsDistanceFunction(procform->amproc, procform->amproclefttype))
        {
            ereport(INFO,
                    (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                     errmsg("operator family \"%s\" of access method %s contains function %s as support function %d, which is not a gpuivf distance function",
                            opfamilyname, "gpuivf", format_procedure(procform->amproc),
                            procform->amprocnum)));
            result = false;
            continue;
        }
        if (procform->amproclefttype == opcintype && procform->amprocrighttype == opcintype)
        {
            class_has_function = true;
            distance_proc = procform->amproc;
        }
    }

    /* operators */
    for (int i = 0; i < oprlist->n_members; i++)
    {
        HeapTuple   oprtup = &oprlist->members[i]->tuple;
        Form_pg_amop oprform = (Form_pg_amop) GETSTRUCT(oprtup);

        if (oprform->amopstrategy != GPUIVF_DISTANCE_STRATEGY)
        {
            ereport(INFO,
                    (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                     errmsg("operator family \"%s\" of access method %s contains operator %s with invalid strategy number %d",
                            opfamilyname, "gpuivf", format_operator(oprform->amopopr),
                            oprform->amopstrategy)));
            result = false;
            continue;
        }
        if (oprform->amoppurpose != AMOP_ORDER)
        {
            ereport(INFO,
                    (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                     errmsg("operator family \"%s\" of access method %s contains search operator %s",
                            opfamilyname, "gpuivf", format_operator(oprform->amopopr)),
                     errdetail("gpuivf supports operators only for ORDER BY.")));
            result = false;
            continue;
        }
        if (!OidIsValid(oprform->amopsortfamily) ||
            !opfamily_can_sort_type(oprform->amopsortfamily, FLOAT8OID))
        {
            ereport(INFO,
                    (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                     errmsg("operator family \"%s\" of access method %s contains invalid ORDER BY specification for operator %s",
                            opfamilyname, "gpuivf", format_operator(oprform->amopopr))));
            result = false;
            continue;
        }
        if (oprform->amoplefttype != oprform->amoprighttype ||
            !check_amop_signature(oprform->amopopr, FLOAT8OID,
                                  oprform->amoplefttype, oprform->amoprighttype))
        {
            ereport(INFO,
                    (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                     errmsg("operator family \"%s\" of access method %s contains operator %s with wrong signature",
                            opfamilyname, "gpuivf", format_operator(oprform->amopopr))));
            result = false;
            continue;
        }
        if (oprform->amoplefttype == opcintype && oprform->amoprighttype == opcintype)
        {
            class_has_operator = true;
            /* for real[] the scan's order-by values are support function 1's,
             * which must then be the operator's own */
            if (OidIsValid(distance_proc) && opcintype == FLOAT4ARRAYOID &&
                get_opcode(oprform->amopopr) != distance_proc)
            {
                ereport(INFO,
                        (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                         errmsg("operator family \"%s\" of access method %s contains operator %s whose function is not support function %d (%s)",
                                opfamilyname, "gpuivf", format_operator(oprform->amopopr),
                                GPUIVF_DISTANCE_PROC, format_procedure(distance_proc))));
                result = false;
            }
        }
    }

    /* every type pair of the family needs both members */
    groups = identify_opfamily_groups(oprlist, proclist);
    foreach(lc, groups)
    {
        OpFamilyOpFuncGroup *group = (OpFamilyOpFuncGroup *) lfirst(lc);

        if ((group->operatorset & (((uint64) 1) << GPUIVF_DISTANCE_STRATEGY)) == 0)
        {
            ereport(INFO,
                    (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                     errmsg("operator family \"%s\" of access method %s is missing operator %d for types %s and %s",
                            opfamilyname, "gpuivf", GPUIVF_DISTANCE_STRATEGY,
                            format_type_be(group->lefttype), format_type_be(group->righttype))));
            result = false;
        }
        if ((group->functionset & (((uint64) 1) << GPUIVF_DISTANCE_PROC)) == 0)
        {
            ereport(INFO,
                    (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                     errmsg("operator family \"%s\" of access method %s is missing support function %d for types %s and %s",
                            opfamilyname, "gpuivf", GPUIVF_DISTANCE_PROC,
                            format_type_be(group->lefttype), format_type_be(group->righttype))));
            result = false;
        }
    }

    /* and the class itself needs them for its input type */
    if (!class_has_operator)
    {
        ereport(INFO,
                (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                 errmsg("operator class \"%s\" of access method %s is missing operator %d",
                        opclassname, "gpuivf", GPUIVF_DISTANCE_STRATEGY)));
        result = false;
    }
    if (!class_has_function)
    {
        ereport(INFO,
                (errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
                 errmsg("operator class \"%s\" of access method %s is missing support function %d",
                        opclassname, "gpuivf", GPUIVF_DISTANCE_PROC)));
        result = false;
    }

    ReleaseCatCacheList(proclist);
    ReleaseCatCacheList(oprlist);
    ReleaseSysCache(familytup);
    ReleaseSysCache(classtup);

    return result;
}
