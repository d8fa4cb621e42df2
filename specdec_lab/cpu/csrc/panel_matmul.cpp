/* y (R, N) = x (R, K) @ W (K, N) for the few rows of decode and verification, in float32.
 *
 * Batch-1 decode is a matrix-vector product: every weight is read once per token and
 * used for one multiply-add, so the time is the time to stream W from memory. A plain
 * row-major W makes a narrow product (576 x 576, say) jump between rows; prefetchers
 * and TLBs lose time on it. Here W is stored once, ahead of time, as column panels:
 *
 *     P[t][k][j] = W[k][t * PW + j]      t < N / PW, k < K, j < PW
 *
 * so one panel is a single contiguous stream of K * PW floats, and the whole product
 * reads P front to back, in address order. Each panel's PW output columns, for up to
 * RB rows, stay in registers (RB * PW / 16 = 16 AVX-512 registers) while its K rows go
 * by; the compiler vectorises the j loops. More than RB rows take further passes over
 * the same panel, which is then still in L2.
 *
 * With AVX2 only (16 registers of 8 floats), a row of a panel takes 4 registers, and past
 * 3 rows the compiler keeps some accumulators on the stack. That costs arithmetic, not
 * reads: while the weights stream from memory, verification's few rows still cost little
 * more than one. A variant that covered half a panel per pass (up to 6 rows in 12
 * registers, the halves in two passes) was faster on a matrix held in cache but slower in
 * the target's forward, where weights come from memory (a 3-token forward 1.33-1.48x a
 * 1-token one, against 1.01-1.20x with this loop; one thread, three alternating rounds).
 *
 * Every output element is one chain of fused multiply-adds in k order, whatever R is,
 * so a row's result is bit-for-bit the same in a one-row product and in a K+1-row
 * verification product.
 *
 * Panels are independent, so with several threads each takes a share of them. Threads come
 * from PyTorch's own pool (at::parallel_for, ATen's OpenMP runtime), so the kernel and
 * torch's operators never compete with two sets of threads; torch.set_num_threads rules
 * both. Built without ATen (SPECDEC_LAB_SERIAL), it runs on the calling thread.
 *
 * Built at first use by specdec_lab/cpu/build.py with the C++ compiler at hand:
 *     c++ -O3 -march=native -ffp-contract=fast -fopenmp -shared -fPIC, against torch's headers
 */
#ifndef SPECDEC_LAB_SERIAL
#include <ATen/Parallel.h>
#endif
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define PW 32        /* panel width, in floats: N must be a multiple (build.py pads) */
#define RB 8         /* rows held in registers per pass over a panel */
#define PREFETCH 2048 /* floats ahead (8 KiB) that each step asks the memory system for */

static inline __attribute__((always_inline)) void panel_rows(
        const float *__restrict x, const long rows, const float *__restrict p,
        float *__restrict y, const long K, const long N) {
    float acc[RB][PW] = {{0}};
    for (long k = 0; k < K; k++) {
        const float *w = p + k * PW;
        __builtin_prefetch(w + PREFETCH);
        __builtin_prefetch(w + PREFETCH + 16);
        for (long r = 0; r < rows; r++) {
            const float xr = x[r * K + k];
            for (long j = 0; j < PW; j++) acc[r][j] += xr * w[j];
        }
    }
    for (long r = 0; r < rows; r++)
        for (long j = 0; j < PW; j++) y[r * N + j] = acc[r][j];
}

/* Rows r0.. of panel t: the switch hands panel_rows a constant row count, so each case
 * compiles to straight-line code with no row loop left. */
__attribute__((noinline)) static void one_panel(const float *x, long R, const float *P, float *y, long K, long N, long t) {
    const float *p = P + t * K * PW;
    for (long r0 = 0; r0 < R; r0 += RB) {
        const float *xr = x + r0 * K;
        float *yr = y + r0 * N + t * PW;
        switch (R - r0 < RB ? R - r0 : RB) {
        case 1: panel_rows(xr, 1, p, yr, K, N); break;
        case 2: panel_rows(xr, 2, p, yr, K, N); break;
        case 3: panel_rows(xr, 3, p, yr, K, N); break;
        case 4: panel_rows(xr, 4, p, yr, K, N); break;
        case 5: panel_rows(xr, 5, p, yr, K, N); break;
        case 6: panel_rows(xr, 6, p, yr, K, N); break;
        case 7: panel_rows(xr, 7, p, yr, K, N); break;
        case 8: panel_rows(xr, 8, p, yr, K, N); break;
        }
    }
}

