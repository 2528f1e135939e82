#!/usr/bin/env python3
"""Helpers of test/gpu/worker_end_to_end.sh and the scripts on test/gpu/cluster_lib.sh (numpy only).

  gen OUTDIR ROWS DIMS NQ [K] clustered vectors as PostgreSQL binary COPY files:
                              OUTDIR/base.bin (id bigint, v real[]),
                              OUTDIR/queries.bin (qid bigint, v real[]); with K,
                              also OUTDIR/gt.txt, every query's exact top-K (L2)
                              as "qid|{ids}|{distances}" lines
  fvecs OUTDIR ROWS DIMS NQ   the same vectors as a data set for test/bench/run
                              --dataset: OUTDIR/gen_base.fvecs, gen_query.fvecs and
                              gen_groundtruth.ivecs (exact L2 top-100, float64 on the
                              GPU with torch when there is one, else numpy)
  gt OUTDIR                   OUTDIR/gen_groundtruth.ivecs (exact L2 top-100, as for
                              fvecs) of OUTDIR/gen_base.fvecs and gen_query.fvecs
                              written by another generator
  compare A B                 two files of "qid|{ids}|{distances}" lines: how many
                              queries have identical ids (in order), identical id
                              sets, and the max distance difference
  recall RESULT TRUTH         recall@k of RESULT against TRUTH (same format)
  latency LOGPREFIX           p50 / p99 / mean latency (ms) from pgbench -l logs
  truth GT.ivecs DIST.fvecs N ground truth (gpuivf_gt output) of the first N
                              queries in the same "qid|{ids}|{distances}" format
  lists INDEXFILE QUERIES.bin PROBES [SCALE]
                              an L2 gpuivf index's list sizes and the scan work of
                              the queries (binary COPY, times SCALE) at PROBES:
                              per query the codes of its probed lists (the work
                              of a batch) and its largest probed list (the
                              longest scan block of a lone query, one list a
                              block); read from the index's pages (metapage,
                              centroids, directory; src/pg/README.md), after a
                              CHECKPOINT
"""
import glob
import struct
import sys

import numpy as np


def copy_binary(path, ids, x, id_type):
    n, d = x.shape
    if id_type == 'int8':
        idfmt, idlen = '>q', 8
    else:
        idfmt, idlen = '>i', 4
    header = b'PGCOPY\n\xff\r\n\x00' + struct.pack('>ii', 0, 0)
    arr_hdr = struct.pack('>iiIii', 1, 0, 700, d, 1)  # ndim, hasnull, float4, dim, lbound
    arr_len = len(arr_hdr) + d * 8
    row = np.dtype([
        ('nf', '>i2'), ('idl', '>i4'), ('id', idfmt), ('al', '>i4'),
        ('ah', 'V%d' % len(arr_hdr)), ('el', [('l', '>i4'), ('v', '>f4')], (d,))])
    rows = np.zeros(n, dtype=row)
    rows['nf'] = 2
    rows['idl'] = idlen
    rows['id'] = ids
    rows['al'] = arr_len
    rows['ah'] = np.frombuffer(arr_hdr, dtype='V%d' % len(arr_hdr))[0]
    rows['el']['l'] = 4
    rows['el']['v'] = x
    with open(path, 'wb') as f:
        f.write(header)
        f.write(rows.tobytes())
        f.write(struct.pack('>h', -1))


def exact_topk(base, qs, k, chunk=200000):
    """Ids and L2 distances of every query's k nearest rows (row numbers):
    squared distances by GEMM per chunk of rows, the chunk's k best kept,
    the final k re-scored exactly in float64."""
    qn = (qs.astype(np.float64) ** 2).sum(1)[:, None]
    best_i = np.zeros((len(qs), 0), dtype=np.int64)
    best_d = np.zeros((len(qs), 0), dtype=np.float64)
    for s in range(0, len(base), chunk):
        x = base[s:s + chunk]
        d = qn - 2.0 * (qs @ x.T).astype(np.float64) + (x.astype(np.float64) ** 2).sum(1)[None, :]
        kk = min(k, d.shape[1])
        part = np.argpartition(d, kk - 1, axis=1)[:, :kk]
        best_i = np.concatenate([best_i, part + s], axis=1)
        best_d = np.concatenate([best_d, np.take_along_axis(d, part, 1)], axis=1)
        keep = np.argsort(best_d, axis=1, kind='stable')[:, :k]
        best_i = np.take_along_axis(best_i, keep, 1)
        best_d = np.take_along_axis(best_d, keep, 1)
    exact = np.sqrt(((base[best_i].astype(np.float64) - qs[:, None, :].astype(np.float64)) ** 2).sum(2))
    order = np.argsort(exact, axis=1, kind="stable")
    return np.take_along_axis(best_i, order, 1), np.take_along_axis(exact, order, 1)


