/*
 * calibration/stored.cpp — the queries a calibration measured on, stored
 * with its curves in the index, so that the next ANALYZE can measure on
 * them again (mixed with newly recorded ones), on the primary and on every
 * standby and after a restart: they are WAL-logged pages.
 *
 * Two chains of calibration-query pages (GPUIVF_PAGE_CALIB), both named by
 * the metapage: the current set (calib_query_head, calib_query_pages,
 * calib_query_count queries of dims floats, one stream over the pages) and
 * the free pages the next calibration writes its set into
 * (calib_free_head, calib_free_pages).  Storing a calibration:
 *
 *   1. grow the free chain to the pages the new set needs (new pages of the
 *      fork, linked behind its last page, in records with the metapage);
 *   2. write the set into the first of those pages (full images, four pages
 *      a record; links unchanged, so the pages stay free until step 3);
 *   3. one record: the metapage gets the curves and the new current set
 *      (those pages), the last of them is cut from the rest of the free
 *      chain, and the old set's last page is linked to that rest: the old
 *      set becomes free pages.
 *
 * Every page is in one of the two chains after every record, so a crash
 * leaks nothing, and the old set stays readable until step 3.  Only
 * calibrations change these pages and fields, and every calibration holds a
 * lock on the table that conflicts with every other (ANALYZE and VACUUM:
 * ShareUpdateExclusiveLock; gpuivf_calibrate the same; CREATE INDEX more),
 * so they need no lock of their own.  Buffer locks: calibration-query
 * pages before the metapage, one record at a time.
 */
#include "gpuivf.h"
#include "calibration/calibration.h"
#include "storage/storage.h"

#include <cmath>

/* The stored set is bounded: a calibration measures on at most
 * gpuivf.analyze_sample queries but stores at most this much of them. */
#define GPUIVF_CALIB_STORE_MAX_BYTES ((Size) 32 * 1024 * 1024)

/* Pages n floats take. */
static uint32
PagesFor(uint64 nfloats)
{
    return (uint32) ((nfloats + GPUIVF_CALIB_FLOATS_PER_PAGE - 1) / GPUIVF_CALIB_FLOATS_PER_PAGE);
}

/* Queries of dims floats a stored set keeps of nq. */
int
GpuivfCalibStoredCap(int nq, int dims)
{
    Size        per = sizeof(float4) * (Size) Max(dims, 1);

    return (int) Min((Size) nq, GPUIVF_CALIB_STORE_MAX_BYTES / per);
}

/* The page after blkno in its chain (share lock). */
static BlockNumber
NextOf(Relation index, BlockNumber blkno)
{
    Buffer      buf = ReadBuffer(index, blkno);
    BlockNumber next;

    LockBuffer(buf, BUFFER_LOCK_SHARE);
    if (!GpuivfPageIsType(BufferGetPage(buf), GPUIVF_PAGE_CALIB))
    {
        UnlockReleaseBuffer(buf);
        GpuivfBadPage(index, blkno, "calibration query");
    }
    next = GpuivfPageGetOpaque(BufferGetPage(buf))->nextblkno;
    UnlockReleaseBuffer(buf);
    return next;
}

/* The n-th page (0-based) of a chain starting at head. */
static BlockNumber
NthOf(Relation index, BlockNumber head, uint32 n)
{
    BlockNumber blkno = head;

    for (uint32 i = 0; i < n; i++)
    {
        blkno = NextOf(index, blkno);
        if (!BlockNumberIsValid(blkno))
            GpuivfBadPage(index, head, "calibration query chain's");
    }
    return blkno;
}

/*
 * The stored queries of an index (calibration.h): calib_query_count
 * queries of meta->dims floats, palloc'd, or NULL when it has none (or
 * they are not the ones its metapage names: a page of another stamp, as
 * can be seen only while another calibration stores, which the caller's
 * table lock excludes).
 */