/* x (R, K) and y (R, N) row-major; P as above, N a multiple of PW. */
extern "C" void panel_matmul(const float *x, long R, const float *P, float *y, long K, long N) {
    const long panels = N / PW;
#ifdef SPECDEC_LAB_SERIAL
    for (long t = 0; t < panels; t++) one_panel(x, R, P, y, K, N, t);
#else
    const long grain = (16384 + K * PW - 1) / (K * PW);  /* at least 64 KiB of weight per task */
    at::parallel_for(0, panels, grain, [&](int64_t begin, int64_t end) {
        for (long t = begin; t < end; t++) one_panel(x, R, P, y, K, N, t);
    });
#endif
}

/* y (R, D) = x / sqrt(mean(x^2) + eps) * w, row by row: RMSNorm for the same few rows, in
 * one call instead of the half-dozen operators PyTorch's composite rms_norm runs. */
extern "C" void rms_norm(const float *x, long R, long D, const float *w, float eps, float *y) {
    for (long r = 0; r < R; r++, x += D, y += D) {
        double ss = 0.0;
        for (long d = 0; d < D; d++) ss += (double)x[d] * x[d];
        const float scale = (float)(1.0 / __builtin_sqrt(ss / D + eps));
        for (long d = 0; d < D; d++) y[d] = x[d] * scale * w[d];
    }
}

extern "C" long panel_width(void) { return PW; }

/* 1 when products split over torch's threads, 0 when they run on the calling thread. */
extern "C" long panel_threaded(void) {
#ifdef SPECDEC_LAB_SERIAL
    return 0;
#else
    return 1;
#endif
}

/* ---------------------------------------------------------------------------------------
 * A few tokens through a whole Llama-style decoder, in one call, whatever the shape around them.
 *
 * An eager forward is some 15 operator calls a layer (views and slices included). For a draft
 * of a few narrow layers they are the whole cost; for the default target's 30 layers they
 * added about 30% to a one-token forward whose weights stream from memory. This
 * function runs the same arithmetic for R rows with no operator in between: per layer RMSNorm,
 * the fused q/k/v product, rotary embedding, the key/value cache write, grouped attention,
 * the output product, RMSNorm, the fused gate/up product, SiLU, the down product; then the
 * final RMSNorm and, if n_out > 0, the head.
 *
 * The rows need not be one sequence's chain. Each row r says, as vLLM's flattened batch does:
 *   pos[r]            its rotary position (a row of the cos and sin tables)
 *   write[r]          the key row its key and value go to
 *   keys[start[r] .. start[r] + count[r])   the key rows it attends over, in order
 * A key row is a row of D floats of head 0 in one layer of the cache; head g's is head_stride rows
 * further, and layer l's cache begins l * layer_stride floats in. A contiguous cache (L, 1, Hkv, S, D)
 * is head_stride S with key row t = position t; a paged pool (L, N, Hkv, P, D) is head_stride P with
 * the row of block b, offset o = b Hkv P + o. So one call takes one sequence's chain (row r sees
 * positions 0..L + r), a token tree (row r sees the cache and its ancestors), or several sequences
 * at once, each over its own blocks. Every row's keys are written before any row attends.
 *
 * The float32 products are panel_matmul's and everything else works row by row, so a row's result
 * is bit-for-bit the same whatever the other rows are: a decode token alone, the same token inside
 * a K+1-row verification, inside a tree or inside a batch of sequences get the same logits, given
 * the same keys. Attention and the rest agree with the eager path to rounding. Attention's
 * (row, head) pairs are split over threads; each thread scores in its own max_keys floats of work.
 *
 * taps (n_layers entries): -1, or the slot j at which the residual stream after layer l is copied
 * into tap_out (R, n_taps * dim), columns [j dim, (j + 1) dim): the layer states an EAGLE-3 draft reads.
 *
 * Shapes: rows (R, dim); cos and sin the whole rotary tables (positions, D), in the rotate-half
 * layout; every product's output width is padded to a multiple of PW (the panels are), written P(n)
 * below; logits (R, P(n_out)). work holds forward_work(...) floats; after the call its rows
 * [R, 2R) of width dim are the final normalised hidden states.
 */
static inline long padded(long n) { return (n + PW - 1) / PW * PW; }

/* y (R, N) = x (R, K) @ P in float32: panel_matmul, split over threads only for a matrix of
 * 1 MiB or more (a small draft's products are over before threads would start). */
static void product(const float *x, long R, const float *P, float *y, long K, long N) {
#ifndef SPECDEC_LAB_SERIAL
    if (K * N >= (1 << 18)) { panel_matmul(x, R, P, y, K, N); return; }
#endif
    for (long t = 0; t < N / PW; t++) one_panel(x, R, P, y, K, N, t);
}

