/*
 * test/flash_emu.cc - the emulator of test/flash_emu.h.
 *
 * Threads are fibers on one host thread: a fiber runs until it needs the other lanes of its warp
 * (a collective) or the other threads of its block (a barrier), then the scheduler resumes another.
 * The last lane to arrive at a collective computes it for all 32 lanes (the instruction's
 * definition, written from the PTX ISA, not from the kernels' index maps) and carries on; the
 * others resume with their results. Stacks switch with a few instructions of x86-64 assembly (a
 * glibc swapcontext costs a system call); AddressSanitizer is told of every switch.
 *
 * Shared memory is a host buffer with a shadow word per 4 bytes: who wrote it last and in which
 * barrier interval (epoch), who read it in the current one, whether a cp.async to it is in flight.
 * That is enough to see a missing __syncthreads: two threads meeting on a word within one epoch,
 * one of them writing.
 */
#include "test/flash_emu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <algorithm>
#include <unordered_map>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define FLASH_EMU_ASAN 1
#endif

#if !defined(__x86_64__)
#error "the flash emulator switches stacks with x86-64 assembly"
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Stack switching                                                                                 */

/* Saves the callee-saved registers on the current stack, stores the stack pointer in *save, loads
 * `load` and pops the registers saved there (System V: rbx, rbp, r12-r15 are callee-saved). */
extern "C" void flash_emu_switch(void **save, void *load);
asm(R"(
    .text
    .globl flash_emu_switch
    .type flash_emu_switch, @function
flash_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size flash_emu_switch, .-flash_emu_switch
)");