float4 *
GpuivfReadStoredQueries(Relation index, const GpuivfMetaPageData *meta, int *nq)
{
    uint64      want = (uint64) meta->calib_query_count * meta->dims;
    uint64      got = 0;
    float4     *x;
    BlockNumber blkno = meta->calib_query_head;

    *nq = 0;
    if (meta->calib_query_count == 0 || meta->dims == 0)
        return NULL;
    x = (float4 *) palloc_extended(sizeof(float4) * want, MCXT_ALLOC_HUGE);
    for (uint32 p = 0; p < meta->calib_query_pages && got < want; p++)
    {
        Buffer      buf;
        const float4 *data;
        uint32      id;
        uint32      n;

        if (!BlockNumberIsValid(blkno))
            break;
        buf = ReadBuffer(index, blkno);
        LockBuffer(buf, BUFFER_LOCK_SHARE);
        data = GpuivfCalibPageData(BufferGetPage(buf), &id, &n);
        if (data == NULL || id != meta->calib_id || n > want - got)
        {
            UnlockReleaseBuffer(buf);
            break;
        }
        memcpy(x + got, data, sizeof(float4) * n);
        got += n;
        blkno = GpuivfPageGetOpaque(BufferGetPage(buf))->nextblkno;
        UnlockReleaseBuffer(buf);
    }
    if (got != want)
    {
        elog(DEBUG1, "gpuivf index \"%s\": its stored calibration queries are not readable (" UINT64_FORMAT " of " UINT64_FORMAT " values)",
             RelationGetRelationName(index), got, want);
        pfree(x);
        return NULL;
    }
    *nq = (int) meta->calib_query_count;
    return x;
}

/* Step 1: make the free chain at least `need` pages long. */
static void
GrowFreeChain(Relation index, uint32 need)
{
    GpuivfMetaPageData meta;
    BlockNumber tail = InvalidBlockNumber;

    GpuivfReadMeta(index, &meta);
    if (meta.calib_free_pages >= need)
        return;
    if (meta.calib_free_pages > 0)
        tail = NthOf(index, meta.calib_free_head, meta.calib_free_pages - 1);
    for (uint32 have = meta.calib_free_pages; have < need;)
    {
        Buffer      newbufs[2];
        int         n = (int) Min((uint32) 2, need - have);
        Buffer      tailbuf = InvalidBuffer;
        Buffer      metabuf;

        CHECK_FOR_INTERRUPTS();
        /* new pages are invisible to others: locked out of order */
        for (int i = 0; i < n; i++)
            newbufs[i] = GpuivfNewBuffer(index, MAIN_FORKNUM);
        if (BlockNumberIsValid(tail))
        {
            tailbuf = ReadBuffer(index, tail);
            LockBuffer(tailbuf, BUFFER_LOCK_EXCLUSIVE);
        }
        metabuf = ReadBuffer(index, GPUIVF_METAPAGE_BLKNO);
        LockBuffer(metabuf, BUFFER_LOCK_EXCLUSIVE);
        GpuivfLogCalibFreeAppend(index, tailbuf, newbufs, n, metabuf);
        tail = BufferGetBlockNumber(newbufs[n - 1]);
        UnlockReleaseBuffer(metabuf);
        if (BufferIsValid(tailbuf))
            UnlockReleaseBuffer(tailbuf);
        for (int i = 0; i < n; i++)
            UnlockReleaseBuffer(newbufs[i]);
        have += n;
    }
}

/*
 * Step 2: write nfloats floats of x into the first pages of the free chain
 * (head), stamped calib_id; returns the last page written.
 */
