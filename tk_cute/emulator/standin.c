/* SPDX-License-Identifier: MIT
 *
 * A CPU stand-in for the CUDA runtime entry points that the CuTe DSL's exported host code calls
 * (tk_cute/emulator/launch.py links it with the object of `export_to_c` / `dump_to_object`).
 * Nothing here touches a GPU: a library is the address of the image the host passes, a kernel is
 * a record holding its name, and a launch is recorded (dims, shared memory, launch attributes and
 * a copy of every kernel parameter's bytes) instead of run.
 *
 * Contract with launch.py (ctypes):
 *  - standin_reset() clears every record; launch.py calls it before each run.
 *  - standin_declare_kernel(name, n, sizes) gives a kernel's parameter sizes in bytes (read from
 *    the PTX `.entry` signature): a launch copies exactly these bytes from args[i].
 *  - standin_set_device_attr / standin_set_kernel_attr give the values that
 *    cudaDeviceGetAttribute / cuKernelGetAttribute answer; an id without a value is logged in
 *    the query log and answered with an error (1: invalid value), never a crash.
 *  - The records are read through the standin_* accessors below, whose structs launch.py
 *    mirrors. Fixed capacities: past one, the call fails with error 2 (out of memory) and
 *    standin_error() says which capacity.
 *
 * The entry points are hidden: the program library that links this file binds them to itself
 * even where the real runtime (libcute_dsl_runtime.so) is loaded into the process globally.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORT __attribute__((visibility("default")))

enum { MAX_KERNELS = 64, MAX_LAUNCHES = 64, MAX_PARAMS = 512, MAX_ATTRS = 32, MAX_LOG = 512,
       MAX_NAME = 1024, MAX_ATTR_VALUES = 256, ARENA_BYTES = 1 << 21 };

enum { OK = 0, ERR_INVALID_VALUE = 1, ERR_CAPACITY = 2, ERR_UNKNOWN_KERNEL = 98,
       ERR_INVALID_HANDLE = 400 };

/* cudaLaunchAttribute: {id, pad to 8, union value (64 bytes)}: 72 bytes (the DSL's LLVM struct
 * (i32, [4 x i8], [64 x i8])). */
typedef struct {
    uint32_t id;
    uint8_t pad[4];
    uint8_t val[64];
} launch_attr_t;

/* cudaLaunchConfig_t: the DSL's ([3 x i32], [3 x i32], i64, ptr, ptr, i32). */
typedef struct {
    uint32_t grid[3];
    uint32_t block[3];
    uint64_t smem;
    void *stream;
    launch_attr_t *attrs;
    uint32_t num_attrs;
} launch_config_t;

typedef struct {
    char name[MAX_NAME];
    int32_t declared; /* parameter sizes known (standin_declare_kernel) */
    int32_t nparams;
    uint32_t sizes[MAX_PARAMS];
} kernel_decl_t;

typedef struct {
    uint32_t magic; /* 0x4B524E4C: a handle this stand-in made */
    int32_t index;  /* into kernels[] */
} kernel_handle_t;

typedef struct {
    int32_t kernel; /* index into kernels[] */
    int32_t via_ex; /* 1: cudaLaunchKernelEx, 0: cudaLaunchKernel */
    uint32_t grid[3];
    uint32_t block[3];
    uint64_t smem;
    uint64_t stream;
    uint32_t num_attrs; /* as the host passed it (up to MAX_ATTRS kept) */
    uint32_t nparams;
    uint64_t param_offset; /* into the arena */
    uint64_t param_bytes;
    launch_attr_t attrs[MAX_ATTRS];
} launch_rec_t;

/* One call that set or asked an attribute: kind 1 cudaFuncSetAttribute, 2
 * cudaKernelSetAttributeForDevice, 3 cudaDeviceGetAttribute, 4 cuKernelGetAttribute, 5
 * cudaOccupancyMaxActiveBlocksPerMultiprocessor (attr = block size, value = its smem bytes). */
