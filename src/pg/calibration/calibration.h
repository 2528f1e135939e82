/*
 * calibration/calibration.h — ANALYZE calibration: the recall curve of an
 * index measured against exact results (curve.cpp) on a sample of its rows
 * with their ground truth (sample.cpp), stored in the metapage.  Scans read
 * the curve through search/probes.cpp.
 */
#ifndef GPUIVF_CALIBRATION_H
#define GPUIVF_CALIBRATION_H

#include "gpuivf.h"
#define GPUIVF_CALIBRATION_K        10      /* recall@10 is measured */
#define GPUIVF_DEFAULT_ANALYZE_SAMPLE 200
#define GPUIVF_MAX_ANALYZE_SAMPLE   10000

/* The calibration's queries: a reservoir sample of the index's rows (raw
 * vector, entry id, heap TID).  Calibration draws it by walking the rows;
 * CREATE INDEX draws it while its encoding scan hands the rows over (in the
 * order the walk would see them), which saves calibration that walk. */
typedef struct CalibSample GpuivfCalibSample;
GpuivfCalibSample *GpuivfCalibSampleBegin(int dims);   /* NULL when calibration is off */
void        GpuivfCalibSampleAdd(GpuivfCalibSample *sample, const float4 *x, uint64 id,
                                 uint64 heap_id);

/* Measure the curve of an index and store it in the metapage.  heap may be
 * NULL (opened when needed); drawn: the sample, drawn over every row of the
 * index, or NULL (drawn here).  Returns false when nothing was stored
 * (untrained, too few rows, gpuivf.analyze_sample = 0, rebuilt meanwhile). */
bool        GpuivfCalibrate(Relation index, Relation heap, const GpuivfCalibSample *drawn);
/* Would calibrating an index of meta's shape search through the GPU worker
 * (gpuivf.device not cpu, a worker up, every point within its limits)? */
bool        GpuivfCalibrationSearchesOnGpu(Relation index, const GpuivfMetaPageData *meta);
/* Should VACUUM (which hides a following ANALYZE from the AM) re-measure?
 * True when the index has no curve or its size changed by 10% or more. */
bool        GpuivfCalibrationIsStale(const GpuivfMetaPageData *meta);
/* The seam for ground truth: exact top-k (entry ids, ascending by score,
 * padded with UINT64_MAX) of nq raw queries among all rows of the index,
 * each query's own entry exclude_ids[i] left out.  On the GPU worker when
 * one is up (gpuivf.device not cpu), else on the CPU: the same result.
 * *on_gpu (may be NULL): the worker computed all of it. */
void        GpuivfExactKnnForCalibration(Relation index, Relation heap,
                                         const GpuivfMetaPageData *meta, int nq,
                                         const float4 *queries, const uint64 *exclude_ids,
                                         int k, uint64 *out_ids, float *out_scores,
                                         bool *on_gpu);
#endif                          /* GPUIVF_CALIBRATION_H */
