/*
 * gpuivf_gen — seeded generator of clustered vectors that behave like real
 * embeddings, for tests and benchmarks; also converts fvecs/bvecs files to
 * PostgreSQL COPY input.
 *
 * Model (the recipe of ../shared/data/README.md, which matched SIFT10K's
 * recall-vs-probes curve): in an intrinsic basis, component i has scale
 * s_i = (i+1)^-0.5 (a decaying spectrum); C cluster centres are drawn as
 * 1.5 * s_i * N(0,1); cluster k gets a Zipf-like share (k+1)^-a of the rows and
 * a spread sigma_k uniform in [0.5, 1.5]; a row of cluster k is
 * centre_k + sigma_k * s_i * N(0,1).  Every vector is then turned by one fixed
 * random rotation, so the spectrum is not aligned with the axes.  Queries are
 * drawn from the same mixture (not from the base rows).
 *
 * The Zipf exponent a = 1.6 is calibrated against SIFT10K (10,000 x 128, 100
 * lists, recall@10 at 1/2/4/8/16 probes).  Plain IVF (gpuivf_ivfcurve):
 * SIFT10K 0.50/0.70/0.87/0.97/1.00, generated (seeds 42, 1, 2) 0.52-0.56/
 * 0.70-0.75/0.86-0.89/0.97-0.98/1.00.  The gpuivf index itself: SIFT10K
 * 0.54/0.73/0.87/0.96/0.99, generated 0.51-0.56/0.68-0.74/0.83-0.91/
 * 0.95-0.98/0.99-1.00.  a = 1 made the data far easier (0.79 at 1 probe),
 * a = 1.7 slightly harder than SIFT.
 *
 * Independent random streams (rotation, centres, base, queries) mean that
 * changing --queries does not change the base rows and vice versa.
 *
 * Queries from another distribution than the rows (--query-clusters,
 * --query-spread, --query-shift, --query-first): the workloads whose recall
 * a row-based calibration mispredicts, e.g. text queries against image
 * embeddings or questions against passages.  The queries then come from a
 * random subset of the clusters (uniform over the subset, not Zipf), with
 * their own spread (the cluster's sigma times --query-spread), all moved by
 * one fixed offset drawn like a centre (--query-shift times
 * center_scale * s_i * N(0,1), in the intrinsic basis: along the directions
 * the data varies in, so that it changes which lists hold a query's
 * neighbours).  The subset and the offset come from a stream of their own:
 * the base rows stay the same, and --query-first lets two calls write
 * disjoint query sets of the same distribution (e.g. recorded queries and
 * held-out ones).
 *
 * Usage: gpuivf_gen --help
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "rng.h"
#include "vecio.h"

namespace {

struct Options {
    int64_t rows = 10000;
    int dims = 128;
    int64_t queries = 0;
    uint64_t seed = 42;
    int64_t clusters = 0; /* 0: max(1, rows / 100) */
    double zipf = 1.6;
    double center_scale = 1.5;
    std::vector<std::string> base_paths;
    std::vector<std::string> query_paths;
    std::string format; /* forces the format of every output */
    int64_t id_start = 0;
    int64_t null_every = 0; /* every n-th base row is NULL (COPY outputs only) */
    std::string input;      /* convert this fvecs/bvecs file instead of generating */
    int64_t limit = 0;
    /* queries from another distribution (0 / 1 / 0: the rows' mixture) */
    int64_t query_clusters = 0; /* draw queries from this many random clusters */
    double query_spread = 1.0;  /* their spread: sigma_k times this */
    double query_shift = 0.0;   /* one fixed offset, in units of the centres' scale */
    int64_t query_first = 0;    /* skip this many queries of the stream first */
    int64_t part = -1;      /* --part K/N: only rows [K * rows / N, (K + 1) * rows / N) */
    int64_t parts = 0;
};

/* Rows of --part are drawn in blocks of this many, each from its own stream,
 * so the parts of any N together are the same rows. */
constexpr int64_t kPartBlockRows = 65536;