typedef struct {
    int32_t kind;
    int32_t kernel; /* -1: none */
    int32_t attr;
    int32_t value;
    int32_t device;
    int32_t answered; /* 1: the stand-in had a value (queries) */
} attr_log_t;

typedef struct {
    int32_t id;
    int32_t value;
} attr_value_t;

static kernel_decl_t kernels[MAX_KERNELS];
static kernel_handle_t handles[MAX_KERNELS];
static int32_t nkernels;
static launch_rec_t launches[MAX_LAUNCHES];
static int32_t nlaunches;
static attr_log_t attr_log[MAX_LOG];
static int32_t nlog;
static attr_value_t device_attrs[MAX_ATTR_VALUES], kernel_attrs[MAX_ATTR_VALUES];
static int32_t ndevice_attrs, nkernel_attrs;
static uint8_t arena[ARENA_BYTES];
static uint64_t arena_used;
static const void *library_image;
static int32_t libraries_loaded;
static uint8_t library_token; /* what a library handle points to */
static char error[512];

/* ---- control and records (launch.py) ---------------------------------------------------- */

EXPORT void standin_reset(void) {
    memset(kernels, 0, sizeof kernels);
    memset(handles, 0, sizeof handles);
    nkernels = nlaunches = nlog = ndevice_attrs = nkernel_attrs = 0;
    arena_used = 0;
    library_image = NULL;
    libraries_loaded = 0;
    error[0] = 0;
}

static int find_kernel(const char *name) {
    for (int i = 0; i < nkernels; i++)
        if (strncmp(kernels[i].name, name, MAX_NAME) == 0) return i;
    return -1;
}

static int add_kernel(const char *name) {
    int i = find_kernel(name);
    if (i >= 0) return i;
    if (nkernels == MAX_KERNELS || strlen(name) >= MAX_NAME) {
        snprintf(error, sizeof error, "stand-in: kernel table full (%d) or name too long",
                 MAX_KERNELS);
        return -1;
    }
    i = nkernels++;
    strncpy(kernels[i].name, name, MAX_NAME - 1);
    handles[i].magic = 0x4B524E4C;
    handles[i].index = i;
    return i;
}

EXPORT int standin_declare_kernel(const char *name, int32_t n, const uint32_t *sizes) {
    int i = add_kernel(name);
    if (i < 0) return ERR_CAPACITY;
    if (n < 0 || n > MAX_PARAMS) {
        snprintf(error, sizeof error, "stand-in: %d parameters (at most %d)", n, MAX_PARAMS);
        return ERR_CAPACITY;
    }
    kernels[i].declared = 1;
    kernels[i].nparams = n;
    memcpy(kernels[i].sizes, sizes, (size_t)n * sizeof *sizes);
    return OK;
}

static int set_value(attr_value_t *table, int32_t *n, int32_t id, int32_t value) {
    for (int i = 0; i < *n; i++)
        if (table[i].id == id) { table[i].value = value; return OK; }
    if (*n == MAX_ATTR_VALUES) return ERR_CAPACITY;
    table[*n].id = id;
    table[(*n)++].value = value;
    return OK;
}

static int get_value(const attr_value_t *table, int32_t n, int32_t id, int32_t *value) {
    for (int i = 0; i < n; i++)
        if (table[i].id == id) { *value = table[i].value; return 1; }
    return 0;
}

EXPORT int standin_set_device_attr(int32_t id, int32_t value) {
    return set_value(device_attrs, &ndevice_attrs, id, value);
}

EXPORT int standin_set_kernel_attr(int32_t id, int32_t value) {
    return set_value(kernel_attrs, &nkernel_attrs, id, value);
}

