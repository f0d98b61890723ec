/*
 * cuda/cuda_cudnn_graph.cpp - cuDNN's fused attention (SDPA) graphs through cudnn-frontend: the
 * forward and backward graphs over ragged (THD) batches, their execution plans (built once per
 * CudnnSdpaDesc and kept), and their execution. The C interface and the layout are in cuda_cudnn.h.
 *
 * cuDNN is loaded at run time (cudnn-frontend's NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: every backend
 * call goes through dlsym on the handle this file opens), so the program links no cuDNN. The library
 * throws C++ exceptions where a symbol or library is missing and returns error_t elsewhere: both end
 * here as a message for the caller, never past the C interface.
 *
 * The graphs. Forward: O = softmax(scale Q K^T + mask) V, Stats = log-sum-exp of each row of the
 * scaled, masked scores (natural log), bf16 in and out, float32 softmax and accumulation. Backward:
 * dQ, dK, dV from Q, K, V, O, dO and Stats (cuDNN recomputes P = exp(scale Q K^T - Stats), and uses
 * Delta = rowsum(dO * O)), bf16 out. The padding mask (seq_q, seq_kv per sequence) bounds each
 * sequence; causal adds the band whose right edge is the diagonal aligned at the bottom right.
 */
#include "cuda/cuda_cudnn.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cudnn_frontend.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;

/* The handle cudnn-frontend's dynamic loading resolves every cuDNN symbol in (its shim declares it). */
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

/* The tensors of the graphs, by uid (the variant pack names them so). */
enum Uid : int64_t {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
    UID_SEQ_Q, UID_SEQ_KV, UID_OFF_Q, UID_OFF_KV, UID_OFF_O, UID_OFF_STATS, UID_OFF_DQ, UID_OFF_DKV,
};

/* A description's plan, or (graph null) why cuDNN has none: a refusal is kept too, so that a shape
 * cuDNN does not take costs one try, not one a call. */
struct Plan {
    CudnnSdpaDesc desc;
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;
    std::string refusal;
};

cudnnHandle_t handle = nullptr;
int load_state = 0; /* 0: not tried; 1: loaded; -1: failed (why in load_error) */
std::string load_error;
/* Never destroyed: at exit (a fatal error's exit() included) cuDNN's descriptors must not be freed by
 * static destructors after the CUDA runtime is gone; cuda_cudnn_unload empties it at backend close. */
std::vector<Plan> &plans = *new std::vector<Plan>;
double build_seconds; /* spent in cuda_cudnn_plan building (or failing to build) plans */

bool same_desc(const CudnnSdpaDesc &a, const CudnnSdpaDesc &b)
{
    return a.backward == b.backward && a.causal == b.causal && a.deterministic == b.deterministic &&
           a.n_heads == b.n_heads && a.n_kv_heads == b.n_kv_heads && a.head_dim == b.head_dim &&
           a.q_stride == b.q_stride && a.kv_stride == b.kv_stride && a.o_stride == b.o_stride && a.batch == b.batch &&
           a.max_q == b.max_q && a.max_kv == b.max_kv && a.rows_q == b.rows_q && a.rows_kv == b.rows_kv;
}

void say(char *why, size_t n, const std::string &what)
{
    if (why && n)
        snprintf(why, n, "%s", what.c_str());
}

using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

/* An int64 offset array or an int32 length array of the batch (device memory, one value a sequence). */
Tensor batch_vector(fe::graph::Graph &g, const char *name, Uid uid, int64_t n, fe::DataType_t type)
{
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(type));
}

/* A [batch, heads, seq, width] view of rows `row_stride` elements apart, head h at column h * width,
 * each sequence starting at its ragged offset. */
Tensor rows_tensor(fe::graph::Graph &g, const char *name, Uid uid, int64_t batch, int64_t heads, int64_t seq,
                   int64_t width, int64_t row_stride, const Tensor &offsets, fe::DataType_t type)
{
    auto t = g.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({batch, heads, seq, width})
                          .set_stride({seq * row_stride, width, row_stride, 1})
                          .set_data_type(type));
    t->set_ragged_offset(offsets);
    return t;
}

/* Sets an output's layout the same way. */
void output_rows(const Tensor &t, Uid uid, int64_t batch, int64_t heads, int64_t seq, int64_t width,
                 int64_t row_stride, const Tensor &offsets, fe::DataType_t type)
{
    t->set_output(true)
        .set_uid(uid)
        .set_dim({batch, heads, seq, width})
        .set_stride({seq * row_stride, width, row_stride, 1})
        .set_data_type(type)
        .set_ragged_offset(offsets);
}