#ifdef __F16C__
/* One row against half-precision panels: 32 outputs in 4 registers, two sets of them (even and
 * odd k) so that consecutive multiply-adds do not wait on each other. */
static void product_row(const float *x, const unsigned short *P, float *y, long K, long N) {
    for (long t = 0; t < N / PW; t++) {
        const unsigned short *p = P + t * K * PW;
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        long k = 0;
        for (; k + 1 < K; k += 2) {
            const unsigned short *w = p + k * PW;
            __builtin_prefetch(w + 2 * PREFETCH);
            __builtin_prefetch(w + 2 * PREFETCH + 32);
            const __m256 x0 = _mm256_broadcast_ss(x + k), x1 = _mm256_broadcast_ss(x + k + 1);
            for (int i = 0; i < 4; i++) {
                a[i] = _mm256_fmadd_ps(x0, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 8 * i))), a[i]);
                a[4 + i] = _mm256_fmadd_ps(x1, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + PW + 8 * i))),
                                           a[4 + i]);
            }
        }
        for (; k < K; k++) {
            const __m256 x0 = _mm256_broadcast_ss(x + k);
            for (int i = 0; i < 4; i++)
                a[i] = _mm256_fmadd_ps(x0, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + k * PW + 8 * i))), a[i]);
        }
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(y + t * PW + 8 * i, _mm256_add_ps(a[i], a[4 + i]));
    }
}
#endif

#ifdef __AVX2__
/* One row against int8 panels. Panel t is K * PW signed bytes, laid out as the float panels
 * are, then PW float scales, one per output column: W[k][n] = scale[n] * Q[k][n]. The bytes are
 * widened to float in registers, the products summed in float32, and each sum scaled once at
 * the end. Two sets of accumulators (even and odd k), as in the half-precision product. */
static void product_row(const float *x, const signed char *P, float *y, long K, long N) {
    const long stride = K * PW + PW * (long)sizeof(float);  /* bytes per panel */
    for (long t = 0; t < N / PW; t++) {
        const signed char *p = P + t * stride;
        const float *scale = (const float *)(p + K * PW);
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
#define WIDEN(ptr) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(ptr))))
        long k = 0;
        for (; k + 1 < K; k += 2) {
            const signed char *w = p + k * PW;
            __builtin_prefetch(w + 4 * PREFETCH);
            const __m256 x0 = _mm256_broadcast_ss(x + k), x1 = _mm256_broadcast_ss(x + k + 1);
            for (int i = 0; i < 4; i++) {
                a[i] = _mm256_fmadd_ps(x0, WIDEN(w + 8 * i), a[i]);
                a[4 + i] = _mm256_fmadd_ps(x1, WIDEN(w + PW + 8 * i), a[4 + i]);
            }
        }
        for (; k < K; k++) {
            const __m256 x0 = _mm256_broadcast_ss(x + k);
            for (int i = 0; i < 4; i++) a[i] = _mm256_fmadd_ps(x0, WIDEN(p + k * PW + 8 * i), a[i]);
        }
#undef WIDEN
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(y + t * PW + 8 * i,
                             _mm256_mul_ps(_mm256_add_ps(a[i], a[4 + i]), _mm256_loadu_ps(scale + 8 * i)));
    }
}
#endif

#if defined(__AVX2__) && defined(__F16C__)
/* One row against 4-bit panels (kernels.pack(w, torch.uint4)). Each panel is K / 32 groups of 32
 * inputs by its PW = 32 columns, 640 bytes a group: 16 pairs of inputs (k, k + 1) of 32 bytes,
 * then 32 half-precision scales d and 32 offsets m, one per column:
 *
 *     W[k][n] = d[g][n] * Q[k][n] + m[g][n],   Q in 0..15, g = k / 32
 *
 * 5 bits a weight, against 8 for int8 and 32 for float32. That is Q4_1's arithmetic (ggml), laid
 * out so that a panel still reads front to back; the default target came as Q4_1, so its layers'
 * weights come back exactly.
 *
 * Widening each weight to float would cost more arithmetic than a 4-bit weight saves in reads. So
 * x is rounded to int16, with a scale per group (2^-15 of the group's largest magnitude), and a
 * pair of inputs meets its pair of weights in one integer multiply-add (_mm256_madd_epi16),
 * summed exactly in int32 (at most 32 * 15 * 32767 < 2^31). The 32 bytes of a pair are 8 32-bit
 * lanes; lane i holds, in 4-bit steps, Q[k][i], Q[k][8 + i], Q[k][16 + i], Q[k][24 + i] in its
 * low 16 bits and the same columns of k + 1 in its high 16 bits. Shifting by 4 j and masking
 * leaves (Q[k][8 j + i], Q[k + 1][8 j + i]) in lane i: columns 8 j .. 8 j + 7, ready for the
 * multiply-add, with no shuffle. A group's sums are scaled to float once:
 *     y[n] += d[n] * sx * sum_k Q[k][n] x16[k] + m[n] * sum_k x[k]. */
