#!/usr/bin/env python3
"""Exact top-k ground truth for test/bench/scale_on_gpu.sh, on the GPU with torch
(numpy on the CPU otherwise), from the base rows as the generator's parts
write them (fvecs, possibly FIFOs that are read while the rows are loaded).

  scale_truth.py [--half] QUERIES.fvecs K ROWS OUT.tsv PART0.fvecs [PART1.fvecs ...]

Part i holds rows [i * ROWS / N, (i + 1) * ROWS / N) (gpuivf_gen --part i/N);
the row number is the id.  OUT.tsv: "qid<TAB>rank<TAB>id" lines (L2, ties to
the smaller id), for COPY into a table.  --half: of the rows and queries
rounded to IEEE half precision first, as a halfvec table stores them.
"""
import sys
import threading

import numpy as np


def read_fvecs_into(path, out):
    d = out.shape[1]
    row = 4 + 4 * d
    view = out.view(np.uint8).reshape(out.shape[0], 4 * d)
    done = 0
    with open(path, 'rb', buffering=0) as f:
        while done < out.shape[0]:
            n = min(65536, out.shape[0] - done)
            buf = bytearray(n * row)
            mv = memoryview(buf)
            got = 0
            while got < len(buf):
                r = f.readinto(mv[got:])
                if not r:
                    raise EOFError('%s: %d of %d rows' % (path, done + got // row, out.shape[0]))
                got += r
            a = np.frombuffer(buf, dtype=np.uint8).reshape(n, row)
            view[done:done + n] = a[:, 4:]
            done += n


def main():
    args = sys.argv[1:]
    half = args[:1] == ['--half']
    if half:
        args = args[1:]
    qpath, k, rows, out = args[0], int(args[1]), int(args[2]), args[3]
    parts = args[4:]
    raw = np.fromfile(qpath, dtype=np.int32)
    d = int(raw[0])
    q = raw.reshape(-1, d + 1)[:, 1:].copy().view(np.float32)
    x = np.empty((rows, d), dtype=np.float32)
    n = len(parts)
    threads = []
    for i, p in enumerate(parts):
        a, b = rows * i // n, rows * (i + 1) // n
        t = threading.Thread(target=read_fvecs_into, args=(p, x[a:b]))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    if half:
        for a in range(0, rows, 1 << 20):
            x[a:a + (1 << 20)] = x[a:a + (1 << 20)].astype(np.float16).astype(np.float32)
        q = q.astype(np.float16).astype(np.float32)
    ids, dist = topk(x, q, k)
    with open(out, 'w') as f:
        for qi in range(len(q)):
            for r in range(k):
                f.write('%d\t%d\t%d\n' % (qi, r, ids[qi, r]))
    print('truth: %d queries x %d rows x %d dims, %s' % (len(q), rows, d,
                                                          'torch' if HAVE_CUDA else 'numpy'))


try:
    import torch
    HAVE_CUDA = torch.cuda.is_available()
except ImportError:
    HAVE_CUDA = False


def topk(x, q, k):
    """Exact L2 top-k in float64 on the shortlist of a float32 pass."""
    chunk = 1 << 20
    cand = []
    if HAVE_CUDA:
        qd = torch.from_numpy(q).cuda()
        for a in range(0, len(x), chunk):
            xd = torch.from_numpy(x[a:a + chunk]).cuda()
            dd = (xd * xd).sum(1)[None, :] - 2.0 * qd @ xd.T
            v, i = torch.topk(dd, min(4 * k, xd.shape[0]), dim=1, largest=False)
            cand.append((i + a).cpu().numpy())
    else:
        for a in range(0, len(x), chunk):
            xs = x[a:a + chunk]
            dd = (xs * xs).sum(1)[None, :] - 2.0 * q @ xs.T
            m = min(4 * k, xs.shape[0])
            cand.append(np.argpartition(dd, m - 1, axis=1)[:, :m] + a)
    cand = np.concatenate(cand, axis=1)
    ids = np.empty((len(q), k), dtype=np.int64)
    dist = np.empty((len(q), k))
    for qi in range(len(q)):
        c = np.unique(cand[qi])
        dd = ((x[c].astype(np.float64) - q[qi].astype(np.float64)) ** 2).sum(1)
        o = np.lexsort((c, dd))[:k]
        ids[qi], dist[qi] = c[o], dd[o]
    return ids, dist


if __name__ == '__main__':
    main()