/* The forward's implementation: cudnn-frontend's choice (its unified engine where the library
 * supports the graph, else the composite one), or the composite one - the second try of a forward
 * that the first choice could not build (the backward has only the composite one). */
enum Impl { IMPL_CHOSEN, IMPL_COMPOSITE };

/* The graph of d, not yet built; for the current device, or for SM sm_version (e.g. 90) when it is
 * above 0 (cudnn-frontend then checks the graph's support without asking a device). */
std::shared_ptr<fe::graph::Graph> make_graph(const CudnnSdpaDesc &d, int sm_version, Impl impl)
{
    const auto BF16 = fe::DataType_t::BFLOAT16, F32 = fe::DataType_t::FLOAT, I32 = fe::DataType_t::INT32,
               I64 = fe::DataType_t::INT64;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(BF16).set_intermediate_data_type(F32).set_compute_data_type(F32);
    if (sm_version > 0) /* before the nodes: each copies the graph's context */
        g->set_sm_version(sm_version);
    const int64_t B = d.batch, H = d.n_heads, Hkv = d.n_kv_heads, D = d.head_dim, Sq = d.max_q, Skv = d.max_kv;
    auto seq_q = batch_vector(*g, "seq_q", UID_SEQ_Q, B, I32), seq_kv = batch_vector(*g, "seq_kv", UID_SEQ_KV, B, I32);
    auto off_q = batch_vector(*g, "off_q", UID_OFF_Q, B + 1, I64);
    auto off_kv = batch_vector(*g, "off_kv", UID_OFF_KV, B + 1, I64);
    auto off_o = batch_vector(*g, "off_o", UID_OFF_O, B + 1, I64);
    auto off_stats = batch_vector(*g, "off_stats", UID_OFF_STATS, B + 1, I64);
    auto Q = rows_tensor(*g, "Q", UID_Q, B, H, Sq, D, d.q_stride, off_q, BF16);
    auto K = rows_tensor(*g, "K", UID_K, B, Hkv, Skv, D, d.kv_stride, off_kv, BF16);
    auto V = rows_tensor(*g, "V", UID_V, B, Hkv, Skv, D, d.kv_stride, off_kv, BF16);
    const float scale = 1.0f / sqrtf((float)D);
    if (!d.backward) {
        auto opt = fe::graph::SDPA_attributes()
                       .set_name("wlb_sdpa_fwd")
                       .set_generate_stats(true)
                       .set_attn_scale(scale)
                       .set_padding_mask(true)
                       .set_seq_len_q(seq_q)
                       .set_seq_len_kv(seq_kv);
        if (d.causal)
            opt.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT).set_diagonal_band_right_bound(0);
        if (impl == IMPL_COMPOSITE)
            opt.set_implementation(fe::AttentionImplementation_t::COMPOSITE);
        auto [O, Stats] = g->sdpa(Q, K, V, opt);
        output_rows(O, UID_O, B, H, Sq, D, d.o_stride, off_o, BF16);
        /* [batch, heads, seq, 1] with a row's heads adjacent: the engine's lse[row * heads + h] */
        output_rows(Stats, UID_STATS, B, H, Sq, 1, H, off_stats, F32);
        return g;
    }
    auto off_dq = batch_vector(*g, "off_dq", UID_OFF_DQ, B + 1, I64);
    auto off_dkv = batch_vector(*g, "off_dkv", UID_OFF_DKV, B + 1, I64);
    auto O = rows_tensor(*g, "O", UID_O, B, H, Sq, D, d.o_stride, off_o, BF16);
    auto dO = rows_tensor(*g, "dO", UID_DO, B, H, Sq, D, d.o_stride, off_o, BF16);
    auto Stats = rows_tensor(*g, "Stats", UID_STATS, B, H, Sq, 1, H, off_stats, F32);
    auto opt = fe::graph::SDPA_backward_attributes()
                   .set_name("wlb_sdpa_bwd")
                   .set_attn_scale(scale)
                   .set_padding_mask(true)
                   .set_seq_len_q(seq_q)
                   .set_seq_len_kv(seq_kv)
                   /* the fp32 dQ accumulator and Delta are sized by the rows the offsets reach, not by
                    * batch x max_q */
                   .set_max_total_seq_len_q(d.rows_q)
                   .set_max_total_seq_len_kv(d.rows_kv)
                   .set_deterministic_algorithm(d.deterministic != 0);
    if (d.causal)
        opt.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT).set_diagonal_band_right_bound(0);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opt);
    output_rows(dQ, UID_DQ, B, H, Sq, D, H * D, off_dq, BF16);
    output_rows(dK, UID_DK, B, Hkv, Skv, D, Hkv * D, off_dkv, BF16);
    output_rows(dV, UID_DV, B, Hkv, Skv, D, Hkv * D, off_dkv, BF16);
    return g;
}

