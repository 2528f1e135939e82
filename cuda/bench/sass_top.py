"""cuda/bench/sass_top.py — where a kernel's warps wait, from ncu's source page:
   ncu --section SourceCounters -k regex:KERNEL -c 1 -o rep BENCH ...
   ncu --import rep.ncu-rep --page source --csv --print-source sass > k.csv
   python3 cuda/bench/sass_top.py k.csv
prints the stall samples by opcode and the eight-instruction windows with the most samples."""
import csv, sys, collections, re
rows = list(csv.reader(open(sys.argv[1], errors='replace')))
# find header row
hi = next(i for i, r in enumerate(rows) if any('Source' == c.strip() for c in r))
h = [c.strip() for c in rows[hi]]
def col(pat):
    for i, c in enumerate(h):
        if pat in c: return i
    return None
src = h.index('Source'); samp = col('Warp Stall Sampling (All'); ex = col('Instructions Executed')
print('columns:', [c for c in h if 'Stall' in c or 'Executed' in c][:6])
data = []
for r in rows[hi+1:]:
    if len(r) <= max(src, samp): continue
    try: v = float(r[samp].replace(',', '') or 0)
    except ValueError: continue
    e = r[ex].replace(',', '') if ex is not None else ''
    data.append((v, r[src].strip(), e, r[0].strip()))
tot = sum(d[0] for d in data) or 1
print('total samples', int(tot), 'instructions', len(data))
op = collections.Counter()
for v, s, e, a in data: op[re.split(r'[ .]', s.lstrip('@!P0123456789UPT '), 1)[0]] += v
print('by opcode:', ', '.join('%s %.1f%%' % (k, 100 * v / tot) for k, v in op.most_common(14)))
# windows of 8 consecutive instructions with most samples
w = [sum(d[0] for d in data[i:i+8]) for i in range(len(data))]
shown = set()
for i in sorted(range(len(w)), key=lambda i: -w[i]):
    if any(abs(i - j) < 8 for j in shown): continue
    shown.add(i)
    print('--- window %d (%.1f%%)' % (i, 100 * w[i] / tot))
    for d in data[i:i+8]: print('%6.1f%% %8s %s' % (100 * d[0] / tot, d[2], d[1][:90]))
    if len(shown) >= 7: break