void usage() {
    std::fputs(
        "usage: gpuivf_gen [options]\n"
        "Generates clustered vectors (see the recipe in the header of gpuivf_gen.cpp),\n"
        "or converts an .fvecs/.bvecs file, writing fvecs or PostgreSQL COPY input.\n"
        "\n"
        "  --rows N            base rows (default 10000)\n"
        "  --dims D            dimensions (default 128)\n"
        "  --queries Q         query rows (default 0)\n"
        "  --seed S            random seed (default 42)\n"
        "  --clusters C        mixture components (default max(1, rows/100))\n"
        "  --zipf A            cluster share of component k is (k+1)^-A (default 1.6)\n"
        "  --base PATH         write the base rows here (repeatable)\n"
        "  --query PATH        write the query rows here (repeatable)\n"
        "  --format F          fvecs | text | binary | binary-vector | binary-halfvec for\n"
        "                      every output (default: by suffix: .fvecs; .vector.bin /\n"
        "                      .halfvec.bin = binary COPY of pgvector's vector / halfvec;\n"
        "                      .bin/.pgcopy = binary COPY of real[]; else text COPY;\n"
        "                      PATH '-' is standard output)\n"
        "  --id-start I        id of the first row in COPY output (default 0: ids are\n"
        "                      0-based row numbers, as in .ivecs ground truth)\n"
        "  --null-every K      make every K-th base row's vector NULL in COPY output\n"
        "  --input PATH        convert this .fvecs/.bvecs file to the --base outputs\n"
        "  --limit N           with --input: at most N rows\n"
        "Queries from another distribution than the rows (the base rows do not change):\n"
        "  --query-clusters N  draw queries from N random clusters only (default 0: all,\n"
        "                      with the rows' Zipf shares)\n"
        "  --query-spread F    queries spread F times as much around their centre (default 1)\n"
        "  --query-shift F     move every query by one fixed offset drawn like a centre,\n"
        "                      times F (default 0)\n"
        "  --query-first I     start at query I of the stream, so that two calls write\n"
        "                      disjoint query sets of one distribution (default 0)\n"
        "  --part K/N          only part K (0-based) of N of the base rows, with their\n"
        "                      ids, so N processes can generate (and load) in parallel;\n"
        "                      rows are drawn in blocks of 65,536, each from its own\n"
        "                      random stream: the N parts together are the same rows\n"
        "                      for every N (not those of a run without --part); queries\n"
        "                      are written only by part 0\n"
        "COPY rows are (id bigint, v real[]): text lines are id<TAB>{x1,x2,...}.\n",
        stdout);
}

bool parse_int(const char *s, int64_t *out) {
    char *end;
    long long v = std::strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0') return false;
    *out = v;
    return true;
}

bool parse_args(int argc, char **argv, Options *o) {
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            usage();
            std::exit(0);
        }
        if (i + 1 >= argc) {
            std::fprintf(stderr, "gpuivf_gen: %s needs a value\n", a.c_str());
            return false;
        }
        const char *v = argv[++i];
        int64_t n = 0;
        bool ok = true;
        if (a == "--rows") ok = parse_int(v, &o->rows) && o->rows >= 0;
        else if (a == "--dims") {
            ok = parse_int(v, &n) && n >= 1 && n <= 100000;
            o->dims = (int)n;
        }
        else if (a == "--queries") ok = parse_int(v, &o->queries) && o->queries >= 0;
        else if (a == "--seed") {
            ok = parse_int(v, &n);
            o->seed = (uint64_t)n;
        }
        else if (a == "--clusters") ok = parse_int(v, &o->clusters) && o->clusters >= 0;
        else if (a == "--zipf") o->zipf = std::atof(v);
        else if (a == "--center-scale") o->center_scale = std::atof(v);
        else if (a == "--base") o->base_paths.push_back(v);
        else if (a == "--query") o->query_paths.push_back(v);
        else if (a == "--format") {
            vecio::Format f;
            ok = vecio::format_from_name(v, &f);
            o->format = v;
        } else if (a == "--id-start") ok = parse_int(v, &o->id_start);
        else if (a == "--null-every") ok = parse_int(v, &o->null_every) && o->null_every >= 0;
        else if (a == "--input") o->input = v;
        else if (a == "--limit") ok = parse_int(v, &o->limit) && o->limit >= 0;
        else if (a == "--query-clusters") ok = parse_int(v, &o->query_clusters) && o->query_clusters >= 0;
        else if (a == "--query-spread") {
            o->query_spread = std::atof(v);
            ok = o->query_spread > 0;
        } else if (a == "--query-shift") {
            o->query_shift = std::atof(v);
            ok = o->query_shift >= 0;
        } else if (a == "--query-first") ok = parse_int(v, &o->query_first) && o->query_first >= 0;
        else if (a == "--part") {
            std::string pv = v;
            size_t slash = pv.find('/');
            ok = slash != std::string::npos && parse_int(pv.substr(0, slash).c_str(), &o->part) &&
                 parse_int(pv.substr(slash + 1).c_str(), &o->parts) && o->parts >= 1 &&
                 o->part >= 0 && o->part < o->parts;
        }
        else {
            std::fprintf(stderr, "gpuivf_gen: unknown option %s (see --help)\n", a.c_str());
            return false;
        }
        if (!ok) {
            std::fprintf(stderr, "gpuivf_gen: bad value for %s: %s\n", a.c_str(), v);
            return false;
        }
    }
    if (o->base_paths.empty() && o->query_paths.empty()) {
        std::fprintf(stderr, "gpuivf_gen: nothing to write (give --base and/or --query)\n");
        return false;
    }
    return true;
}