EXPORT int32_t standin_kernel_count(void) { return nkernels; }
EXPORT const char *standin_kernel_name(int32_t i) {
    return (i >= 0 && i < nkernels) ? kernels[i].name : NULL;
}
EXPORT int32_t standin_launch_count(void) { return nlaunches; }
EXPORT const launch_rec_t *standin_launch(int32_t i) {
    return (i >= 0 && i < nlaunches) ? &launches[i] : NULL;
}
EXPORT const uint8_t *standin_arena(void) { return arena; }
EXPORT int32_t standin_log_count(void) { return nlog; }
EXPORT const attr_log_t *standin_log(int32_t i) { return (i >= 0 && i < nlog) ? &attr_log[i] : NULL; }
EXPORT const void *standin_library_image(void) { return library_image; }
EXPORT int32_t standin_libraries_loaded(void) { return libraries_loaded; }
EXPORT const char *standin_error(void) { return error; }
EXPORT uint32_t standin_sizeof_launch(void) { return sizeof(launch_rec_t); }
EXPORT uint32_t standin_sizeof_log(void) { return sizeof(attr_log_t); }
EXPORT uint32_t standin_max_attrs(void) { return MAX_ATTRS; }

static void log_attr(int32_t kind, int32_t kernel, int32_t attr, int32_t value, int32_t device,
                     int32_t answered) {
    if (nlog == MAX_LOG) return; /* the log is diagnostics: past its capacity, calls still work */
    attr_log_t *e = &attr_log[nlog++];
    e->kind = kind;
    e->kernel = kernel;
    e->attr = attr;
    e->value = value;
    e->device = device;
    e->answered = answered;
}

static int kernel_index(const void *handle) {
    const kernel_handle_t *h = (const kernel_handle_t *)handle;
    for (int i = 0; i < nkernels; i++)
        if (h == &handles[i]) return i;
    return -1;
}

/* Call a packed host entry point (void f(void **slots)) on a zeroed stack: the host code
 * builds the kernel parameters in stack slots and writes only part of some (the first 64 of a
 * tensor map's 128 bytes, a struct's padding), so without this the rest would be whatever the
 * stack held and two captures of one launch would differ. */
enum { STACK_SCRUB = 128 * 1024 };

static __attribute__((noinline)) void scrub_stack(void) {
    volatile uint8_t buf[STACK_SCRUB];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = 0;
}

EXPORT void standin_call(void (*fn)(void **), void **slots) {
    scrub_stack();
    fn(slots);
}

/* ---- the runtime entry points the exported host code imports ------------------------------ */

HIDDEN int _cudaLibraryLoadData(void **library, const void *code, void *jit_options,
                                void *jit_values, uint32_t n_jit, void *lib_options,
                                void *lib_values, uint32_t n_lib) {
    (void)jit_options; (void)jit_values; (void)n_jit;
    (void)lib_options; (void)lib_values; (void)n_lib;
    if (library == NULL) return ERR_INVALID_VALUE;
    library_image = code;
    libraries_loaded++;
    *library = &library_token;
    return OK;
}

HIDDEN int _cudaLibraryGetKernel(void **kernel, void *library, const char *name) {
    if (kernel == NULL || name == NULL) return ERR_INVALID_VALUE;
    if (library != &library_token) {
        snprintf(error, sizeof error, "stand-in: cudaLibraryGetKernel(%s) on an unknown library",
                 name);
        return ERR_INVALID_HANDLE;
    }
    int i = add_kernel(name);
    if (i < 0) return ERR_CAPACITY;
    *kernel = &handles[i];
    return OK;
}

HIDDEN int _cudaFuncSetAttribute(void *func, int32_t attr, int32_t value) {
    log_attr(1, kernel_index(func), attr, value, -1, 1);
    return OK;
}

HIDDEN int _cudaKernelSetAttributeForDevice(void *kernel, int32_t attr, int32_t value,
                                            int32_t device) {
    log_attr(2, kernel_index(kernel), attr, value, device, 1);
    return OK;
}

HIDDEN int _cudaGetDevice(int32_t *device) {
    if (device == NULL) return ERR_INVALID_VALUE;
    *device = 0;
    return OK;
}

HIDDEN int _cudaDeviceGetAttribute(int32_t *value, int32_t attr, int32_t device) {
    if (value == NULL) return ERR_INVALID_VALUE;
    int32_t v = 0;
    int known = get_value(device_attrs, ndevice_attrs, attr, &v);
    *value = v;
    log_attr(3, -1, attr, v, device, known);
    if (!known) {
        snprintf(error, sizeof error, "stand-in: no value for device attribute %d", attr);
        return ERR_INVALID_VALUE;
    }
    return OK;
}