namespace {

enum { WARP = 32, STACK_BYTES = 512 * 1024, MAX_MESSAGES = 20 };

enum ThreadState { READY, WAIT_WARP, WAIT_CTA, DONE };

struct Copy {
    unsigned char *dst;
    const unsigned char *src;
    int bytes;
    bool valid;
    int64_t group;
};

struct Thread {
    void *sp = nullptr;
    void *stack = nullptr;
    int tid = 0;
    ThreadState state = READY;
    uint64_t wait_epoch = 0;
    bool started = false;
    std::vector<Copy> copies; /* issued, not yet landed (in order) */
    int64_t committed = 0;    /* groups committed so far */
};

/* What one lane hands to a collective and gets back. */
struct LaneIO {
    const void *ptr;
    uint32_t in[6];
    float fin[4];
    uint32_t out[4];
    float fout[4];
};

enum Op { OP_NONE, OP_LDSM, OP_LDSM_T, OP_MMA, OP_SHFL, OP_ST_SHARED, OP_LD_SHARED };
static const char *op_name(int op)
{
    static const char *names[] = {"none", "ldmatrix", "ldmatrix.trans", "mma", "shfl", "st.shared", "ld.shared"};
    return names[op];
}

struct Warp {
    int arrived = 0;
    int op = OP_NONE;
    int param = 0;
    uint64_t epoch = 0;
    LaneIO io[WARP];
};

struct Shadow {
    int32_t writer = -1, reader = -1; /* reader -2: several threads */
    uint32_t wepoch = 0, repoch = 0;
    bool init = false, inflight = false;
};

struct Buffer {
    const unsigned char *base;
    size_t bytes;
    bool writable;
    std::string name;
};

struct Emu {
    FlashEmuConfig cfg;
    FlashEmuStats stats;
    int errors = 0;
    std::string messages;
    std::vector<Buffer> buffers;
    /* the launch */
    const char *kernel = "";
    const std::function<void(unsigned char *, int64_t, int)> *body = nullptr;
    int64_t block = 0;
    int nthreads = 0;
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    std::vector<uint64_t> ready; /* bitset of runnable threads */
    int last_run = -1;
    int bar_arrived = 0;
    uint64_t bar_epoch = 0;
    uint32_t epoch = 1; /* barrier intervals of the shadow */
    std::vector<unsigned char> smem;
    std::vector<Shadow> shadow;
    std::unordered_map<uintptr_t, int64_t> owner; /* 4-byte global word -> block (negative: atomics) */
    Thread *cur = nullptr;
    void *sched_sp = nullptr;
    bool abandon = false;
#ifdef FLASH_EMU_ASAN
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
#endif
};

Emu emu;

void error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void error(const char *fmt, ...)
{
    emu.errors++;
    if (emu.errors > MAX_MESSAGES)
        return;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char where[160];
    snprintf(where, sizeof where, "%s block %lld thread %d: ", emu.kernel, (long long)emu.block,
             emu.cur ? emu.cur->tid : -1);
    emu.messages += where;
    emu.messages += msg;
    emu.messages += "\n";
}

/* ---------------------------------------------------------------------------------------------- */
/* Fibers                                                                                          */

void set_ready(int tid) { emu.ready[(size_t)tid / 64] |= 1ull << (tid % 64); }
void clear_ready(int tid) { emu.ready[(size_t)tid / 64] &= ~(1ull << (tid % 64)); }

/* Back to the scheduler (from a fiber). finished: this fiber never runs again. */
void yield_to_scheduler(bool finished)
{
    Thread *t = emu.cur;
#ifdef FLASH_EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake, emu.sched_bottom, emu.sched_size);
#else
    (void)finished;
#endif
    flash_emu_switch(&t->sp, emu.sched_sp);
#ifdef FLASH_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, &emu.sched_bottom, &emu.sched_size);
#endif
}

void complete_copies(Thread *t, int64_t keep_groups);

[[noreturn]] void fiber_main()
{
#ifdef FLASH_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &emu.sched_bottom, &emu.sched_size);
#endif
    Thread *t = emu.cur;
    (*emu.body)(emu.smem.data(), emu.block, t->tid);
    if (!t->copies.empty()) {
        error("exits with %zu cp.async copies never waited for", t->copies.size());
        complete_copies(t, 0);
    }
    t->state = DONE;
    clear_ready(t->tid);
    for (;;)
        yield_to_scheduler(true);
}

void prepare_stack(Thread *t)
{
    if (!t->stack) {
        t->stack = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (t->stack == MAP_FAILED) {
            perror("flash_emu: mmap");
            exit(1);
        }
    }
#ifdef FLASH_EMU_ASAN
    /* a fiber that ran here before never returned: its frames' red zones are still marked */
    __asan_unpoison_memory_region(t->stack, STACK_BYTES);
#endif
    /* The first switch pops six registers and returns into fiber_main with the stack as after a
     * call: rsp = 8 mod 16. */
    uintptr_t top = ((uintptr_t)t->stack + STACK_BYTES) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr;                   /* fiber_main's return address: never used */
    *--sp = (void *)&fiber_main;       /* where the first switch returns to */
    for (int i = 0; i < 6; i++)
        *--sp = nullptr;               /* rbp, rbx, r12-r15 */
    t->sp = sp;
}

void run_thread(Thread *t)
{
    emu.cur = t;
    emu.stats.switches++;
#ifdef FLASH_EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, t->stack, STACK_BYTES);
#endif
    flash_emu_switch(&emu.sched_sp, t->sp);
#ifdef FLASH_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    emu.cur = nullptr;
}

/* The fiber waits (its state is set) until the scheduler sees it runnable again. */
void block_here()
{
    clear_ready(emu.cur->tid);
    yield_to_scheduler(false);
}

int pick_thread()
{
    const int n = emu.nthreads, words = (n + 63) / 64;
    switch (emu.cfg.schedule) {
    case FLASH_EMU_LOW_FIRST:
        for (int w = 0; w < words; w++)
            if (emu.ready[(size_t)w])
                return w * 64 + __builtin_ctzll(emu.ready[(size_t)w]);
        return -1;
    case FLASH_EMU_HIGH_FIRST:
        for (int w = words - 1; w >= 0; w--)
            if (emu.ready[(size_t)w])
                return w * 64 + 63 - __builtin_clzll(emu.ready[(size_t)w]);
        return -1;
    default: { /* the next runnable thread after the last one run, wrapping around */
        const int start = emu.last_run + 1 >= n ? 0 : emu.last_run + 1;
        for (int k = 0; k <= words; k++) {
            const int w = (start / 64 + k) % words;
            uint64_t bits = emu.ready[(size_t)w];
            if (k == 0)
                bits &= ~0ull << (start % 64);
            if (bits)
                return w * 64 + __builtin_ctzll(bits);
        }
        return -1;
    }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Shared memory and its shadow                                                                    */

Shadow *shadow_of(const void *p, size_t bytes, const char *what)
{
    const unsigned char *c = (const unsigned char *)p;
    if (c < emu.smem.data() || c + bytes > emu.smem.data() + emu.smem.size()) {
        error("%s outside shared memory (offset %lld, %zu bytes of %zu)", what, (long long)(c - emu.smem.data()),
              bytes, emu.smem.size());
        return nullptr;
    }
    if ((uintptr_t)(c - emu.smem.data()) % (bytes < 4 ? bytes : 4) != 0) {
        error("%s misaligned in shared memory", what);
        return nullptr;
    }
    return &emu.shadow[(size_t)(c - emu.smem.data()) / 4];
}

void shadow_read(Shadow *s, int tid, const char *what)
{
    if (s->inflight)
        error("%s reads a word whose cp.async has not been waited for", what);
    else if (!s->init)
        error("%s reads a shared word never written", what);
    else if (s->wepoch == emu.epoch && s->writer != tid)
        error("%s reads a word thread %d wrote since the last barrier", what, s->writer);
    if (s->repoch == emu.epoch && s->reader != tid)
        s->reader = -2;
    else if (s->repoch != emu.epoch) {
        s->reader = tid;
        s->repoch = emu.epoch;
    }
}

void shadow_write(Shadow *s, int tid, const char *what, bool async)
{
    if (s->inflight)
        error("%s writes a word with a cp.async still in flight", what);
    else if (s->wepoch == emu.epoch && s->writer != tid)
        error("%s writes a word thread %d wrote since the last barrier", what, s->writer);
    else if (s->repoch == emu.epoch && s->reader != tid)
        error("%s writes a word %s read since the last barrier", what,
              s->reader == -2 ? "several threads" : ("thread " + std::to_string(s->reader)).c_str());
    s->writer = tid;
    s->wepoch = emu.epoch;
    s->init = true;
    s->inflight = async;
}

/* Bank conflicts of one access of the warp: addresses (4-byte words) grouped per phase; a phase
 * needs as many wavefronts as the most distinct words any bank is asked for. */
void count_banks(const std::vector<uint32_t> &words, int64_t *wavefronts, int64_t *ideal)
{
    int per_bank[32] = {0};
    std::vector<uint32_t> seen;
    for (uint32_t w : words) {
        if (std::find(seen.begin(), seen.end(), w) != seen.end())
            continue; /* the same word is a broadcast */
        seen.push_back(w);
        per_bank[w % 32]++;
    }
    int worst = 1;
    for (int b = 0; b < 32; b++)
        worst = std::max(worst, per_bank[b]);
    *wavefronts += worst;
    *ideal += 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* Collectives                                                                                     */

void compute(Warp &w);

/* This lane arrives at a collective with its io filled; returns when all 32 have and the result
 * is in io.out / io.fout. */
LaneIO &arrive(int op, int param, const LaneIO &mine)
{
    Thread *t = emu.cur;
    const int lane = t->tid % WARP;
    Warp &w = emu.warps[(size_t)t->tid / WARP];
    emu.stats.collectives += lane == 0;
    if (w.arrived == 0) {
        w.op = op;
        w.param = param;
    } else if (w.op != op || w.param != param) {
        error("divergent warp: lane %d at %s (%d) while others are at %s (%d)", lane, op_name(op), param,
              op_name(w.op), w.param);
        emu.abandon = true; /* the scheduler stops; this fiber is never resumed */
        t->state = WAIT_WARP;
        block_here();
    }
    w.io[lane] = mine;
    if (++w.arrived == WARP) {
        compute(w);
        w.arrived = 0;
        w.epoch++;
        const int base = t->tid - lane;
        for (int l = 0; l < WARP; l++)
            if (emu.threads[(size_t)(base + l)].state == WAIT_WARP) {
                emu.threads[(size_t)(base + l)].state = READY;
                set_ready(base + l);
            }
        return w.io[lane];
    }
    t->state = WAIT_WARP;
    t->wait_epoch = w.epoch;
    block_here();
    return w.io[lane];
}

uint16_t smem_b16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

void compute(Warp &w)
{
    const int base = (int)(&w - emu.warps.data()) * WARP;
    switch (w.op) {
    case OP_LDSM:
    case OP_LDSM_T: {
        /* lanes 8i .. 8i+7: the rows of matrix i (16 bytes each) */
        emu.stats.ldsm++;
        uint16_t m[4][8][8];
        for (int l = 0; l < WARP; l++) {
            const unsigned char *row = (const unsigned char *)w.io[l].ptr;
            Shadow *s = shadow_of(row, 16, op_name(w.op));
            if ((uintptr_t)(row - emu.smem.data()) % 16)
                error("%s row address of lane %d not 16-byte aligned", op_name(w.op), l);
            for (int e = 0; e < 8; e++)
                m[l / 8][l % 8][e] = s ? smem_b16(row + 2 * e) : 0;
            if (s)
                for (int k = 0; k < 4; k++)
                    shadow_read(s + k, base + l, op_name(w.op));
        }
        for (int i = 0; i < 4; i++) { /* one wavefront per matrix when conflict-free */
            std::vector<uint32_t> words;
            for (int r = 0; r < 8; r++) {
                uint32_t wd = (uint32_t)(((const unsigned char *)w.io[8 * i + r].ptr - emu.smem.data()) / 4);
                for (int k = 0; k < 4; k++)
                    words.push_back(wd + (uint32_t)k);
            }
            count_banks(words, &emu.stats.ldsm_wavefronts, &emu.stats.ldsm_ideal);
        }
        for (int l = 0; l < WARP; l++)
            for (int i = 0; i < 4; i++) {
                uint16_t lo, hi;
                if (w.op == OP_LDSM) { /* row l/4, cols 2(l%4), 2(l%4)+1 */
                    lo = m[i][l / 4][2 * (l % 4)];
                    hi = m[i][l / 4][2 * (l % 4) + 1];
                } else { /* the transpose: rows 2(l%4), 2(l%4)+1 of col l/4 */
                    lo = m[i][2 * (l % 4)][l / 4];
                    hi = m[i][2 * (l % 4) + 1][l / 4];
                }
                w.io[l].out[i] = lo | (uint32_t)hi << 16;
            }
        break;
    }
    case OP_MMA: {
        /* PTX ISA m16n8k16 .bf16: A a0..a7 over in[0..3], B b0..b3 over in[4..5], C over fin */
        emu.stats.mma++;
        float A[16][16], B[16][8], C[16][8];
        for (int l = 0; l < WARP; l++) {
            const int g = l >> 2, t = l & 3;
            for (int i = 0; i < 8; i++) { /* a_i: row g (+8 for i = 2, 3, 6, 7), col 2t + (i & 1) (+8 for i >= 4) */
                const uint32_t reg = w.io[l].in[i / 2];
                const uint16_t v = (uint16_t)(i % 2 ? reg >> 16 : reg & 0xffff);
                const int row = g + ((i / 2) % 2) * 8, col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
                A[row][col] = flash_emu_float(v);
            }
            for (int i = 0; i < 4; i++) { /* b_i: row 2t + (i & 1) (+8 for i >= 2), col g */
                const uint32_t reg = w.io[l].in[4 + i / 2];
                const uint16_t v = (uint16_t)(i % 2 ? reg >> 16 : reg & 0xffff);
                B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g] = flash_emu_float(v);
            }
            for (int i = 0; i < 4; i++) /* c_i: row g (+8 for i >= 2), col 2t + (i & 1) */
                C[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)] = w.io[l].fin[i];
        }
        for (int l = 0; l < WARP; l++) {
            const int g = l >> 2, t = l & 3;
            for (int i = 0; i < 4; i++) {
                const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
                double acc = 0; /* bf16 products are exact; the sum of 16 is exact in double */
                for (int k = 0; k < 16; k++)
                    acc += (double)A[row][k] * (double)B[k][col];
                w.io[l].fout[i] = C[row][col] + (float)acc;
            }
        }
        break;
    }
    case OP_SHFL:
        for (int l = 0; l < WARP; l++)
            w.io[l].fout[0] = w.io[l ^ w.param].fin[0];
        break;
    case OP_ST_SHARED:
    case OP_LD_SHARED: {
        std::vector<uint32_t> words;
        for (int l = 0; l < WARP; l++) {
            unsigned char *p = (unsigned char *)w.io[l].ptr;
            Shadow *s = shadow_of(p, 4, op_name(w.op));
            if (!s)
                continue;
            words.push_back((uint32_t)((p - emu.smem.data()) / 4));
            if (w.op == OP_ST_SHARED) {
                shadow_write(s, base + l, "st.shared", false);
                memcpy(p, &w.io[l].in[0], 4);
            } else {
                shadow_read(s, base + l, "ld.shared");
                memcpy(&w.io[l].fout[0], p, 4);
            }
        }
        count_banks(words, &emu.stats.shared_wavefronts, &emu.stats.shared_ideal);
        break;
    }
    default:
        break;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* cp.async                                                                                        */

void land(Thread *t, const Copy &c)
{
    Shadow *s = shadow_of(c.dst, (size_t)c.bytes, "cp.async");
    if (!s)
        return;
    if (emu.cfg.lazy_copies) {
        if (c.valid)
            memcpy(c.dst, c.src, (size_t)c.bytes);
        else
            memset(c.dst, 0, (size_t)c.bytes);
    }
    for (int k = 0; k < c.bytes / 4; k++) {
        s[k].inflight = false;
        s[k].writer = t->tid;
        s[k].wepoch = emu.epoch; /* the data is this thread's now; others need a barrier */
    }
}

void complete_copies(Thread *t, int64_t keep_groups)
{
    size_t n = 0;
    while (n < t->copies.size() && t->copies[n].group < t->committed - keep_groups) {
        land(t, t->copies[n]);
        n++;
    }
    t->copies.erase(t->copies.begin(), t->copies.begin() + (long)n);
}

void issue_copy(void *smem, const void *gmem, int bytes, bool valid)
{
    Thread *t = emu.cur;
    if (valid)
        flash_emu_global(gmem, (size_t)bytes, false, false);
    Shadow *s = shadow_of(smem, (size_t)bytes, "cp.async");
    if (!s)
        return;
    if ((uintptr_t)((unsigned char *)smem - emu.smem.data()) % (size_t)bytes)
        error("cp.async of %d bytes to a misaligned shared address", bytes);
    for (int k = 0; k < bytes / 4; k++)
        shadow_write(s + k, t->tid, "cp.async", true);
    Copy c{(unsigned char *)smem, (const unsigned char *)gmem, bytes, valid, t->committed};
    if (!emu.cfg.lazy_copies) { /* the data arrives now; the shadow still says in flight */
        if (valid)
            memcpy(c.dst, c.src, (size_t)bytes);
        else
            memset(c.dst, 0, (size_t)bytes);
    }
    t->copies.push_back(c);
}

} /* namespace */

/* ---------------------------------------------------------------------------------------------- */
/* The primitives                                                                                  */

uint16_t flash_emu_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it one */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

void flash_sync_cta()
{
    Thread *t = emu.cur;
    if (++emu.bar_arrived == emu.nthreads) {
        emu.bar_arrived = 0;
        emu.bar_epoch++;
        emu.epoch++;
        for (Thread &o : emu.threads)
            if (o.state == WAIT_CTA) {
                o.state = READY;
                set_ready(o.tid);
            }
        return;
    }
    t->state = WAIT_CTA;
    t->wait_epoch = emu.bar_epoch;
    block_here();
}

void flash_ldsm_x4(uint32_t (&r)[4], const void *row)
{
    LaneIO io{};
    io.ptr = row;
    LaneIO &res = arrive(OP_LDSM, 0, io);
    memcpy(r, res.out, sizeof r);
}

void flash_ldsm_x4_trans(uint32_t (&r)[4], const void *row)
{
    LaneIO io{};
    io.ptr = row;
    LaneIO &res = arrive(OP_LDSM_T, 0, io);
    memcpy(r, res.out, sizeof r);
}

void flash_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    LaneIO io{};
    memcpy(io.in, a, sizeof a);
    io.in[4] = b0;
    io.in[5] = b1;
    memcpy(io.fin, d, sizeof d);
    LaneIO &res = arrive(OP_MMA, 0, io);
    memcpy(d, res.fout, sizeof d);
}

float flash_shfl_xor(float v, int mask)
{
    LaneIO io{};
    io.fin[0] = v;
    return arrive(OP_SHFL, mask, io).fout[0];
}

void flash_st_shared_u32(void *p, uint32_t v)
{
    LaneIO io{};
    io.ptr = p;
    io.in[0] = v;
    arrive(OP_ST_SHARED, 0, io);
}

float flash_ld_shared_f32(const void *p)
{
    LaneIO io{};
    io.ptr = p;
    return arrive(OP_LD_SHARED, 0, io).fout[0];
}

void flash_cp_async_16(void *smem, const void *gmem, bool valid) { issue_copy(smem, gmem, 16, valid); }
void flash_cp_async_4(void *smem, const void *gmem, bool valid) { issue_copy(smem, gmem, 4, valid); }
void flash_cp_async_commit() { emu.cur->committed++; }
void flash_emu_cp_async_wait(int n) { complete_copies(emu.cur, n); }

void flash_emu_global(const void *p, size_t bytes, bool write, bool atomic)
{
    const unsigned char *c = (const unsigned char *)p;
    if ((uintptr_t)c % bytes) {
        error("global access of %zu bytes misaligned", bytes);
        return;
    }
    for (const Buffer &b : emu.buffers)
        if (c >= b.base && c + bytes <= b.base + b.bytes) {
            if (write && !b.writable)
                error("writes to read-only buffer %s", b.name.c_str());
            if (write)
                for (size_t k = 0; k < bytes; k += 4) {
                    const uintptr_t word = (uintptr_t)(c + k);
                    const int64_t me = atomic ? -1 - emu.block : emu.block;
                    auto it = emu.owner.find(word);
                    if (it == emu.owner.end()) {
                        emu.owner.emplace(word, me);
                    } else if (it->second != me) {
                        const bool both_atomic = it->second < 0 && me < 0;
                        if (!both_atomic)
                            error("%s float %lld: written by blocks %lld and %lld of one launch, not both atomically",
                                  b.name.c_str(), (long long)((c + k - b.base) / 4),
                                  (long long)(it->second < 0 ? -1 - it->second : it->second), (long long)emu.block);
                    }
                }
            return;
        }
    error("global access of %zu bytes outside every buffer", bytes);
}

static bool global_ok(const void *p, size_t bytes, bool atomic)
{
    int before = emu.errors;
    flash_emu_global(p, bytes, true, atomic);
    return emu.errors == before;
}

void flash_st_global_u32(void *p, uint32_t v)
{
    if (global_ok(p, 4, false))
        memcpy(p, &v, 4);
}
void flash_st_global_f32(float *p, float v)
{
    if (global_ok(p, 4, false))
        *p = v;
}
void flash_add_global_f32x2(float *p, float a, float b)
{
    if (global_ok(p, 8, false)) {
        p[0] += a;
        p[1] += b;
    }
}
void flash_add_global_f32(float *p, float v)
{
    if (global_ok(p, 4, false))
        *p += v;
}
void flash_atomic_add_f32(float *p, float v)
{
    emu.stats.atomics++;
    if (global_ok(p, 4, true))
        *p += v;
}

/* ---------------------------------------------------------------------------------------------- */
/* Driving it                                                                                      */

void flash_emu_configure(FlashEmuConfig c) { emu.cfg = c; }

void flash_emu_buffer(const void *base, size_t bytes, bool writable, const char *name)
{
    emu.buffers.push_back(Buffer{(const unsigned char *)base, bytes, writable, name});
}
void flash_emu_clear_buffers() { emu.buffers.clear(); }

int flash_emu_launch(const char *name, int64_t blocks, int threads, int smem,
                     const std::function<void(unsigned char *, int64_t, int)> &body)
{
    const int errors_before = emu.errors;
    emu.kernel = name;
    emu.body = &body;
    emu.nthreads = threads;
    emu.owner.clear();
    if (emu.threads.size() < (size_t)threads)
        emu.threads.resize((size_t)threads);
    emu.warps.assign((size_t)(threads + WARP - 1) / WARP, Warp());
    emu.ready.assign((size_t)(threads + 63) / 64, 0);
    if (threads % WARP)
        error("%d threads: not whole warps", threads);
    for (int64_t b = 0; b < blocks && !emu.abandon; b++) {
        emu.block = b;
        emu.stats.blocks++;
        /* fresh shared memory: garbage, and a shadow that knows nothing is written */
        emu.smem.assign((size_t)smem, 0xa5);
        emu.shadow.assign((size_t)(smem + 3) / 4, Shadow());
        emu.epoch = 1;
        emu.bar_arrived = 0;
        emu.last_run = -1;
        for (Warp &w : emu.warps)
            w.arrived = 0;
        for (int i = 0; i < threads; i++) {
            Thread &t = emu.threads[(size_t)i];
            t.tid = i;
            t.state = READY;
            t.copies.clear();
            t.committed = 0;
            prepare_stack(&t);
            set_ready(i);
        }
        for (;;) {
            const int next = pick_thread();
            if (next < 0)
                break;
            emu.last_run = next;
            run_thread(&emu.threads[(size_t)next]);
            if (emu.abandon)
                break;
        }
        if (emu.abandon)
            break;
        int waiting = 0, first = -1;
        for (int i = 0; i < threads; i++)
            if (emu.threads[(size_t)i].state != DONE && waiting++ == 0)
                first = i;
        if (waiting) {
            const Thread &t = emu.threads[(size_t)first];
            error("deadlock: %d threads never finish (thread %d waits at %s)", waiting, first,
                  t.state == WAIT_CTA ? "a barrier" : op_name(emu.warps[(size_t)first / WARP].op));
            break;
        }
    }
    emu.abandon = false;
    emu.cur = nullptr;
    return emu.errors - errors_before;
}

int flash_emu_errors(std::string *messages)
{
    if (messages)
        *messages = emu.messages;
    return emu.errors;
}

FlashEmuStats flash_emu_stats() { return emu.stats; }

void flash_emu_reset()
{
    emu.errors = 0;
    emu.messages.clear();
    emu.stats = FlashEmuStats();
}