#define Q4_GROUP 640
#define Q4_MAX_K 16384
#ifndef Q4_PREFETCH
#define Q4_PREFETCH 8192
#endif
/* x (G groups of 32) rounded to int16 per group: xq = x / sx, sx the group's largest magnitude / 32767;
 * xsum, where asked for, each group's sum in float. */
static void round_groups(const float *x, long G, short *xq, float *sx, float *xsum) {
    for (long g = 0; g < G; g++) {
        const float *xg = x + g * 32;
        float top = 0.0f, sum = 0.0f;
        for (int i = 0; i < 32; i++) {
            top = __builtin_fabsf(xg[i]) > top ? __builtin_fabsf(xg[i]) : top;
            sum += xg[i];
        }
        const float s = top > 0.0f ? top / 32767.0f : 1.0f;
        for (int i = 0; i < 32; i++) xq[g * 32 + i] = (short)__builtin_lrintf(xg[i] / s);
        sx[g] = s;
        if (xsum) xsum[g] = sum;
    }
}

static void product_row(const float *x, const unsigned char *P, float *y, long K, long N) {
    const long G = K / 32;
    short xq[Q4_MAX_K] __attribute__((aligned(32)));
    float sx[Q4_MAX_K / 32], xsum[Q4_MAX_K / 32];
    round_groups(x, G, xq, sx, xsum);
    const __m256i low = _mm256_set1_epi16(0x000F);
    for (long t = 0; t < N / PW; t++) {
        const unsigned char *p = P + t * G * Q4_GROUP;
        __m256 acc[4];
        for (int i = 0; i < 4; i++) acc[i] = _mm256_setzero_ps();
        for (long g = 0; g < G; g++) {
            const unsigned char *q = p + g * Q4_GROUP;
            const int *xp = (const int *)(xq + g * 32);  /* x16[k], x16[k + 1] as one int32 */
            __m256i s[4];
            for (int i = 0; i < 4; i++) s[i] = _mm256_setzero_si256();
            for (int j = 0; j < 16; j++) {
                if ((j & 1) == 0) __builtin_prefetch(q + 32 * j + Q4_PREFETCH);
                const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * j));
                const __m256i xx = _mm256_set1_epi32(xp[j]);
                s[0] = _mm256_add_epi32(s[0], _mm256_madd_epi16(_mm256_and_si256(v, low), xx));
                s[1] = _mm256_add_epi32(s[1], _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), xx));
                s[2] = _mm256_add_epi32(s[2], _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 8), low), xx));
                s[3] = _mm256_add_epi32(s[3], _mm256_madd_epi16(_mm256_srli_epi16(v, 12), xx));  /* nothing above */
            }
            const unsigned short *dm = (const unsigned short *)(q + 512);
            const __m256 xs = _mm256_set1_ps(xsum[g]), sg = _mm256_set1_ps(sx[g]);
            for (int i = 0; i < 4; i++) {
                const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dm + 8 * i))), sg);
                const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dm + 32 + 8 * i)));
                acc[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s[i]), _mm256_fmadd_ps(m, xs, acc[i]));
            }
        }
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(y + t * PW + 8 * i, acc[i]);
    }
}

/* One row against int8 panels with a half-precision scale per column and group of 32 inputs
 * (kernels.pack(w, torch.qint8)): W[k][n] = d[g][n] * Q[k][n], Q in -127..127. That is Q8_0's
 * arithmetic (ggml), in which the default target's embedding, and so its tied head, came. A group is
 * 16 pairs of inputs (k, k + 1) of 64 bytes, Q[k][n] and Q[k + 1][n] side by side for n = 0..31,
 * then the 32 scales: 1088 bytes. x is rounded to int16 per group as for the 4-bit panels, and each
 * 16 bytes (8 columns' pairs) widen to int16 and meet x in one multiply-add, exact in int32
 * (32 * 127 * 32767 < 2^31). */