def gen(outdir, n, d, nq, k=0):
    base, qs = clustered(n, d, nq)
    copy_binary(outdir + '/base.bin', np.arange(n, dtype=np.int64), base, 'int8')
    copy_binary(outdir + '/queries.bin', np.arange(nq, dtype=np.int64), qs, 'int8')
    if k > 0:
        ids, dist = exact_topk(base, qs, k)
        with open(outdir + '/gt.txt', 'w') as f:
            for q in range(nq):
                f.write('%d|{%s}|{%s}\n' % (q, ','.join(str(i) for i in ids[q]),
                                             ','.join(repr(float(x)) for x in dist[q])))


def clustered(n, d, nq):
    rng = np.random.default_rng(20261121)
    nc = 1000
    centers = rng.normal(0.0, 1.0, size=(nc, d)).astype(np.float32)
    scale = 0.35
    base = centers[rng.integers(0, nc, size=n)] + rng.normal(0.0, scale, size=(n, d)).astype(np.float32)
    qs = centers[rng.integers(0, nc, size=nq)] + rng.normal(0.0, scale, size=(nq, d)).astype(np.float32)
    return base.astype(np.float32), qs.astype(np.float32)


def write_vecs(path, x, dtype):
    n, d = x.shape
    out = np.empty((n, d + 1), dtype=np.int32)
    out[:, 0] = d
    out[:, 1:] = x.astype(dtype).view(np.int32)
    out.tofile(path)


def exact_top(base, qs, k):
    """Exact L2 top-k ids of every query (float64 sums: no near-tie swaps)."""
    try:
        import torch
        if torch.cuda.is_available():
            q = torch.from_numpy(qs).double().cuda()
            qn = (q * q).sum(1, keepdim=True)
            best_d = best_i = None
            for s in range(0, len(base), 200000):
                b = torch.from_numpy(base[s:s + 200000]).double().cuda()
                dist = qn - 2 * q @ b.T + (b * b).sum(1)[None, :]
                d, i = torch.topk(dist, min(k, dist.shape[1]), dim=1, largest=False)
                i += s
                if best_d is None:
                    best_d, best_i = d, i
                else:
                    d = torch.cat([best_d, d], 1)
                    i = torch.cat([best_i, i], 1)
                    best_d, j = torch.topk(d, k, dim=1, largest=False)
                    best_i = torch.gather(i, 1, j)
            return best_i.cpu().numpy().astype(np.int32)
    except ImportError:
        pass
    return exact_topk(base, qs, k)[0].astype(np.int32)


def write_truth(outdir, base, qs):
    write_vecs(outdir + '/gen_groundtruth.ivecs', exact_top(base, qs, 100), np.int32)


def fvecs(outdir, n, d, nq):
    base, qs = clustered(n, d, nq)
    write_vecs(outdir + '/gen_base.fvecs', base, np.float32)
    write_vecs(outdir + '/gen_query.fvecs', qs, np.float32)
    write_truth(outdir, base, qs)


def gt(outdir):
    write_truth(outdir, read_vecs(outdir + '/gen_base.fvecs', np.float32),
                read_vecs(outdir + '/gen_query.fvecs', np.float32))