#define FE_TRY(call, what)                                                                         \
    do {                                                                                           \
        fe::error_t e_ = (call);                                                                   \
        if (!e_.is_good()) {                                                                       \
            say(why, why_size, std::string(what) + ": " + e_.get_message());                      \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

int64_t build_plan(const CudnnSdpaDesc &d, Impl impl, int64_t *workspace_bytes, char *why, size_t why_size)
{
    auto g = make_graph(d, 0, impl);
    FE_TRY(g->validate(), "cudnn graph validate");
    FE_TRY(g->build_operation_graph(handle), "cudnn build_operation_graph");
    FE_TRY(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "cudnn create_execution_plans");
    FE_TRY(g->check_support(handle), "cudnn check_support");
    FE_TRY(g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "cudnn build_plans");
    int64_t ws = 0;
    FE_TRY(g->get_workspace_size(ws), "cudnn get_workspace_size");
    plans.push_back(Plan{d, g, ws, std::string()});
    *workspace_bytes = ws;
    return (int64_t)plans.size() - 1;
}

/* Runs attempt(impl) on each implementation d may take - the one cudnn-frontend chooses, then for a
 * forward the composite one - until one succeeds (returns ""): "", or every attempt's reason joined. */
template <class Attempt> std::string each_impl(const CudnnSdpaDesc &d, Attempt attempt)
{
    std::string refusal;
    for (int impl = IMPL_CHOSEN; impl <= (d.backward ? IMPL_CHOSEN : IMPL_COMPOSITE); impl++) {
        std::string why;
        try {
            why = attempt((Impl)impl);
        } catch (const std::exception &e) {
            why = std::string("cudnn graph: ") + e.what();
        }
        if (why.empty())
            return why;
        refusal += (refusal.empty() ? "" : "; as the composite implementation: ") + why;
    }
    return refusal;
}

/* Opens libcudnn.so.9 (once) and checks its version: the version, or 0 with the reason in *error. */
size_t open_library(std::string *error)
{
    static size_t version;
    static std::string library_error;
    if (!fe::cudnn_dlhandle && library_error.empty()) {
        /* cudnn-frontend opens the CUDA runtime itself by name: the one this program links, not another
         * major version a library path may also hold. */
        char cudart[32];
        snprintf(cudart, sizeof cudart, "libcudart.so.%d", CUDART_VERSION / 1000);
        setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart, 0);
        dlerror();
        void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            const char *e = dlerror();
            library_error = std::string("libcudnn.so.9 not found (") + (e ? e : "dlopen failed") + ")";
        } else {
            fe::cudnn_dlhandle = h;
            try {
                version = fe::detail::get_backend_version();
                if (version < 90600)
                    library_error = "cuDNN " + std::to_string(version) +
                                    " is older than 9.6 (ragged statistics, bounded backward workspace)";
                else if (version >= CUDNN_ORDERED_DQ_VERSION) { /* see CUDNN_ORDERED_DQ_VERSION */
                    char limit[32];
                    snprintf(limit, sizeof limit, "%lld", (long long)OPS_CUDNN_DP_WORKSPACE_MAX);
                    setenv("CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT", limit, 0);
                }
            } catch (const std::exception &e) {
                library_error = e.what();
            }
        }
    }
    *error = library_error;
    return library_error.empty() ? version : 0;
}

} // namespace

extern "C" int cuda_cudnn_library(char *why, size_t why_size)
{
    std::string error;
    size_t v = open_library(&error);
    if (!v)
        say(why, why_size, error);
    return (int)v;
}

extern "C" int cuda_cudnn_load(char *why, size_t why_size)
{
    if (load_state == 0) {
        load_state = -1;
        if (open_library(&load_error)) {
            try {
                cudnnStatus_t s = fe::detail::create_handle(&handle);
                if (s != CUDNN_STATUS_SUCCESS)
                    load_error = std::string("cudnnCreate: ") + fe::detail::get_error_string(s);
                else if ((s = fe::detail::set_stream(handle, (cudaStream_t)0)) != CUDNN_STATUS_SUCCESS)
                    load_error = std::string("cudnnSetStream: ") + fe::detail::get_error_string(s);
                else
                    load_state = 1;
            } catch (const std::exception &e) {
                load_error = e.what();
            }
        }
    }
    if (load_state < 0)
        say(why, why_size, load_error);
    return load_state > 0;
}