struct q8_group { signed char q; };  /* a type of its own, so that product() picks this product_row */
#define Q8_GROUP 1088
static void product_row(const float *x, const q8_group *P8, float *y, long K, long N) {
    const signed char *P = (const signed char *)P8;
    const long G = K / 32;
    short xq[Q4_MAX_K] __attribute__((aligned(32)));
    float sx[Q4_MAX_K / 32];
    round_groups(x, G, xq, sx, nullptr);
    for (long t = 0; t < N / PW; t++) {
        const signed char *p = P + t * G * Q8_GROUP;
        __m256 acc[4];
        for (int i = 0; i < 4; i++) acc[i] = _mm256_setzero_ps();
        for (long g = 0; g < G; g++) {
            const signed char *q = p + g * Q8_GROUP;
            const int *xp = (const int *)(xq + g * 32);
            __m256i s[4];
            for (int i = 0; i < 4; i++) s[i] = _mm256_setzero_si256();
            for (int j = 0; j < 16; j++) {
                __builtin_prefetch(q + 64 * j + Q4_PREFETCH);
                const __m256i xx = _mm256_set1_epi32(xp[j]);
                for (int i = 0; i < 4; i++)
                    s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(
                        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 64 * j + 16 * i))), xx));
            }
            const unsigned short *dq = (const unsigned short *)(q + 1024);
            const __m256 sg = _mm256_set1_ps(sx[g]);
            for (int i = 0; i < 4; i++)
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dq + 8 * i))), sg),
                                         _mm256_cvtepi32_ps(s[i]), acc[i]);
        }
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(y + t * PW + 8 * i, acc[i]);
    }
}
#endif

/* Rounded weights, R rows: one pass over the panels per row (drafts decode one row at a time). */
template <typename W>
static void product(const float *x, long R, const W *P, float *y, long K, long N) {
    for (long r = 0; r < R; r++) product_row(x + r * K, P, y + r * N, K, N);
}

/* a . b over D floats in 8 interleaved partial sums, which the compiler keeps in one vector
 * register; a single running sum would wait on each multiply-add in turn. */
static inline float dot(const float *a, const float *b, long D) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail = 0.0f;
    long i = 0;
    for (; i + 8 <= D; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    for (; i < D; i++) tail += a[i] * b[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + tail;
}

/* exp for attention's softmax and the MLP's SiLU, eight floats at a time. A scalar expf per element
 * (the compiler keeps libm's call: vectorising it needs -ffast-math, which would also let it
 * reorder the products' sums) ran some 70k times a row through the default target's 30 layers
 * (46k SiLUs, 24k attention weights at 80 positions); this took an 8-row forward from 31.1 to 29.6 ms
 * (one thread, best of 15 alternating rounds). Here x = n ln2 + r with n an integer and
 * |r| <= ln2 / 2 (ln2 split in two so that n ln2 is exact), e^r is its Taylor series to r^7
 * (relative error under 1e-8, below float's 6e-8), and 2^n goes into the exponent bits. Inputs are
 * clamped to [-87, 88], where 2^n stays a normal float: e^-87 = 2e-38 stands in for anything smaller,
 * which after a sum or a 1 + e changes nothing. Every element goes through the same instructions, a
 * short tail through the same code on a padded copy, so a row's result still does not depend on R. */
#ifdef __AVX2__
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  /* ln2's leading bits: n * this is exact */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);      /* and the rest of ln2 */
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

/* out[i] = silu(gate[i]) * up[i] = gate / (1 + e^-gate) * up */
static inline __m256 silu_mul8(__m256 g, __m256 u) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}
#endif

static void silu_mul(const float *gate, const float *up, float *out, long n) {
    long i = 0;
#ifdef __AVX2__
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        float g[8] = {0}, u[8] = {0}, o[8];
        for (long j = i; j < n; j++) g[j - i] = gate[j], u[j - i] = up[j];
        _mm256_storeu_ps(o, silu_mul8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
        for (long j = i; j < n; j++) out[j] = o[j - i];
    }
#else
    for (; i < n; i++) out[i] = gate[i] / (1.0f + __builtin_expf(-gate[i])) * up[i];
#endif
}