/* A set of writers receiving the same rows. */
struct Outputs {
    std::vector<vecio::VectorWriter> writers;
    std::vector<vecio::Format> formats;

    bool open(const std::vector<std::string> &paths, const std::string &forced, int d) {
        writers.resize(paths.size());
        for (size_t i = 0; i < paths.size(); i++) {
            vecio::Format f = vecio::format_from_path(paths[i]);
            if (!forced.empty()) vecio::format_from_name(forced, &f);
            formats.push_back(f);
            std::string err;
            if (!writers[i].open(paths[i], f, d, &err)) {
                std::fprintf(stderr, "gpuivf_gen: %s\n", err.c_str());
                return false;
            }
        }
        return true;
    }
    void write(int64_t id, const float *x, bool null_row) {
        for (size_t i = 0; i < writers.size(); i++) {
            /* fvecs has no NULL: such rows are left out of it, so row numbers
             * in fvecs/ivecs no longer equal ids; callers use --null-every only
             * with COPY outputs. */
            if (null_row && formats[i] == vecio::Format::Fvecs) continue;
            writers[i].write(id, null_row ? nullptr : x);
        }
    }
    bool close() {
        bool ok = true;
        for (auto &w : writers) {
            std::string err;
            if (!w.close(&err)) {
                std::fprintf(stderr, "gpuivf_gen: %s\n", err.c_str());
                ok = false;
            }
        }
        return ok;
    }
};

/*
 * Random orthogonal d x d matrix: Gram–Schmidt (twice, for orthogonality in
 * floating point) on Gaussian columns.  Returned column-major, so applying it
 * is a sum of scaled columns, which vectorizes without reassociating floats.
 */
std::vector<float> random_rotation(int d, testrng::Rng &rng) {
    std::vector<double> q((size_t)d * d);
    for (auto &v : q) v = rng.normal();
    for (int j = 0; j < d; j++) {
        double *cj = &q[(size_t)j * d];
        for (int pass = 0; pass < 2; pass++) {
            for (int p = 0; p < j; p++) {
                const double *cp = &q[(size_t)p * d];
                double dot = 0;
                for (int i = 0; i < d; i++) dot += cp[i] * cj[i];
                for (int i = 0; i < d; i++) cj[i] -= dot * cp[i];
            }
        }
        double norm = 0;
        for (int i = 0; i < d; i++) norm += cj[i] * cj[i];
        norm = std::sqrt(norm);
        for (int i = 0; i < d; i++) cj[i] /= norm;
    }
    return std::vector<float>(q.begin(), q.end());
}