extern "C" int cuda_cudnn_version(void)
{
    if (load_state <= 0)
        return 0;
    try {
        return (int)fe::detail::get_backend_version();
    } catch (const std::exception &) {
        return 0;
    }
}

extern "C" int64_t cuda_cudnn_plan(const CudnnSdpaDesc *d, int64_t *workspace_bytes, char *why, size_t why_size)
{
    if (load_state <= 0) {
        say(why, why_size, load_state < 0 ? load_error : "cuDNN is not loaded");
        return -1;
    }
    for (size_t i = 0; i < plans.size(); i++)
        if (same_desc(plans[i].desc, *d)) {
            if (!plans[i].graph) {
                say(why, why_size, plans[i].refusal);
                return -1;
            }
            *workspace_bytes = plans[i].workspace;
            return (int64_t)i;
        }
    const auto t0 = std::chrono::steady_clock::now();
    int64_t i = -1;
    const std::string refusal = each_impl(*d, [&](Impl impl) {
        char msg[512] = "cudnn plan: failed";
        i = build_plan(*d, impl, workspace_bytes, msg, sizeof msg);
        return i >= 0 ? std::string() : std::string(msg);
    });
    build_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 0)
        return i;
    plans.push_back(Plan{*d, nullptr, 0, refusal});
    say(why, why_size, refusal);
    return -1;
}

extern "C" int cuda_cudnn_execute(int64_t plan, const CudnnSdpaArgs *a, void *workspace, char *why, size_t why_size)
{
    if (plan < 0 || plan >= (int64_t)plans.size()) {
        say(why, why_size, "no such cudnn plan");
        return -1;
    }
    const Plan &p = plans[(size_t)plan];
    if (!p.graph) {
        say(why, why_size, p.refusal);
        return -1;
    }
    /* the variant pack: device pointers by uid */
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, (void *)a->q},           {UID_K, (void *)a->k},           {UID_V, (void *)a->v},
        {UID_STATS, (void *)a->stats},   {UID_SEQ_Q, (void *)a->seq_q},   {UID_SEQ_KV, (void *)a->seq_kv},
        {UID_OFF_Q, (void *)a->off_q},   {UID_OFF_KV, (void *)a->off_kv}, {UID_OFF_O, (void *)a->off_o},
        {UID_OFF_STATS, (void *)a->off_stats}, {UID_O, (void *)a->o},
    };
    if (p.desc.backward) {
        pack[UID_DO] = (void *)a->dout;
        pack[UID_DQ] = a->dq;
        pack[UID_DK] = a->dk;
        pack[UID_DV] = a->dv;
        pack[UID_OFF_DQ] = (void *)a->off_dq;
        pack[UID_OFF_DKV] = (void *)a->off_dkv;
    }
    try {
        FE_TRY(p.graph->execute(handle, pack, workspace), "cudnn execute");
    } catch (const std::exception &e) {
        say(why, why_size, std::string("cudnn execute: ") + e.what());
        return -1;
    }
    return 0;
}

extern "C" int cuda_cudnn_check(const CudnnSdpaDesc *d, int sm_version, char *why, size_t why_size)
{
    std::string error;
    if (!open_library(&error)) {
        say(why, why_size, error);
        return 0;
    }
    const std::string refusal = each_impl(*d, [&](Impl impl) {
        fe::error_t e = make_graph(*d, sm_version, impl)->validate();
        return e.is_good() ? std::string() : "cudnn graph validate: " + e.get_message();
    });
    if (refusal.empty())
        return 1;
    say(why, why_size, refusal);
    return 0;
}

extern "C" void cuda_cudnn_plan_stats(int64_t *built, int64_t *refused, double *seconds)
{
    *built = *refused = 0;
    for (const Plan &p : plans)
        ++*(p.graph ? built : refused);
    *seconds = build_seconds;
}

extern "C" void cuda_cudnn_unload(void)
{
    plans.clear();
    build_seconds = 0;
    if (handle) {
        try {
            fe::detail::destroy_handle(handle);
        } catch (const std::exception &) {
        }
        handle = nullptr;
    }
    if (load_state > 0)
        load_state = 0; /* a later load makes a new handle; the library stays open */
}
