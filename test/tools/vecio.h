/*
 * vecio.h — vector file formats shared by the test and benchmark tools.
 *
 *   .fvecs  per vector: int32 d, then d float32            (texmex convention)
 *   .bvecs  per vector: int32 d, then d uint8
 *   .ivecs  per vector: int32 k, then k int32
 *   text COPY    one line per row: id<TAB>{x1,x2,...}      (PostgreSQL COPY text)
 *   binary COPY  PGCOPY header, rows (bigint id, real[] v), trailer
 *                (.vector.bin / .halfvec.bin: v in pgvector's binary
 *                format of vector / halfvec; halfvec rounds each float to
 *                nearest, ties to even)
 *
 * All files are little-endian on disk except binary COPY, whose fields are
 * big-endian as PostgreSQL defines them.  Errors are reported by returning
 * false with a message; the tools print it and exit non-zero.
 */
#ifndef GPUIVF_TEST_VECIO_H
#define GPUIVF_TEST_VECIO_H

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace vecio {

/* A dense row-major matrix read from a file. */
struct Matrix {
    int64_t n = 0;
    int d = 0;
    std::vector<float> x;
    const float *row(int64_t i) const { return x.data() + i * d; }
};

inline bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/* Reads an .fvecs or .bvecs file (by suffix) into m; at most limit rows when
 * limit > 0. */
inline bool read_vectors(const std::string &path, Matrix *m, int64_t limit, std::string *err) {
    const bool bytes = ends_with(path, ".bvecs");
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) {
        *err = "cannot open " + path;
        return false;
    }
    m->n = 0;
    m->d = 0;
    m->x.clear();
    std::vector<uint8_t> buf;
    for (;;) {
        if (limit > 0 && m->n >= limit) break;
        int32_t d;
        size_t got = std::fread(&d, sizeof d, 1, f);
        if (got != 1) break;
        if (d <= 0 || d > 1000000 || (m->d != 0 && d != m->d)) {
            std::fclose(f);
            *err = path + ": bad or inconsistent dimension " + std::to_string(d);
            return false;
        }
        m->d = d;
        size_t old = m->x.size();
        m->x.resize(old + d);
        if (bytes) {
            buf.resize(d);
            if (std::fread(buf.data(), 1, d, f) != (size_t)d) {
                std::fclose(f);
                *err = path + ": truncated vector";
                return false;
            }
            for (int j = 0; j < d; j++) m->x[old + j] = (float)buf[j];
        } else if (std::fread(m->x.data() + old, sizeof(float), d, f) != (size_t)d) {
            std::fclose(f);
            *err = path + ": truncated vector";
            return false;
        }
        m->n++;
    }
    std::fclose(f);
    if (m->n == 0) {
        *err = path + ": no vectors";
        return false;
    }
    return true;
}

/* Reads an .ivecs file (rows of possibly different lengths are not
 * supported: every row must have the first row's k). */
inline bool read_ivecs(const std::string &path, std::vector<int32_t> *ids, int *k, int64_t *n,
                       std::string *err) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) {
        *err = "cannot open " + path;
        return false;
    }
    ids->clear();
    *k = 0;
    *n = 0;
    for (;;) {
        int32_t kk;
        if (std::fread(&kk, sizeof kk, 1, f) != 1) break;
        if (kk <= 0 || (*k != 0 && kk != *k)) {
            std::fclose(f);
            *err = path + ": bad or inconsistent row length";
            return false;
        }
        *k = kk;
        size_t old = ids->size();
        ids->resize(old + kk);
        if (std::fread(ids->data() + old, sizeof(int32_t), kk, f) != (size_t)kk) {
            std::fclose(f);
            *err = path + ": truncated row";
            return false;
        }
        (*n)++;
    }
    std::fclose(f);
    return true;
}

/* Output format of a vector file, chosen by suffix unless forced. */
enum class Format { Fvecs, CopyText, CopyBinary, CopyBinaryVector, CopyBinaryHalfvec };

inline bool format_from_name(const std::string &name, Format *f) {
    if (name == "fvecs") *f = Format::Fvecs;
    else if (name == "text" || name == "copy") *f = Format::CopyText;
    else if (name == "binary") *f = Format::CopyBinary;
    else if (name == "binary-vector") *f = Format::CopyBinaryVector;
    else if (name == "binary-halfvec") *f = Format::CopyBinaryHalfvec;
    else return false;
    return true;
}

inline Format format_from_path(const std::string &path) {
    if (ends_with(path, ".fvecs")) return Format::Fvecs;
    if (ends_with(path, ".vector.bin")) return Format::CopyBinaryVector;
    if (ends_with(path, ".halfvec.bin")) return Format::CopyBinaryHalfvec;
    if (ends_with(path, ".bin") || ends_with(path, ".pgcopy")) return Format::CopyBinary;
    return Format::CopyText;
}

inline void put_be32(std::string *s, uint32_t v) {
    char b[4] = {(char)(v >> 24), (char)(v >> 16), (char)(v >> 8), (char)v};
    s->append(b, 4);
}
inline void put_be16(std::string *s, uint16_t v) {
    char b[2] = {(char)(v >> 8), (char)v};
    s->append(b, 2);
}
/* float32 -> IEEE binary16 bits, to nearest, ties to even (the compiler's
 * _Float16 conversion, as pgvector's float4 -> halfvec cast rounds). */
inline uint16_t float_to_half_bits(float x) {
    _Float16 h = static_cast<_Float16>(x);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    return bits;
}
inline void put_be64(std::string *s, uint64_t v) {
    put_be32(s, (uint32_t)(v >> 32));
    put_be32(s, (uint32_t)v);
}