/* s[t] = e^(s[t] - top) for t < n; returns their sum (in eight partial sums with AVX2). */
static float exp_shifted(float *s, long n, float top) {
#ifdef __AVX2__
    const __m256 shift = _mm256_set1_ps(top);
    __m256 sum = _mm256_setzero_ps();
    long t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), shift));
        _mm256_storeu_ps(s + t, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (t < n) {
        float b[8], o[8];
        for (long j = 0; j < 8; j++) b[j] = t + j < n ? s[t + j] : -__builtin_inff();
        const __m256 valid = _mm256_cmp_ps(_mm256_loadu_ps(b), _mm256_set1_ps(-__builtin_inff()), _CMP_NEQ_OQ);
        const __m256 e = _mm256_and_ps(valid, exp8(_mm256_sub_ps(_mm256_loadu_ps(b), shift)));
        _mm256_storeu_ps(o, e);
        for (long j = t; j < n; j++) s[j] = o[j - t];
        sum = _mm256_add_ps(sum, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
#else
    float sum = 0.0f;
    for (long t = 0; t < n; t++) sum += (s[t] = __builtin_expf(s[t] - top));
    return sum;
#endif
}

/* o (D) = sum over t < n of p[t] * v[keys[t]] (rows of D floats), in t order. With D a constant the
 * sum stays in registers for all the positions; with D read at run time it loaded and stored o around
 * every position, and that store-to-load chain was the largest cost of attention. Through the index,
 * the compiler no longer held the plain loop's sum in registers (7x slower alone, a 5-row forward at
 * 400 positions 15% slower), so with AVX2 the D / 8 sums are written as vector registers. */
template <long D>
static inline void weighted_sum(const float *__restrict p, const long *__restrict keys, long n,
                                const float *__restrict v, float *__restrict o) {
#ifdef __AVX2__
    __m256 acc[D / 8];
    for (long i = 0; i < D / 8; i++) acc[i] = _mm256_setzero_ps();
    for (long t = 0; t < n; t++) {
        const float *vt = v + keys[t] * D;
        const __m256 pt = _mm256_set1_ps(p[t]);
        for (long i = 0; i < D / 8; i++) acc[i] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * i), acc[i]);
    }
    for (long i = 0; i < D / 8; i++) _mm256_storeu_ps(o + 8 * i, acc[i]);
#else
    float acc[D] = {0};
    for (long t = 0; t < n; t++)
        for (long i = 0; i < D; i++) acc[i] += p[t] * v[keys[t] * D + i];
    for (long i = 0; i < D; i++) o[i] = acc[i];
#endif
}