static BlockNumber
FillFreePages(Relation index, BlockNumber head, const float4 *x, uint64 nfloats, uint32 calib_id)
{
    BlockNumber blkno = head;
    BlockNumber last = InvalidBlockNumber;
    uint64      done = 0;

    while (done < nfloats)
    {
        Buffer      bufs[MAX_GENERIC_XLOG_PAGES];
        const float4 *data[MAX_GENERIC_XLOG_PAGES];
        uint32      counts[MAX_GENERIC_XLOG_PAGES];
        int         n = 0;

        CHECK_FOR_INTERRUPTS();
        while (n < MAX_GENERIC_XLOG_PAGES && done < nfloats)
        {
            if (!BlockNumberIsValid(blkno))
                GpuivfBadPage(index, last, "calibration query chain's");
            bufs[n] = ReadBuffer(index, blkno);
            LockBuffer(bufs[n], BUFFER_LOCK_EXCLUSIVE);
            if (!GpuivfPageIsType(BufferGetPage(bufs[n]), GPUIVF_PAGE_CALIB))
                GpuivfBadPage(index, blkno, "calibration query");
            data[n] = x + done;
            counts[n] = (uint32) Min((uint64) GPUIVF_CALIB_FLOATS_PER_PAGE, nfloats - done);
            done += counts[n];
            last = blkno;
            blkno = GpuivfPageGetOpaque(BufferGetPage(bufs[n]))->nextblkno;
            n++;
        }
        GpuivfLogCalibQueryPages(index, bufs, n, data, counts, calib_id);
        for (int i = 0; i < n; i++)
            UnlockReleaseBuffer(bufs[i]);
    }
    return last;
}

/*
 * Store a calibration (calibration.h): calib's curves and, when nq > 0,
 * its queries (the first GpuivfCalibStoredCap of them) as the current set.
 * train_id: the model it was measured on; false (nothing stored) when the
 * index was rebuilt since.
 */
bool
GpuivfStoreCalibration(Relation index, uint64 train_id, GpuivfMetaPageData *calib,
                       const float4 *queries, int nq, int dims)
{
    GpuivfMetaPageData meta;
    uint64      nfloats;
    uint32      need;
    BlockNumber last = InvalidBlockNumber;
    BlockNumber rest;
    BlockNumber oldtail = InvalidBlockNumber;
    Buffer      lastbuf = InvalidBuffer;
    Buffer      oldtailbuf = InvalidBuffer;
    Buffer      metabuf;
    bool        stored = false;

    nq = queries != NULL ? GpuivfCalibStoredCap(nq, dims) : 0;
    nfloats = (uint64) nq * dims;
    need = PagesFor(nfloats);

    GrowFreeChain(index, need);
    GpuivfReadMeta(index, &meta);
    if (meta.train_id != train_id)
        return false;
    if (need > 0)
        last = FillFreePages(index, meta.calib_free_head, queries, nfloats, meta.calib_id + 1);
    /* what stays free of the free chain: the pages after the new set */
    rest = need == 0 ? (meta.calib_free_pages > 0 ? meta.calib_free_head : InvalidBlockNumber)
        : meta.calib_free_pages > need ? NextOf(index, last) : InvalidBlockNumber;
    if (meta.calib_query_count > 0 && meta.calib_query_pages > 0)
        oldtail = NthOf(index, meta.calib_query_head, meta.calib_query_pages - 1);

    /* step 3: calibration-query pages first, then the metapage */
    if (need > 0 && BlockNumberIsValid(rest))
    {
        lastbuf = ReadBuffer(index, last);
        LockBuffer(lastbuf, BUFFER_LOCK_EXCLUSIVE);
    }
    if (BlockNumberIsValid(oldtail))
    {
        oldtailbuf = ReadBuffer(index, oldtail);
        LockBuffer(oldtailbuf, BUFFER_LOCK_EXCLUSIVE);
    }
    metabuf = ReadBuffer(index, GPUIVF_METAPAGE_BLKNO);
    LockBuffer(metabuf, BUFFER_LOCK_EXCLUSIVE);
    if (GpuivfPageIsType(BufferGetPage(metabuf), GPUIVF_PAGE_META) &&
        GpuivfPageGetMeta(BufferGetPage(metabuf))->train_id == train_id)
    {
        uint32      free_left = meta.calib_free_pages - need;
        bool        had_set = BlockNumberIsValid(oldtail);

        calib->calib_id = meta.calib_id + 1;
        calib->calib_query_count = (uint32) nq;
        calib->calib_query_head = need > 0 ? meta.calib_free_head : InvalidBlockNumber;
        calib->calib_query_pages = need;
        /* the old set, then what stayed free */
        calib->calib_free_head = had_set ? meta.calib_query_head : rest;
        calib->calib_free_pages = free_left + (had_set ? meta.calib_query_pages : 0);
        GpuivfLogCalibration(index, metabuf, calib, lastbuf, oldtailbuf, rest);
        stored = true;
    }
    UnlockReleaseBuffer(metabuf);
    if (BufferIsValid(oldtailbuf))
        UnlockReleaseBuffer(oldtailbuf);
    if (BufferIsValid(lastbuf))
        UnlockReleaseBuffer(lastbuf);
    return stored;
}