HIDDEN int _cuKernelGetAttribute(int32_t *value, int32_t attr, void *kernel, int32_t device) {
    if (value == NULL) return ERR_INVALID_VALUE;
    int32_t v = 0;
    int known = get_value(kernel_attrs, nkernel_attrs, attr, &v);
    *value = v;
    log_attr(4, kernel_index(kernel), attr, v, device, known);
    if (!known) {
        snprintf(error, sizeof error, "stand-in: no value for kernel attribute %d", attr);
        return ERR_INVALID_VALUE;
    }
    return OK;
}

HIDDEN int _cudaOccupancyMaxActiveBlocksPerMultiprocessor(int32_t *blocks, void *func,
                                                          int32_t block_size, uint64_t smem) {
    if (blocks == NULL) return ERR_INVALID_VALUE;
    *blocks = 1;
    log_attr(5, kernel_index(func), block_size, (int32_t)smem, -1, 1);
    return OK;
}

static int record_launch(void *kernel, const uint32_t grid[3], const uint32_t block[3],
                         uint64_t smem, void *stream, const launch_attr_t *attrs,
                         uint32_t num_attrs, void **args, int via_ex) {
    int k = kernel_index(kernel);
    if (k < 0) {
        snprintf(error, sizeof error, "stand-in: launch of a kernel handle it did not make");
        return ERR_INVALID_HANDLE;
    }
    if (!kernels[k].declared) {
        snprintf(error, sizeof error, "stand-in: launch of %s, whose parameters were not "
                 "declared (no .entry of that name in the PTX)", kernels[k].name);
        return ERR_UNKNOWN_KERNEL;
    }
    if (nlaunches == MAX_LAUNCHES) {
        snprintf(error, sizeof error, "stand-in: more than %d launches", MAX_LAUNCHES);
        return ERR_CAPACITY;
    }
    uint64_t total = 0;
    for (int i = 0; i < kernels[k].nparams; i++) total += kernels[k].sizes[i];
    if (arena_used + total > ARENA_BYTES) {
        snprintf(error, sizeof error, "stand-in: parameter arena (%d bytes) full", ARENA_BYTES);
        return ERR_CAPACITY;
    }
    if (kernels[k].nparams && args == NULL) {
        snprintf(error, sizeof error, "stand-in: launch of %s without its parameters",
                 kernels[k].name);
        return ERR_INVALID_VALUE;
    }
    launch_rec_t *r = &launches[nlaunches++];
    memset(r, 0, sizeof *r);
    r->kernel = k;
    r->via_ex = via_ex;
    memcpy(r->grid, grid, sizeof r->grid);
    memcpy(r->block, block, sizeof r->block);
    r->smem = smem;
    r->stream = (uint64_t)(uintptr_t)stream;
    r->num_attrs = num_attrs;
    if (attrs != NULL)
        memcpy(r->attrs, attrs, (num_attrs < MAX_ATTRS ? num_attrs : MAX_ATTRS) * sizeof *attrs);
    r->nparams = (uint32_t)kernels[k].nparams;
    r->param_offset = arena_used;
    for (int i = 0; i < kernels[k].nparams; i++) {
        memcpy(arena + arena_used, args[i], kernels[k].sizes[i]);
        arena_used += kernels[k].sizes[i];
    }
    r->param_bytes = total;
    return OK;
}

HIDDEN int _cudaLaunchKernelEx(const launch_config_t *config, void *kernel, void **args) {
    if (config == NULL) return ERR_INVALID_VALUE;
    return record_launch(kernel, config->grid, config->block, config->smem, config->stream,
                         config->attrs, config->num_attrs, args, 1);
}

HIDDEN int _cudaLaunchKernel(void *kernel, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t bx,
                             uint32_t by, uint32_t bz, void **args, uint64_t smem, void *stream) {
    const uint32_t grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return record_launch(kernel, grid, block, smem, stream, NULL, 0, args, 0);
}