/* y = R x with R column-major. */
void rotate(const std::vector<float> &r, int d, const float *x, float *y) {
    std::fill(y, y + d, 0.0f);
    for (int j = 0; j < d; j++) {
        const float xj = x[j];
        const float *col = &r[(size_t)j * d];
        for (int i = 0; i < d; i++) y[i] += xj * col[i];
    }
}

struct Mixture {
    int d = 0;
    std::vector<float> scale;     /* s_i */
    std::vector<float> centres;   /* C x d, intrinsic basis */
    std::vector<float> spread;    /* sigma_k */
    std::vector<double> cum;      /* cumulative Zipf shares, ends at 1 */
    std::vector<float> rotation;  /* d x d column-major */

    int64_t pick_cluster(testrng::Rng &rng) const {
        const double u = rng.uniform();
        auto it = std::upper_bound(cum.begin(), cum.end(), u);
        int64_t k = it - cum.begin();
        return std::min<int64_t>(k, (int64_t)cum.size() - 1);
    }

    /* One row of the mixture, rotated, into out (tmp: d floats of scratch). */
    void sample(testrng::Rng &rng, float *tmp, float *out) const {
        sample_of(pick_cluster(rng), 1.0f, nullptr, rng, tmp, out);
    }

    /* One row of cluster k with its spread times f, moved by offset (NULL:
     * none, intrinsic basis), rotated. */
    void sample_of(int64_t k, float f, const float *offset, testrng::Rng &rng, float *tmp,
                   float *out) const {
        const float *c = &centres[(size_t)k * d];
        const float sigma = spread[k] * f;
        for (int i = 0; i < d; i++)
            tmp[i] = c[i] + sigma * scale[i] * (float)rng.normal() + (offset ? offset[i] : 0.0f);
        rotate(rotation, d, tmp, out);
    }
};

/* The query distribution: the rows' mixture, or (any --query-* option) a
 * subset of its clusters, another spread and an offset. */
struct QueryDistribution {
    bool other = false;
    std::vector<int64_t> clusters; /* the subset; empty: Zipf over all */
    std::vector<float> offset;     /* intrinsic basis; empty: none */
    float spread = 1.0f;

    void sample(const Mixture &m, testrng::Rng &rng, float *tmp, float *out) const {
        if (!other) {
            m.sample(rng, tmp, out);
            return;
        }
        int64_t k = clusters.empty()
            ? m.pick_cluster(rng)
            : clusters[std::min<size_t>((size_t)(rng.uniform() * clusters.size()), clusters.size() - 1)];
        m.sample_of(k, spread, offset.empty() ? nullptr : offset.data(), rng, tmp, out);
    }
};

QueryDistribution make_query_distribution(const Options &o, const Mixture &m) {
    QueryDistribution q;
    const int64_t nclusters = (int64_t)m.spread.size();
    q.other = o.query_clusters > 0 || o.query_spread != 1.0 || o.query_shift > 0;
    q.spread = (float)o.query_spread;
    testrng::Rng rng(o.seed, 5);
    if (o.query_clusters > 0 && o.query_clusters < nclusters) {
        /* a partial Fisher-Yates shuffle picks the subset */
        std::vector<int64_t> all(nclusters);
        for (int64_t k = 0; k < nclusters; k++) all[k] = k;
        for (int64_t i = 0; i < o.query_clusters; i++) {
            int64_t j = i + std::min<int64_t>((int64_t)(rng.uniform() * (nclusters - i)), nclusters - i - 1);
            std::swap(all[i], all[j]);
        }
        q.clusters.assign(all.begin(), all.begin() + o.query_clusters);
    }
    if (o.query_shift > 0) {
        q.offset.resize(m.d);
        for (int i = 0; i < m.d; i++)
            q.offset[i] = (float)(o.query_shift * o.center_scale * m.scale[i] * rng.normal());
    }
    return q;
}