/*
 * gpuivf_verify's check of the two chains (calibration.h): NULL when they
 * are consistent with the metapage, else what is wrong.  Every page of them
 * gets role[blkno] = role (a page already claimed, by them or by another
 * part of the index, is an error).
 */
char *
GpuivfCheckCalibChains(Relation index, const GpuivfMetaPageData *meta, BlockNumber nblocks,
                       uint8 *role, uint8 calib_role)
{
    struct
    {
        const char *name;
        BlockNumber head;
        uint32      pages;
        bool        current;
    }           chains[2] = {
        {"calibration query", meta->calib_query_head, meta->calib_query_pages, true},
        {"free calibration query", meta->calib_free_head, meta->calib_free_pages, false},
    };
    uint64      want = (uint64) meta->calib_query_count * meta->dims;

    if ((meta->calib_query_count > 0) != (meta->calib_query_pages > 0) ||
        meta->calib_query_pages != PagesFor(want))
        return psprintf("The metapage stores %u calibration queries of %u dimensions in %u pages.",
                        meta->calib_query_count, meta->dims, meta->calib_query_pages);
    for (int c = 0; c < 2; c++)
    {
        BlockNumber blkno = chains[c].head;
        uint64      floats = 0;

        for (uint32 p = 0; p < chains[c].pages; p++)
        {
            Buffer      buf;
            const float4 *data;
            uint32      id;
            uint32      n;
            BlockNumber next;

            if (!BlockNumberIsValid(blkno) || blkno == GPUIVF_METAPAGE_BLKNO || blkno >= nblocks)
                return psprintf("The %s chain ends after %u of its %u pages.", chains[c].name, p,
                                chains[c].pages);
            if (role[blkno] != 0)
                return psprintf("Block %u of the %s chain belongs to something else too.", blkno,
                                chains[c].name);
            role[blkno] = calib_role;
            buf = ReadBuffer(index, blkno);
            LockBuffer(buf, BUFFER_LOCK_SHARE);
            data = GpuivfCalibPageData(BufferGetPage(buf), &id, &n);
            next = GpuivfPageGetOpaque(BufferGetPage(buf))->nextblkno;
            UnlockReleaseBuffer(buf);
            if (data == NULL)
                return psprintf("Block %u of the %s chain is not a calibration query page.", blkno,
                                chains[c].name);
            if (chains[c].current &&
                (id != meta->calib_id ||
                 n != Min((uint64) GPUIVF_CALIB_FLOATS_PER_PAGE, want - floats)))
                return psprintf("Calibration query page %u holds %u values of calibration %u, not %u of calibration %u.",
                                blkno, n, id,
                                (uint32) Min((uint64) GPUIVF_CALIB_FLOATS_PER_PAGE, want - floats),
                                meta->calib_id);
            if (chains[c].current)
                for (uint32 i = 0; i < n; i++)
                    if (!std::isfinite(data[i]))
                        return psprintf("Calibration query page %u has a NaN or infinite value.", blkno);
            floats += n;
            if (p + 1 == chains[c].pages && BlockNumberIsValid(next))
                return psprintf("The %s chain goes on after its %u pages.", chains[c].name,
                                chains[c].pages);
            blkno = next;
        }
    }
    return NULL;
}