/*
 * Streams rows to a file in one of the formats.  Text COPY prints each float
 * with the shortest representation that reads back to the same float32, so
 * what PostgreSQL stores equals what the fvecs file holds bit for bit.
 */
class VectorWriter {
  public:
    bool open(const std::string &path, Format fmt, int d, std::string *err) {
        fmt_ = fmt;
        d_ = d;
        if (path == "-") {
            f_ = stdout;
        } else {
            f_ = std::fopen(path.c_str(), "wb");
            if (!f_) {
                *err = "cannot create " + path;
                return false;
            }
            owned_ = true;
        }
        if (binary_copy()) {
            static const char sig[] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', '\377', '\r', '\n', '\0'};
            buf_.assign(sig, sizeof sig);
            put_be32(&buf_, 0); /* flags */
            put_be32(&buf_, 0); /* header extension length */
            flush(false);
        }
        return true;
    }

    /* A row with id; x = nullptr writes a NULL vector (COPY formats only). */
    void write(int64_t id, const float *x) {
        switch (fmt_) {
            case Format::Fvecs: {
                int32_t d = d_;
                buf_.append((const char *)&d, 4);
                buf_.append((const char *)x, sizeof(float) * d_);
                break;
            }
            case Format::CopyText: {
                char num[32];
                auto r = std::to_chars(num, num + sizeof num, (long long)id);
                buf_.append(num, r.ptr - num);
                buf_.push_back('\t');
                if (!x) {
                    buf_.append("\\N");
                } else {
                    buf_.push_back('{');
                    for (int j = 0; j < d_; j++) {
                        if (j) buf_.push_back(',');
                        auto rr = std::to_chars(num, num + sizeof num, x[j]);
                        buf_.append(num, rr.ptr - num);
                    }
                    buf_.push_back('}');
                }
                buf_.push_back('\n');
                break;
            }
            case Format::CopyBinary: {
                if (!binary_row_start(id, x)) break;
                put_be32(&buf_, (uint32_t)(20 + 8 * d_)); /* array header + d (len, value) */
                put_be32(&buf_, 1);                        /* ndim */
                put_be32(&buf_, 0);                        /* no nulls */
                put_be32(&buf_, 700);                      /* float4 */
                put_be32(&buf_, (uint32_t)d_);             /* dimension length */
                put_be32(&buf_, 1);                        /* lower bound */
                for (int j = 0; j < d_; j++) {
                    uint32_t bits;
                    std::memcpy(&bits, &x[j], 4);
                    put_be32(&buf_, 4);
                    put_be32(&buf_, bits);
                }
                break;
            }
            case Format::CopyBinaryVector:
            case Format::CopyBinaryHalfvec: {
                const bool half = fmt_ == Format::CopyBinaryHalfvec;
                if (!binary_row_start(id, x)) break;
                put_be32(&buf_, (uint32_t)(4 + (half ? 2 : 4) * d_)); /* dim, unused, elements */
                put_be16(&buf_, (uint16_t)d_);
                put_be16(&buf_, 0);
                for (int j = 0; j < d_; j++) {
                    if (half) {
                        put_be16(&buf_, float_to_half_bits(x[j]));
                    } else {
                        uint32_t bits;
                        std::memcpy(&bits, &x[j], 4);
                        put_be32(&buf_, bits);
                    }
                }
                break;
            }
        }
        if (buf_.size() > (1u << 20)) flush(false);
    }

    bool close(std::string *err) {
        if (!f_) return true;
        if (binary_copy()) put_be16(&buf_, 0xFFFF);
        flush(false);
        bool ok = std::fflush(f_) == 0 && !std::ferror(f_);
        if (owned_) ok = (std::fclose(f_) == 0) && ok;
        f_ = nullptr;
        if (!ok) *err = "write failed";
        return ok;
    }

  private:
    void flush(bool) {
        if (!buf_.empty()) std::fwrite(buf_.data(), 1, buf_.size(), f_);
        buf_.clear();
    }
    FILE *f_ = nullptr;
    bool owned_ = false;
    /* A binary COPY row's field count and id, and a NULL vector's field
     * (false: the row is complete). */
    bool binary_row_start(int64_t id, const float *x) {
        put_be16(&buf_, 2);
        put_be32(&buf_, 8);
        put_be64(&buf_, (uint64_t)id);
        if (x) return true;
        put_be32(&buf_, 0xFFFFFFFFu);
        return false;
    }
    bool binary_copy() const {
        return fmt_ == Format::CopyBinary || fmt_ == Format::CopyBinaryVector || fmt_ == Format::CopyBinaryHalfvec;
    }
    Format fmt_ = Format::Fvecs;
    int d_ = 0;
    std::string buf_;
};

inline bool write_ivecs(const std::string &path, const std::vector<int32_t> &ids, int k, int64_t n,
                        std::string *err) {
    FILE *f = path == "-" ? stdout : std::fopen(path.c_str(), "wb");
    if (!f) {
        *err = "cannot create " + path;
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t kk = k;
        std::fwrite(&kk, 4, 1, f);
        std::fwrite(ids.data() + i * k, 4, k, f);
    }
    bool ok = std::fflush(f) == 0 && !std::ferror(f);
    if (f != stdout) ok = (std::fclose(f) == 0) && ok;
    if (!ok) *err = "write failed: " + path;
    return ok;
}

}  // namespace vecio

#endif