Mixture make_mixture(const Options &o) {
    Mixture m;
    m.d = o.dims;
    const int d = o.dims;
    int64_t nclusters = o.clusters > 0 ? o.clusters : std::max<int64_t>(1, o.rows / 100);

    m.scale.resize(d);
    for (int i = 0; i < d; i++) m.scale[i] = (float)(1.0 / std::sqrt((double)(i + 1)));

    testrng::Rng rot_rng(o.seed, 1);
    m.rotation = random_rotation(d, rot_rng);

    testrng::Rng centre_rng(o.seed, 2);
    m.centres.resize((size_t)nclusters * d);
    m.spread.resize(nclusters);
    for (int64_t k = 0; k < nclusters; k++) {
        for (int i = 0; i < d; i++)
            m.centres[(size_t)k * d + i] = (float)(o.center_scale * m.scale[i] * centre_rng.normal());
        m.spread[k] = (float)(0.5 + centre_rng.uniform());
    }
    /* Zipf-like shares; the centres are random, so giving the largest share
     * to component 0 carries no structure. */
    m.cum.resize(nclusters);
    double total = 0;
    for (int64_t k = 0; k < nclusters; k++) total += std::pow((double)(k + 1), -o.zipf);
    double acc = 0;
    for (int64_t k = 0; k < nclusters; k++) {
        acc += std::pow((double)(k + 1), -o.zipf) / total;
        m.cum[k] = acc;
    }
    m.cum.back() = 1.0;
    return m;
}

int convert(const Options &o) {
    vecio::Matrix m;
    std::string err;
    if (!vecio::read_vectors(o.input, &m, o.limit, &err)) {
        std::fprintf(stderr, "gpuivf_gen: %s\n", err.c_str());
        return 1;
    }
    Outputs out;
    if (!out.open(o.base_paths, o.format, m.d)) return 1;
    for (int64_t r = 0; r < m.n; r++) {
        bool null_row = o.null_every > 0 && (r + 1) % o.null_every == 0;
        out.write(o.id_start + r, m.row(r), null_row);
    }
    return out.close() ? 0 : 1;
}

int generate(const Options &o) {
    const Mixture mix = make_mixture(o);
    std::vector<float> tmp(o.dims), row(o.dims);

    if (!o.base_paths.empty() && o.parts > 0) {
        Outputs out;
        const int64_t first = o.rows * o.part / o.parts;
        const int64_t end = o.rows * (o.part + 1) / o.parts;
        if (!out.open(o.base_paths, o.format, o.dims)) return 1;
        for (int64_t r = first; r < end;) {
            const int64_t block = r / kPartBlockRows;
            const int64_t block_end = std::min(end, (block + 1) * kPartBlockRows);
            testrng::Rng rng(o.seed, 16 + (uint64_t)block);
            for (int64_t skip = block * kPartBlockRows; skip < r; skip++)
                mix.sample(rng, tmp.data(), row.data());  /* this part starts mid-block */
            for (; r < block_end; r++) {
                mix.sample(rng, tmp.data(), row.data());
                bool null_row = o.null_every > 0 && (r + 1) % o.null_every == 0;
                out.write(o.id_start + r, row.data(), null_row);
            }
        }
        if (!out.close()) return 1;
    } else if (!o.base_paths.empty()) {
        Outputs out;
        if (!out.open(o.base_paths, o.format, o.dims)) return 1;
        testrng::Rng rng(o.seed, 3);
        for (int64_t r = 0; r < o.rows; r++) {
            mix.sample(rng, tmp.data(), row.data());
            bool null_row = o.null_every > 0 && (r + 1) % o.null_every == 0;
            out.write(o.id_start + r, row.data(), null_row);
        }
        if (!out.close()) return 1;
    }
    if (!o.query_paths.empty() && o.part <= 0) {
        const QueryDistribution qd = make_query_distribution(o, mix);
        Outputs out;
        if (!out.open(o.query_paths, o.format, o.dims)) return 1;
        testrng::Rng rng(o.seed, 4);
        for (int64_t r = 0; r < o.query_first + o.queries; r++) {
            qd.sample(mix, rng, tmp.data(), row.data());
            if (r >= o.query_first) out.write(r - o.query_first, row.data(), false);
        }
        if (!out.close()) return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    if (!parse_args(argc, argv, &o)) return 2;
    if (!o.input.empty()) return convert(o);
    return generate(o);
}