def read_results(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        qid, ids, dist = line.split('|')
        ids = [v.strip('"') for v in ids.strip('{}').split(',') if v]
        dist = [float(v) for v in dist.strip('{}').split(',') if v]
        out[int(qid)] = (ids, dist)
    return out


def compare(a, b):
    ra, rb = read_results(a), read_results(b)
    same_order = same_set = 0
    maxdiff = 0.0
    overlap = 0
    total = 0
    for q in ra:
        ia, da = ra[q]
        ib, db = rb.get(q, ([], []))
        same_order += ia == ib
        same_set += set(ia) == set(ib)
        overlap += len(set(ia) & set(ib))
        total += max(len(ia), 1)
        if ia == ib:
            maxdiff = max([maxdiff] + [abs(x - y) for x, y in zip(da, db)])
    print('queries=%d same_ids_in_order=%d same_id_sets=%d id_overlap=%.5f max_distance_diff=%.3g'
          % (len(ra), same_order, same_set, overlap / max(total, 1), maxdiff))


def recall(res, truth):
    r, t = read_results(res), read_results(truth)
    hit = tot = 0
    for q, (ids, _) in t.items():
        got = set(r.get(q, ([], []))[0])
        hit += len(got & set(ids))
        tot += len(ids)
    print('%.4f' % (hit / max(tot, 1)))


def latency(prefix):
    lat = []
    for f in glob.glob(prefix + '*'):
        for line in open(f):
            p = line.split()
            if len(p) >= 3:
                lat.append(int(p[2]) / 1000.0)
    if not lat:
        print('p50=nan p99=nan')
        return
    a = np.array(lat)
    print('p50=%.3f p99=%.3f mean=%.3f n=%d' % (np.percentile(a, 50), np.percentile(a, 99), a.mean(), len(a)))


def read_copy_vectors(path):
    """The vectors of a binary COPY file as copy_binary writes it."""
    raw = open(path, 'rb').read()
    d = struct.unpack_from('>i', raw, 19 + 2 + 4 + 8 + 4 + 12)[0]
    row = 2 + 4 + 8 + 4 + 20 + 8 * d
    n = (len(raw) - 19 - 2) // row
    rows = np.frombuffer(raw, dtype=np.uint8, count=n * row, offset=19).reshape(n, row)
    vals = rows[:, 2 + 4 + 8 + 4 + 20:].copy().view('>i4').reshape(n, d, 2)[:, :, 1]
    return vals.astype('>i4').view('>f4').astype(np.float32)


def index_lists(path):
    """Centroids (lists x dims) and live entries per list of a gpuivf index
    file (segments path, path.1, ...: 1 GB each)."""
    bs, seg = 8192, 131072

    def page(b):
        name = path if b < seg else '%s.%d' % (path, b // seg)
        with open(name, 'rb') as f:
            f.seek((b % seg) * bs)
            return f.read(bs)
    meta = page(0)[24:]
    dims, lists = struct.unpack_from('<I', meta, 8)[0], struct.unpack_from('<I', meta, 16)[0]
    cstart, cpages, _, _, dstart, dpages = struct.unpack_from('<6I', meta, 56)
    cent = np.frombuffer(b''.join(page(cstart + i)[24:24 + 8160] for i in range(cpages)),
                         dtype='<f4')[:lists * dims].reshape(lists, dims)
    dirs = [page(dstart + i) for i in range(dpages)]
    counts = np.array([struct.unpack_from('<I', dirs[i // 510], 24 + (i % 510) * 16 + 12)[0]
                       for i in range(lists)], dtype=np.int64)
    return cent, counts


def lists(index_file, queries_bin, probes, scale=1.0):
    cent, n = index_lists(index_file)
    qs = read_copy_vectors(queries_bin) * np.float32(scale)
    d = (qs ** 2).sum(1)[:, None] - 2 * qs @ cent.T + (cent ** 2).sum(1)[None, :]
    probed = n[np.argsort(d, axis=1)[:, :probes]]
    largest = probed.max(1)
    print('lists=%d max=%d p50=%d p99=%d codes_per_query=%.0f largest_probed_list=%.0f '
          'queries_probing_the_largest_list=%.1f%%'
          % (len(n), n.max(), np.median(n), np.percentile(n, 99), probed.sum(1).mean(), largest.mean(),
             100.0 * (largest == n.max()).mean()))


def read_vecs(path, dtype):
    raw = np.fromfile(path, dtype=np.int32)
    dim = raw[0]
    return raw.reshape(-1, dim + 1)[:, 1:].copy().view(dtype)


def truth(gt_path, dist_path, n):
    ids = read_vecs(gt_path, np.int32)
    dist = read_vecs(dist_path, np.float32)
    for q in range(min(n, len(ids))):
        print('%d|{%s}|{%s}' % (q, ','.join(str(i) for i in ids[q]),
                                ','.join(repr(float(x)) for x in dist[q])))


if __name__ == '__main__':
    cmd = sys.argv[1]
    if cmd == 'gen':
        gen(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
            int(sys.argv[6]) if len(sys.argv) > 6 else 0)
    elif cmd == 'gt':
        gt(sys.argv[2])
    elif cmd == 'fvecs':
        fvecs(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == 'compare':
        compare(sys.argv[2], sys.argv[3])
    elif cmd == 'recall':
        recall(sys.argv[2], sys.argv[3])
    elif cmd == 'latency':
        latency(sys.argv[2])
    elif cmd == 'lists':
        lists(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]) if len(sys.argv) > 5 else 1.0)
    elif cmd == 'truth':
        truth(sys.argv[2], sys.argv[3], int(sys.argv[4]))
