/*
 * calibration/sample.h — private to calibration/: the rows of an index as a
 * calibration reads them, the queries of a calibration (a sample of rows,
 * or query vectors with no row of their own: self ids UINT64_MAX), and the
 * measurement (curve.cpp).
 */
#ifndef GPUIVF_CALIBRATION_SAMPLE_H
#define GPUIVF_CALIBRATION_SAMPLE_H

#include "gpuivf.h"
#include "calibration/calibration.h"

/* Receives the rows of the index one at a time: raw vector, entry id (what
 * list entries hold) and heap TID (the same without stored vectors). */
typedef void (*RowSinkFn) (void *arg, const float4 *x, uint64 id, uint64 heap_id);

/* All rows of the index, from its vector pages or (no vectors) the heap. */
void        WalkIndexedRows(Relation index, Relation heap, const GpuivfMetaPageData *meta,
                            RowSinkFn sink, void *arg);

/* The queries: the cap rows with the smallest hash of their vector
 * (utils.cpp's sampling by hash; the heap TID breaks ties).  While rows are offered they sit in slots;
 * CalibSampleFinish puts the sample in key order at queries[0 .. nq). */
struct CalibSample
{
    int         cap;
    int         nq;             /* rows in the sample (after finishing) */
    int         dims;
    bool        finished;
    int64       seen;           /* rows offered */
    float4     *queries;        /* slots * dims, raw */
    uint64     *self_ids;       /* entry id of each query's own row */
    uint64     *self_heap_ids;  /* and its heap TID */
    GpuivfBottomK *keys;
};
typedef struct CalibSample CalibSample;

/* An empty sample of up to cap rows of dims (the current memory context). */
void        CalibSampleInit(CalibSample *s, int cap, int dims);
/* A RowSinkFn: one row offered to the sample. */
void        SampleSink(void *arg, const float4 *x, uint64 id, uint64 heap_id);
/* The sample in key order at queries[0 .. nq); nothing is offered after. */
void        CalibSampleFinish(CalibSample *s);

/* curve.cpp: measure the curves of ks[0..nk) (ascending) into calib
 * (calib_k, calib_npoints, calib_nprobe, calib_recall, calib_rerank) on the
 * queries of sample, whose exact top ks[nk - 1] are truth (entry ids),
 * each stage's queries shared out by helpers (may be NULL) when they ran the
 * truth; false when the index was rebuilt meanwhile. */
bool        MeasureCurves(Relation index, const GpuivfMetaPageData *meta,
                          const CalibSample *sample, const uint64 *truth, const int *ks, int nk,
                          GpuivfTruthHelpers *helpers, GpuivfMetaPageData *calib);

#endif                          /* GPUIVF_CALIBRATION_SAMPLE_H */