static void rotate(float *v, const float *cos, const float *sin, long D) {  /* one head, in place */
    const long half = D / 2;
    for (long i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* Floats of work a forward over R rows needs, attending over at most max_keys keys on `threads`
 * threads (model.FusedForward sizes its buffer with it). */
extern "C" long forward_work(long R, long dim, long H, long Hkv, long D, long I, long max_keys, long threads) {
    return R * (2 * dim + padded(dim) + padded((H + 2 * Hkv) * D) + H * D + padded(2 * I) + I)
           + R * (3 * max_keys + 2) + 2  /* a mask's kept keys (int64, two floats each), their values, counts */
           + max_keys * threads;  /* each thread's scores */
}

/* Row r, query head j: o (D) = softmax(q . keys / sqrt(D) + bias) . values over the row's key rows;
 * bias (one value per key) may be null. */
static void attend_one(const float *q, const long *keys, long n, const float *bias, const float *kg,
                       const float *vg, long D, float scale, float *scores, float *o) {
    float top = -__builtin_inff();
    for (long t = 0; t < n; t++) {
        const float s = dot(q, kg + keys[t] * D, D) * scale;
        scores[t] = bias != nullptr ? s + bias[t] : s;
        top = scores[t] > top ? scores[t] : top;
    }
    if (n == 0) {  /* a row that sees nothing: zeros (the eager forward's softmax gives NaN) */
        for (long i = 0; i < D; i++) o[i] = 0.0f;
        return;
    }
    const float sum = exp_shifted(scores, n, top);
    for (long t = 0; t < n; t++) scores[t] /= sum;
    switch (D) {  /* a head width known here keeps o in registers over the positions */
    case 32: weighted_sum<32>(scores, keys, n, vg, o); break;
    case 64: weighted_sum<64>(scores, keys, n, vg, o); break;
    case 128: weighted_sum<128>(scores, keys, n, vg, o); break;
    default:
        for (long i = 0; i < D; i++) o[i] = 0.0f;
        for (long t = 0; t < n; t++)
            for (long i = 0; i < D; i++) o[i] += scores[t] * vg[keys[t] * D + i];
    }
}

template <typename W, typename WH = W>
static long forward(
        const float *rows, long R, long n_layers,
        const float *const *attn_norm, const W *const *wqkv, const W *const *wo,
        const float *const *mlp_norm, const W *const *w13, const W *const *w2,
        const float *final_norm, const WH *head, long n_out,
        float *k_cache, float *v_cache, long layer_stride, long head_stride,
        const long *pos, const long *write, const long *start, const long *count, const long *keys, long max_keys,
        const float *mask, long mask_cols, const float *cos, const float *sin, long rope_rows,
        long dim, long H, long Hkv, long D, long I, float eps, const long *taps, long n_taps, float *tap_out,
        float *work, float *logits) {
    for (long r = 0; r < R; r++)  /* positions are the caller's data: refuse one outside the tables */
        if (pos[r] < 0 || pos[r] >= rope_rows) return 1 + r;
    const long G = H / Hkv, HD = H * D, qkv_n = padded((H + 2 * Hkv) * D), dim_n = padded(dim);
    const long mlp_n = padded(2 * I);
    /* row strides: an input to a product is packed at its width K, an output at its padded N */
    float *x = work, *h = x + R * dim, *y = h + R * dim, *qkv = y + R * dim_n, *att = qkv + R * qkv_n;
    float *mlp = att + R * HD, *act = mlp + R * mlp_n, *kept_area = act + R * I;
    float *scores = kept_area + R * (3 * max_keys + 2) + 2;  /* each thread's max_keys floats */
    const float scale = (float)(1.0 / __builtin_sqrt((double)D));
    /* With a mask (additive, row r's over its count[r] keys), each row keeps the keys not at -inf, with
     * their values as a bias, once for every layer: a row then sees the same keys in the same order as a
     * chain of its visible keys alone, and a tree's node gets its path's result bit for bit. */
    const float *bias = nullptr;
    if (mask != nullptr) {
        long *kept = (long *)(((unsigned long)kept_area + 7) & ~7UL), *kept_n = kept + R * max_keys;
        float *kept_bias = (float *)(kept_n + R);
        for (long r = 0; r < R; r++) {
            long m = 0;
            for (long t = 0; t < count[r]; t++)
                if (mask[r * mask_cols + t] != -__builtin_inff()) {
                    kept[r * max_keys + m] = keys[start[r] + t];
                    kept_bias[r * max_keys + m++] = mask[r * mask_cols + t];
                }
            kept_n[r] = m;
        }
        keys = kept, count = kept_n, bias = kept_bias;
    }
    for (long i = 0; i < R * dim; i++) x[i] = rows[i];
    for (long l = 0; l < n_layers; l++) {
        rms_norm(x, R, dim, attn_norm[l], eps, h);
        product(h, R, wqkv[l], qkv, dim, qkv_n);
        float *kl = k_cache + l * layer_stride, *vl = v_cache + l * layer_stride;
        for (long r = 0; r < R; r++) {  /* rotate queries and keys, then write keys and values */
            float *q = qkv + r * qkv_n;
            const float *c = cos + pos[r] * D, *s = sin + pos[r] * D;
            for (long j = 0; j < H + Hkv; j++) rotate(q + j * D, c, s, D);
            for (long g = 0; g < Hkv; g++)
                for (long i = 0; i < D; i++) {
                    kl[(write[r] + g * head_stride) * D + i] = q[(H + g) * D + i];
                    vl[(write[r] + g * head_stride) * D + i] = q[(H + Hkv + g) * D + i];
                }
        }
        /* query head j reads key/value head j / G; each (row, head) pair is one task */
        auto pairs = [&](long begin, long end, float *sc) {
            for (long p = begin; p < end; p++) {
                const long r = p / H, j = p % H, off = (j / G) * head_stride * D;
                const long first = bias != nullptr ? r * max_keys : start[r];
                attend_one(qkv + r * qkv_n + j * D, keys + first, count[r],
                           bias != nullptr ? bias + r * max_keys : nullptr, kl + off, vl + off, D, scale, sc,
                           att + r * HD + j * D);
            }
        };
#ifdef SPECDEC_LAB_SERIAL
        pairs(0, R * H, scores);
#else
        long all_keys = 0;
        for (long r = 0; r < R; r++) all_keys += count[r];
        const long grain = 1 + (1 << 16) / (1 + all_keys / R * D);  /* some 64k multiply-adds per task */
        if (R * H <= grain) pairs(0, R * H, scores);
        else at::parallel_for(0, R * H, grain, [&](int64_t begin, int64_t end) {
            pairs(begin, end, scores + at::get_thread_num() * max_keys);
        });
#endif
        product(att, R, wo[l], y, HD, dim_n);
        for (long r = 0; r < R; r++)
            for (long i = 0; i < dim; i++) x[r * dim + i] += y[r * dim_n + i];
        rms_norm(x, R, dim, mlp_norm[l], eps, h);
        product(h, R, w13[l], mlp, dim, mlp_n);
        for (long r = 0; r < R; r++) silu_mul(mlp + r * mlp_n, mlp + r * mlp_n + I, act + r * I, I);
        product(act, R, w2[l], y, I, dim_n);
        for (long r = 0; r < R; r++)
            for (long i = 0; i < dim; i++) x[r * dim + i] += y[r * dim_n + i];
        if (taps != nullptr && taps[l] >= 0)
            for (long r = 0; r < R; r++)
                for (long i = 0; i < dim; i++) tap_out[(r * n_taps + taps[l]) * dim + i] = x[r * dim + i];
    }
    rms_norm(x, R, dim, final_norm, eps, h);
    if (n_out > 0) product(h, R, head, logits, dim, n_out);
    return 0;
}

#define DECODE_ARGS2(W, WH) \
        const float *rows, long R, long n_layers, \
        const float *const *attn_norm, const W *const *wqkv, const W *const *wo, \
        const float *const *mlp_norm, const W *const *w13, const W *const *w2, \
        const float *final_norm, const WH *head, long n_out, \
        float *k_cache, float *v_cache, long layer_stride, long head_stride, \
        const long *pos, const long *write, const long *start, const long *count, const long *keys, long max_keys, \
        const float *mask, long mask_cols, const float *cos, const float *sin, long rope_rows, \
        long dim, long H, long Hkv, long D, long I, float eps, const long *taps, long n_taps, float *tap_out, \
        float *work, float *logits
#define DECODE_ARGS(W) DECODE_ARGS2(W, W)
#define DECODE_PASS rows, R, n_layers, attn_norm, wqkv, wo, mlp_norm, w13, w2, final_norm, head, n_out, \
        k_cache, v_cache, layer_stride, head_stride, pos, write, start, count, keys, max_keys, mask, mask_cols, \
        cos, sin, rope_rows, \
        dim, H, Hkv, D, I, eps, taps, n_taps, tap_out, work, logits

extern "C" long forward_rows(DECODE_ARGS(float)) { return forward<float>(DECODE_PASS); }

#ifdef __F16C__
/* forward_rows_half: the same forward over half-precision panels (same layout, 2 bytes a weight),
 * widened to float in registers (F16C) and multiplied in float32. A feature draft (drafters/feature.py)
 * is one layer of the target's width and a head over 8192 tokens, 36 MB in float32, which each
 * drafted token streams from memory again: in half precision it reads 18 MB. A drafted token took
 * 1.5-3.0 ms this way against 5.6-6.4 ms for the eager float32 forward (one thread, three rounds on
 * a day a target forward took 72-116 ms). Built only where the compiler targets F16C
 * (kernels.has_half()). */
extern "C" long forward_rows_half(DECODE_ARGS(unsigned short)) { return forward<unsigned short>(DECODE_PASS); }

/* A feature draft's input row in one call: out (P(dim)) = fc [norm(embedding), norm(state)],
 * fc (2 dim, dim) in half-precision panels; work holds 2 dim floats. */
extern "C" void feature_input_half(const float *embedding, const float *state, const float *embed_norm,
                                   const float *state_norm, float eps, const unsigned short *fc, long dim,
                                   float *work, float *out) {
    rms_norm(embedding, 1, dim, embed_norm, eps, work);
    rms_norm(state, 1, dim, state_norm, eps, work + dim);
    product(work, 1, fc, out, 2 * dim, padded(dim));
}
#endif

#ifdef __AVX2__
/* forward_rows_int8: the same forward over int8 panels with a float scale per output column (the
 * layout above): a quarter of float32's bytes. model.OneTokenDecoder(weights="int8") drives it;
 * cpu/self_draft.py runs the target itself this way as its own draft. Built only where the compiler
 * targets AVX2 (kernels.has_int8()). */
extern "C" long forward_rows_int8(DECODE_ARGS(signed char)) { return forward<signed char>(DECODE_PASS); }
#endif

#if defined(__AVX2__) && defined(__F16C__)
/* forward_rows_int4: the layers' products over 4-bit panels (5 bits a weight) and the head over int8
 * panels with a scale per group of 32 inputs (8.5 bits a weight). The default target's head is its
 * embedding, which came as Q8_0, not 4 bits: rounded to 4 bits, the head alone agreed with the
 * float32 argmax on 91% of the benchmark's greedy positions, against 99% for int8 with a scale per
 * column; with these two formats both the layers (Q4_1) and the head (Q8_0) come back exactly.
 * Drives self_draft.SelfDraft(target, weights="int4"). kernels.has_int4() says whether it was built
 * (a compiler targeting AVX2 and F16C). */
extern "C" long forward_rows_int4(DECODE_ARGS2(unsigned char, q8_group)) {
    return forward<unsigned char, q8_group>(DECODE_PASS);
}
#endif
